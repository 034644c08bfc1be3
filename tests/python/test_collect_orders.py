"""bench/gpu/collect_orders.py on made-up orders rows (not measurements) and on the evaluation fixture's ncu logs."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = pathlib.Path(__file__).resolve().parent / "evaluation_fixture"
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

pytest.importorskip("matplotlib")  # collect_evaluation, whose ncu reader collect_orders uses, draws with it
import collect_orders  # noqa: E402


def row(impl: str, order: str, ms: float, plan_ms: float, kind: str = "kernel", frames: int = 9) -> dict:
    return {"bench": "evaluation", "impl": impl, "kind": kind, "method": "xattention", "frames": frames,
            "tokens": 10800, "density": 0.3, "order": order, "ms": ms, "tflops": 100.0 / ms, "plan_ms": plan_ms}


def write(tmp_path: pathlib.Path, rows: list[dict]) -> pathlib.Path:
    path = tmp_path / "orders.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"env": {"device": "fixture", "fa4": True}}, *rows]))
    return path


def test_speedups_are_against_s1s2_of_the_same_backend_with_and_without_each_plan(tmp_path):
    log = write(tmp_path, [row("wavealign", "original", 12.0, 0.0), row("wavealign", "wavealign", 10.0, 1.0),
                           row("wavealign", "span", 9.5, 0.5), row("wavealign", "s2", 8.0, 0.0, kind="ceiling"),
                           row("flashattention4", "wavealign", 5.0, 1.0), row("flashattention4", "s2", 4.0, 0.5),
                           row("wavealign", "s2", 7.0, 0.0, frames=5)])  # no S1 + S2 at 5 frames: left out
    derived = {(r["backend"], r["order"]): r for r in collect_orders.derive(collect_orders.read(log)[0])}
    assert set(derived) == {("wavealign", "original"), ("wavealign", "wavealign"), ("wavealign", "span"),
                            ("wavealign", "packed rows"), ("flashattention4", "wavealign"), ("flashattention4", "s2")}
    assert derived[("wavealign", "span")]["kernel_vs_s1s2"] == pytest.approx(10.0 / 9.5)
    assert derived[("wavealign", "span")]["with_plan_vs_s1s2"] == pytest.approx(11.0 / 10.0)
    assert derived[("wavealign", "original")]["with_plan_vs_s1s2"] == pytest.approx(11.0 / 12.0)
    assert derived[("wavealign", "packed rows")]["kernel_vs_s1s2"] == pytest.approx(10.0 / 8.0)
    assert derived[("wavealign", "packed rows")]["with_plan_vs_s1s2"] is None  # a bound has no plan to charge
    assert derived[("flashattention4", "s2")]["with_plan_vs_s1s2"] == pytest.approx(6.0 / 4.5)


def test_a_later_row_of_the_same_case_replaces_the_earlier(tmp_path):
    log = write(tmp_path, [row("wavealign", "wavealign", 10.0, 1.0), row("wavealign", "wavealign", 20.0, 1.0)])
    rows, env = collect_orders.read(log)
    assert [r["ms"] for r in rows] == [20.0] and env["device"] == "fixture"


def test_ncu_figures_join_their_case_and_the_results_file_holds_this_run_alone(tmp_path):
    log = write(tmp_path, [row("wavealign", "original", 12.0, 0.0), row("wavealign", "wavealign", 10.0, 1.0)])
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"device": "old", "commit": "older", "date": "2000-01-01", "command": "old",
                               "rows": [], "stale": True}))
    assert collect_orders.main([str(log), "--commit", "c1", "--date", "2026-12-04", "--ncu", str(FIXTURE),
                                "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [record[key] for key in ("device", "commit", "date")] == ["fixture", "c1", "2026-12-04"]
    assert "stale" not in record and "runs" not in record
    profiled = {r["order"]: r for r in record["derived"]}
    ncu = collect_orders.read_ncu(FIXTURE)[("wavealign", "xattention", 9, "wavealign")]
    assert profiled["wavealign"]["l2_hit_pct"] == ncu["l2_hit_pct"] is not None
    assert 0 < profiled["original"]["hbm_sol_pct"] <= 100
    assert "L2 hit / HBM SOL / HBM read" in collect_orders.markdown(record["derived"])


def test_no_reference_row_is_an_error(tmp_path, capsys):
    log = write(tmp_path, [row("wavealign", "original", 12.0, 0.0)])
    assert collect_orders.main([str(log), "--commit", "c"]) == 1
    assert "no order rows with an S1 + S2 reference" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path):
    log = write(tmp_path, [row("wavealign", "original", 12.0, 0.0), row("wavealign", "wavealign", 10.0, 1.0),
                           row("wavealign", "s2", 8.0, 0.0, kind="ceiling")])
    png = tmp_path / "orders.png"
    assert collect_orders.main([str(log), "--commit", "c", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
