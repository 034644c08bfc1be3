"""bench/gpu/collect_evaluation.py on the FIXTURE log folder tests/python/evaluation_fixture (made-up numbers in
run_evaluation.sh's format, not measurements), its --simulated mode on a tiny CPU run, and the GPU driver
bench_evaluation.py without a GPU."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = pathlib.Path(__file__).resolve().parent / "evaluation_fixture"
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

import collect_evaluation  # noqa: E402

pytest.importorskip("matplotlib")


def collect(tmp_path: pathlib.Path, logs: pathlib.Path = FIXTURE, doc: pathlib.Path | None = None,
            extra: tuple[str, ...] = ()) -> tuple[int, dict]:
    if doc is None:
        doc = tmp_path / "evaluation.md"
        shutil.copy(ROOT / "docs" / "evaluation.md", doc)
    out = tmp_path / "record.json"
    status = collect_evaluation.main([str(logs), "--out", str(out), "--figures", str(tmp_path / "figures"),
                                      "--doc", str(doc), "--date", "2000-01-02", *extra])
    return status, json.loads(out.read_text()) if status == 0 else {}


def rows(record: dict, figure: str, **match: object) -> list[dict]:
    return [row for row in record["derived"][figure] if all(row.get(k) == v for k, v in match.items())]


def test_record_has_provenance_and_the_fixture_label(tmp_path):
    status, record = collect(tmp_path)
    assert status == 0
    assert record["device"] == "FIXTURE (not a GPU)"
    assert record["commit"] == "fixture0" and record["date"] == "2000-01-01" and record["collected"] == "2000-01-02"
    assert record["command"].startswith("bench/gpu/run_evaluation.sh FIXTURE timing; ")
    assert record["mode"] == "measured"
    assert any("made-up failure" in note for note in record["notes"])
    assert any("step fa4 exited 124" in note for note in record["notes"])


def test_fig2_and_fig10_arithmetic(tmp_path):
    _, record = collect(tmp_path)
    fig2 = rows(record, "fig2", method="xattention", frames=9)[0]
    assert fig2["upper_bound"] == pytest.approx(1 / 0.3)
    assert fig2["actual"] == pytest.approx(20.0 / 8.0)  # dense 20 ms over the original order's 8 ms
    assert fig2["gap"] == pytest.approx((1 / 0.3) / 2.5)
    ours = rows(record, "fig10", impl="wavealign", method="xattention", frames=9)[0]
    assert (ours["original_ms"], ours["kernel_ms"], ours["overhead_ms"]) == pytest.approx((8.0, 6.4, 0.4))
    assert ours["speedup"] == pytest.approx(8.0 / 6.8)
    assert ours["overhead_share"] == pytest.approx(0.4 / 6.8)
    # FA4: the plan plus the plug-in path's permutations (plug-in 8.9 ms - FA4 on permuted inputs 8.5 ms).
    fa4 = rows(record, "fig10", impl="flashattention4", method="xattention", frames=9)[0]
    assert fa4["overhead_ms"] == pytest.approx(0.4 + 0.4)
    assert fa4["speedup"] == pytest.approx(10.0 / 9.3)
    assert not rows(record, "fig10", impl="flashattention4", method="sparge")  # its FA4 run failed
    simulated = rows(record, "fig10", impl="simulated", method="sparge", frames=5)[0]
    assert simulated["speedup"] == pytest.approx(6.3 / (5.1 + 0.05))


def test_ncu_launches_map_to_their_cases(tmp_path):
    _, record = collect(tmp_path)
    table1 = {row["method"]: row for row in record["derived"]["table1"]}
    assert table1["dense"]["l2_hit"] == pytest.approx(0.45) and table1["dense"]["hbm_sol"] == pytest.approx(0.50)
    assert table1["random"]["density"] == pytest.approx(0.2) and table1["random"]["l2_hit_simulated"] == 0.12
    assert table1["xattention"]["l2_hit"] == pytest.approx(0.30)
    orders = {(row["impl"], row["method"], row["order"]): row for row in record["derived"]["orders"]}
    assert orders[("wavealign", "sparge", "s2")]["hbm_read_vs_original"] == pytest.approx(0.3)  # 300 MB / 1 GB
    assert orders[("wavealign", "sparge", "wavealign")]["l2_hit"] == pytest.approx(0.80)
    assert orders[("flashattention4", "xattention", "wavealign")]["ncu_ms"] == pytest.approx(8.5)  # 8,500 us
    ncu = {(row["impl"], row["method"], row["order"]): row for row in record["ncu"]}
    assert ncu[("wavealign", "xattention", "original")]["sm__cycles_elapsed.avg.per_second"] == pytest.approx(1755)
    roof = rows(record, "fig15", impl="wavealign", method="xattention", order="original")[0]
    flops = 4 * 128 * 128 * 128 * roof["nnz_blocks"]
    assert roof["tflops"] == pytest.approx(flops / 8.0 / 1e9)
    assert roof["intensity"] == pytest.approx(flops / (1e9 + 100e6))


def test_ncu_count_mismatch_drops_that_backend(tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(FIXTURE, logs)
    cases = (logs / "ncu-cases.jsonl").read_text().splitlines(keepends=True)
    (logs / "ncu-cases.jsonl").write_text("".join(cases[:-1]))  # the last case is one of our kernel's
    _, record = collect(tmp_path, logs)
    assert any("8 profiled wavealign launches for 7 cases" in note for note in record["notes"])
    assert not [row for row in record["ncu"] if row["impl"] == "wavealign"]
    assert [row for row in record["ncu"] if row["impl"] == "flashattention4"]


def test_figures_are_pngs(tmp_path):
    _, record = collect(tmp_path)
    assert sorted(record["figure_files"]) == sorted(collect_evaluation.FIGURES)
    for path in record["figure_files"].values():
        assert pathlib.Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_document_blocks_are_filled_and_the_prose_kept(tmp_path):
    doc = tmp_path / "evaluation.md"
    text = (ROOT / "docs" / "evaluation.md").read_text()
    doc.write_text(text.replace("## Budget\n", "## Budget\n\nA sentence written by hand.\n"))
    collect(tmp_path, doc=doc)
    first = doc.read_text()
    assert "A sentence written by hand." in first
    fig10 = first.split("<!-- generated: fig10 -->")[1].split("<!-- end generated: fig10 -->")[0]
    assert "At 10,800 tokens (9 frames).\n\n" in fig10  # the times at the longest length only
    assert "| our kernel | XAttention | 8.00 | 6.40 | 0.40 | 1.176× |" in fig10
    assert "7,200" not in fig10  # the 5-frame rows stay in the record
    assert "![fig10](figures/evaluation-fig10.png)" in first
    assert "NOT equal: flashattention4 plugin wavealign vs original (xattention, 5 frames" in first
    collect(tmp_path, doc=doc)
    assert doc.read_text() == first  # a second run replaces the blocks, nothing else


def test_a_missing_block_is_an_error(tmp_path, capsys):
    doc = tmp_path / "evaluation.md"
    doc.write_text((ROOT / "docs" / "evaluation.md").read_text().replace("<!-- generated: fig12 -->", ""))
    status, _ = collect(tmp_path, doc=doc)
    assert status == 1
    assert "has no block <!-- generated: fig12 -->" in capsys.readouterr().err


def test_a_broken_log_line_names_its_place(tmp_path, capsys):
    logs = tmp_path / "logs"
    shutil.copytree(FIXTURE, logs)
    with (logs / "timing.jsonl").open("a") as file:
        file.write('{"bench": "evaluation", \n')
    status, _ = collect(tmp_path, logs)
    assert status == 1
    assert "timing.jsonl:" in capsys.readouterr().err


def test_method_flags_come_from_the_run_script():
    flags = collect_evaluation.method_flags()
    assert set(flags) == set(collect_evaluation.METHODS)
    assert flags["xattention"] == "--threshold 0.9 --stride 8"
    assert "--gamma" in flags["flexprefill"]


def cli_with_mask_methods() -> str:
    cli = os.environ.get("WAVEALIGN_CLI")
    if not cli:
        pytest.skip("the wavealign CLI is not built (WAVEALIGN_CLI unset)")
    listing = subprocess.run([cli, "--help"], capture_output=True, text=True).stdout
    if not any(line.split()[:1] == ["mask"] for line in listing.splitlines()):
        pytest.skip("this wavealign CLI has no `mask` subcommand (the mask methods are not in this build)")
    return cli


def test_simulated_mode_labels_every_number(tmp_path):
    cli = cli_with_mask_methods()
    logs = tmp_path / "logs"
    status, record = collect(tmp_path, logs, extra=("--simulated", "--wavealign", cli, "--sim-frames", "5,9",
                                                    "--measured-frames", "161,401", "--sim-heads", "1"))
    assert status == 0
    assert record["mode"] == "simulated" and "standing for 161, 401" in record["simulation"]
    assert {row["method"] for row in record["masks"]} == set(collect_evaluation.METHODS)
    assert {row["impl"] for row in record["derived"]["fig10"]} == {"simulated"}
    assert {"wave_union_original", "wave_union_wavealign"} <= set(record["derived"]["fig14"][0])
    assert "SIMULATED on the CPU" in (tmp_path / "evaluation.md").read_text()


def test_gpu_driver_says_why_it_does_not_run_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: bench/gpu/run_evaluation.sh runs the driver there")
    pytest.importorskip("wavealign.bench", reason="wavealign.bench (timing helpers) is not in this build")
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "bench_evaluation.py"), "--masks",
                             str(tmp_path), "--frames", "5"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines == [{"skipped": impl, "reason": "no CUDA device"} for impl in ("wavealign", "flashattention4")]


def test_ncu_units_long_and_short_names_scale_alike(tmp_path):
    """ncu 2025.3 writes "ns" and "hz" where older releases wrote "nsecond": both must read as the same ms/MHz
    (a 55.75 ms launch read as 55,750,368 ms made every roofline point 0 TF/s)."""
    header = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
    body = ('"0","k","gpu__time_duration.sum","ns","55,750,368"\n"0","k","sm__cycles_elapsed.avg.per_second","hz",'
            '"1,481,280,144"\n"1","k","gpu__time_duration.sum","nsecond","55,750,368"\n'
            '"1","k","dram__bytes_read.sum","Gbyte","2.5"\n')
    path = tmp_path / "ncu.csv"
    path.write_text("==PROF== noise\n" + header + body)
    short, long_ = collect_evaluation.read_ncu_csv(path)
    assert short["gpu__time_duration.sum"] == pytest.approx(55.750368)
    assert long_["gpu__time_duration.sum"] == pytest.approx(55.750368)
    assert short["sm__cycles_elapsed.avg.per_second"] == pytest.approx(1481.280144)
    assert long_["dram__bytes_read.sum"] == pytest.approx(2.5e9)


def test_packed_rows_keeps_each_row_length_and_moves_its_blocks_to_the_first_columns():
    torch = pytest.importorskip("torch")
    pytest.importorskip("wavealign.bench", reason="wavealign.bench (timing helpers) is not in this build")
    import bench_evaluation

    generator = torch.Generator().manual_seed(3)
    mask = torch.rand(2, 5, 7, generator=generator) < 0.4
    mask[0, 1] = False  # an empty row stays empty
    mask[1, 2] = True  # a full row stays full
    packed = bench_evaluation.packed_rows(mask)
    assert packed.dtype == torch.bool and packed.shape == mask.shape
    assert torch.equal(packed.sum(-1), mask.sum(-1))
    for head in range(2):
        for row in range(5):
            count = int(mask[head, row].sum())
            assert packed[head, row, :count].all() and not packed[head, row, count:].any()
