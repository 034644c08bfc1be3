#!/usr/bin/env python3
"""Turns the logs of bench/gpu/calibrate_skip.sh into a skip profile (docs/skip-profile.md) and a Fig. 13-style
table: the speedup of the WaveAlign order over the original order against sequence length and density, and
where the adaptive skip would keep the original order because the measured gain does not pay for the plan.

Usage: bench/gpu/make_skip_profile.py LOG_DIR [--out bench/results/h200-skip-profile.json]
                                      [--table bench/results/h200-skip-profile.md] [--plan-reuse 1]
                                      [--device NAME] [--commit SHA] [--date YYYY-MM-DD]

A (sequence length, density) cell needs both orders measured and the plan measured at that length; a length
missing any cell is left out of the profile with a warning, since the profile's grid must be complete.
"""
import argparse
import datetime
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

FORMAT = "wavealign-skip-profile"
VERSION = 1
MASK = "video"


def read_jsonl(path):
    rows = []
    if path.exists():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                print(f"warning: {path}:{number}: skipped, not JSON ({error})", file=sys.stderr)
    return rows


def read_meta(path):
    meta = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, value = line.partition("=")
            if value:
                meta[key.strip()] = value.strip()
    return meta


def device_from_gpu_txt(path):
    """The GPU's name from nvidia-smi's CSV (header line, then one line per query)."""
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        name = line.split(",")[0].strip()
        if name and name != "name":
            return name
    return None


def collect(kernel_rows, plan_rows):
    """{frames: {"tokens", "plan_ms", "plan_heads", "cells": {density: {order: row}}}} from the log lines."""
    lengths = {}
    for row in kernel_rows:
        if row.get("mask") != MASK or row.get("l2") != "cold" or row.get("order") not in ("original", "wavealign"):
            continue
        entry = lengths.setdefault(row["frames"], {"tokens": row["tokens"], "cells": {}, "plan": []})
        cell = entry["cells"].setdefault(float(row["target_density"]), {})
        # A repeated run (a sweep resumed into the same LOG_DIR) replaces the earlier one.
        cell[row["order"]] = row
    for row in plan_rows:
        if row["frames"] in lengths:
            lengths[row["frames"]]["plan"].append(row)
    return lengths


def build_points(lengths):
    """The complete grid of profile points, and the lengths left out (with why)."""
    densities = sorted({d for entry in lengths.values() for d in entry["cells"]})
    points, dropped = [], []
    for frames in sorted(lengths):
        entry = lengths[frames]
        missing = [f"{d:g}/{order}" for d in densities for order in ("original", "wavealign")
                   if order not in entry["cells"].get(d, {})]
        if missing:
            dropped.append((frames, "kernel runs missing: " + ", ".join(missing)))
            continue
        if not entry["plan"]:
            dropped.append((frames, "no plan run"))
            continue
        plan_heads = {row["heads"] for row in entry["plan"]}
        kernel_heads = {cell[order]["heads"] for cell in entry["cells"].values() for order in cell}
        if len(plan_heads) != 1 or plan_heads != kernel_heads:
            dropped.append((frames, f"heads differ: kernel {sorted(kernel_heads)}, plan {sorted(plan_heads)}"))
            continue
        for density in densities:
            cell = entry["cells"][density]
            # The plan measured on this cell's density; logs of older sweeps measured one density per length.
            plan_rows = [row for row in entry["plan"] if float(row.get("target_density", -1)) == density]
            plan_rows = plan_rows or entry["plan"]
            plan_ms = statistics.median(row["plan_ms"] for row in plan_rows)
            points.append({
                "tokens": entry["tokens"],
                "density": density,
                "mask": MASK,
                "heads": cell["original"]["heads"],
                "original_ms": cell["original"]["ms"],
                "wavealign_ms": cell["wavealign"]["ms"],
                "plan_ms": plan_ms,
                "frames": frames,
                "measured_density": cell["original"]["density"],
                "plan_density": plan_rows[0]["density"],
            })
    return points, dropped


def skipped(point, plan_reuse):
    """decide_by_gain on one point: skip unless the gain over plan_reuse calls exceeds the plan cost."""
    return (point["original_ms"] - point["wavealign_ms"]) * plan_reuse <= point["plan_ms"]


def table(points, plan_reuse):
    """Markdown: kernel speedup per cell, and the adaptive path's speedup with the plan's cost included."""
    densities = sorted({p["density"] for p in points})
    by_length = {}
    for point in points:
        by_length.setdefault(point["tokens"], {})[point["density"]] = point
    header = "| L (tokens) | frames | " + " | ".join(f"{100 * d:g}%" for d in densities) + " |"
    rule = "|---:|---:|" + "---:|" * len(densities)
    kernel, adaptive = [header, rule], [header, rule]
    for tokens in sorted(by_length):
        row = by_length[tokens]
        frames = next(iter(row.values()))["frames"]
        kernel_cells, adaptive_cells = [], []
        for d in densities:
            p = row[d]
            kernel_cells.append(f"{p['original_ms'] / p['wavealign_ms']:.2f}x")
            with_plan = p["original_ms"] / (p["wavealign_ms"] + p["plan_ms"] / plan_reuse)
            adaptive_cells.append(f"skip ({with_plan:.2f}x)" if skipped(p, plan_reuse) else f"{with_plan:.2f}x")
        kernel.append(f"| {tokens:,} | {frames} | " + " | ".join(kernel_cells) + " |")
        adaptive.append(f"| {tokens:,} | {frames} | " + " | ".join(adaptive_cells) + " |")
    heads = points[0]["heads"]
    return "\n".join([
        f"Kernel speedup of the WaveAlign order over the original order (original_ms / wavealign_ms, {heads} heads, "
        "cold L2):",
        "",
        *kernel,
        "",
        f"Adaptive path (plan reused {plan_reuse:g}x): original_ms / (wavealign_ms + plan_ms / reuse); 'skip' marks "
        "cells where the gain does not exceed the plan cost, which then run the original order (1.00x); the "
        "number in brackets is what reordering would have given:",
        "",
        *adaptive,
        "",
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/h200-skip-profile.json"))
    parser.add_argument("--table", type=pathlib.Path, help="also write the tables here (always printed)")
    parser.add_argument("--plan-reuse", type=float, default=1.0,
                        help="attention calls per plan for the table's skip marks (SkipModel::plan_reuse)")
    parser.add_argument("--device", help="GPU name (default: from plan.jsonl, else gpu.txt)")
    parser.add_argument("--commit", help="measured commit (default: LOG_DIR/meta.txt)")
    parser.add_argument("--date", help="measurement date (default: LOG_DIR/meta.txt, else today)")
    args = parser.parse_args()
    if args.plan_reuse <= 0:
        parser.error("--plan-reuse must be > 0")

    kernel_rows = read_jsonl(args.logs / "kernel.jsonl")
    plan_rows = read_jsonl(args.logs / "plan.jsonl")
    meta = read_meta(args.logs / "meta.txt")
    lengths = collect(kernel_rows, plan_rows)
    by_tokens = {}
    for frames, entry in lengths.items():
        by_tokens.setdefault(entry["tokens"], []).append(frames)
    clashes = {tokens: frames for tokens, frames in by_tokens.items() if len(frames) > 1}
    if clashes:
        sys.exit(f"frames with the same sequence length would repeat grid cells: {clashes}")
    points, dropped = build_points(lengths)
    for frames, why in dropped:
        print(f"warning: {frames} frames left out of the profile: {why}", file=sys.stderr)
    if not points:
        sys.exit(f"no complete sequence length in {args.logs} ({len(kernel_rows)} kernel lines, "
                 f"{len(plan_rows)} plan lines)")

    device = args.device or (plan_rows[0].get("device") if plan_rows else None) or \
        device_from_gpu_txt(args.logs / "gpu.txt")
    if not device:
        sys.exit("no device name in the logs; pass --device")
    profile = {
        "format": FORMAT,
        "version": VERSION,
        "device": device,
        "commit": args.commit or meta.get("commit", "unknown"),
        "date": args.date or meta.get("date") or datetime.date.today().isoformat(),
        "command": "bench/gpu/calibrate_skip.sh BUILD_DIR LOG_DIR; bench/gpu/make_skip_profile.py LOG_DIR",
        "note": "plan_ms: the GPU plan of the same heads on a video mask of the cell's target density "
                "(plan_density: the density it reached)",
        "points": points,
    }
    result_record.write(args.out, profile)
    text = table(points, args.plan_reuse)
    print(text)
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(text)
    print(f"{len(points)} points -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
