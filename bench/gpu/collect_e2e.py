#!/usr/bin/env python3
"""Merges the JSON lines of bench/gpu/bench_e2e.py into bench/results/h200-e2e.json and prints (or writes into
docs/e2e.md) the end-to-end table: per row the 40-layer step time, the self-attention share, mask + plan time,
and the speedups over dense and over the original order.

Usage: bench/gpu/collect_e2e.py LOG.jsonl [LOG.jsonl ...] [--out bench/results/h200-e2e.json] [--docs docs/e2e.md]
       [--commit TEXT]

A later line of the same (config, frames, layers, method, backend, precision, order, method options) replaces an
earlier one, so reruns of part of the bench can be appended to one log. Speedups compare rows of one frame count
and layer count: over the dense row, and over the original-order row of the same method, backend and precision.
An 8-bit row's backend reads "wavealign int8" in the table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

KEY = ("config", "frames", "layers", "method", "backend", "precision", "order")
TABLE_BEGIN, TABLE_END = "<!-- e2e table: bench/gpu/collect_e2e.py -->", "<!-- end of e2e table -->"


def options_of(row: dict) -> str:
    """The row's --method-options for its method, as compact JSON ("" for the method's defaults)."""
    options = row.get("method_options")
    return json.dumps(options, sort_keys=True, separators=(",", ":")) if options else ""


def read_rows(paths: list[pathlib.Path]) -> tuple[list[dict], list[dict]]:
    """(measured rows, skip notes) from the logs, later duplicates replacing earlier ones."""
    rows: dict[tuple, dict] = {}
    skipped: list[dict] = []
    for path in paths:
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            row.setdefault("precision", "native")  # rows from before --precisions ran the bf16 kernel
            if "skipped" in row:
                skipped.append(row)
            elif row.get("bench") == "e2e":
                rows[(*(row[name] for name in KEY), options_of(row))] = row
    return list(rows.values()), skipped


def derive(rows: list[dict]) -> list[dict]:
    """Adds attention_share, mask_plan_share, speedup_vs_dense and speedup_vs_original (40-layer figures)."""
    def find(row: dict, **match: str) -> dict | None:
        same = ("config", "frames", "layers")
        return next((other for other in rows if all(other[name] == row[name] for name in same)
                     and all(other[name] == value for name, value in match.items())), None)

    for row in rows:
        step = row["step_ms_model"]
        row["attention_share"] = (row["attention_ms_model"] + row["mask_ms_model"] + row["plan_ms_model"]) / step
        row["mask_plan_share"] = (row["mask_ms_model"] + row["plan_ms_model"]) / step
        dense = find(row, method="dense")
        original = next((other for other in rows if other["order"] == "original"
                         and options_of(other) == options_of(row)
                         and all(other[name] == row[name] for name in ("config", "frames", "layers", "method",
                                                                        "backend", "precision"))), None)
        row["speedup_vs_dense"] = dense["step_ms_model"] / step if dense else None
        row["speedup_vs_original"] = original["step_ms_model"] / step if original and row["method"] != "dense" \
            else None
    return rows


def method_label(row: dict) -> str:
    options = options_of(row)
    return row["method"] if not options else f"{row['method']} `{options}`"


def backend_label(row: dict) -> str:
    return row["backend"] if row["precision"] == "native" else f"{row['backend']} {row['precision']}"


def table(rows: list[dict]) -> str:
    def ratio(value: float | None) -> str:
        return "" if value is None else f"{value:.3f}x"

    lines = ["| frames | tokens | layers run | method | backend | order | step s (40 layers) | self-attention share "
             "| mask + plan ms | density | vs dense | vs original | = original bit for bit |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {"dense": 0}
    for row in sorted(rows, key=lambda r: (r["frames"], order.get(r["method"], 1), r["method"], options_of(r),
                                           r["backend"], r["precision"], r["order"] != "original", r["order"])):
        star = "*" if row["extrapolated"] else ""
        density = "" if row.get("density") is None else f"{row['density']:.3f}"
        equal = {True: "yes", False: "NO", None: ""}[row.get("bitwise_equal_to_original")]
        lines.append(f"| {row['frames']} | {row['tokens']:,} | {row['layers']} | {method_label(row)} | {backend_label(row)} | "
                     f"{row['order']} | {row['step_ms_model'] / 1e3:.2f}{star} | {100 * row['attention_share']:.1f} % | "
                     f"{row['mask_ms_model'] + row['plan_ms_model']:.0f} | {density} | "
                     f"{ratio(row['speedup_vs_dense'])} | {ratio(row['speedup_vs_original'])} | {equal} |")
    if any(row["extrapolated"] for row in rows):
        lines.append("")
        lines.append("\\* extrapolated from the layers run: time outside the blocks + 40 x the measured time per "
                     "layer (attention, mask and plan times x 40 / layers run).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/h200-e2e.json"))
    parser.add_argument("--docs", type=pathlib.Path, default=None, help="write the table into this file's marked section")
    parser.add_argument("--commit", default=None, help="the commit(s) the rows ran from, when the logs' own "
                        "(git on the benchmark host) is not the tree that was run")
    args = parser.parse_args()
    rows, skipped = read_rows(args.logs)
    if not rows:
        raise SystemExit(f"collect_e2e: no bench_e2e rows in {', '.join(map(str, args.logs))}")
    rows = derive(rows)
    first = rows[0]
    record = {"device": first["device"], "commit": args.commit or first["commit"], "date": first["date"],
              "torch": first["torch"], "diffusers": first["diffusers"],
              "command": "bench/gpu/bench_e2e.py --frames F --layers N ... --out LOG (one call per part); "
                         "bench/gpu/collect_e2e.py LOG",
              "rows": rows, "skipped": skipped}
    result_record.write(args.out, record)
    text = table(rows)
    print(text)
    if args.docs is not None:
        document = args.docs.read_text()
        pattern = re.compile(re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END), re.S)
        if not pattern.search(document):
            raise SystemExit(f"collect_e2e: {args.docs} has no section between {TABLE_BEGIN!r} and {TABLE_END!r}")
        args.docs.write_text(pattern.sub(lambda _: f"{TABLE_BEGIN}\n{text}\n{TABLE_END}", document))


if __name__ == "__main__":
    main()
