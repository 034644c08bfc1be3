#!/usr/bin/env python3
"""Checks a skip profile on cases it was not built from (paper Fig. 13 on held-out lengths and densities).

A validation sweep (bench/gpu/calibrate_skip.sh with other FRAMES and DENSITIES, and ORDERS="original wavealign
original" so that every cell has two runs of the original order) measures, per cell, the kernel in both orders
and the GPU plan. For each cell this asks the CLI (`wavealign skip`) what the profile decides at the cell's
length and measured density, and compares that with what the measurement says:

  gain = original_ms - wavealign_ms (the first original run), plan = plan_ms, both over the sweep's heads;
  reordering pays when gain * plan_reuse > plan;
  adaptive_ms = original_ms when the profile skips, else wavealign_ms + plan_ms / plan_reuse;
  noise = |original_ms - second original_ms| / original_ms, the run-to-run spread of the same launch.

A decision is "right" when it agrees with the measurement, and "within noise" when a wrong decision costs less
than max(noise of the cell, --noise-floor) of the original time. The check passes when every cell's adaptive
time is within that noise of the better of the two choices and never slower than the original order by more.

Usage: bench/gpu/validate_skip_profile.py LOG_DIR --profile bench/results/h200-skip-profile.json
           [--wavealign build/wavealign] [--plan-reuse 1] [--noise-floor 0.02] [--out JSON] [--table MD]
Exit status 1 when the check fails.
"""
import argparse
import datetime
import json
import pathlib
import statistics
import subprocess
import sys

from make_skip_profile import read_jsonl, read_meta, result_record


def collect(logs):
    """{(frames, target_density): {"tokens", "density", "heads", "original": [ms...], "wavealign": [ms...],
    "plan": [ms...]}} from a sweep's logs."""
    cells = {}
    for row in read_jsonl(logs / "kernel.jsonl"):
        if row.get("l2") != "cold" or row.get("mode") != "sparse":
            continue
        cell = cells.setdefault((row["frames"], float(row["target_density"])),
                                {"original": [], "wavealign": [], "plan": []})
        cell.update(tokens=row["tokens"], density=row["density"], heads=row["heads"])
        if row["order"] in ("original", "wavealign"):
            cell[row["order"]].append(row["ms"])
    for row in read_jsonl(logs / "plan.jsonl"):
        key = (row["frames"], float(row.get("target_density", -1)))
        if key in cells:
            cells[key]["plan"].append(row["plan_ms"])
    return cells


def decisions(cli, profile, cells, heads, plan_reuse):
    """The profile's decision per cell, from `wavealign skip` at the cell's length and measured density."""
    out = {}
    for key, cell in cells.items():
        result = subprocess.run([cli, "skip", "--profile", str(profile), "--tokens", str(cell["tokens"]),
                                 "--density", repr(cell["density"]), "--heads", str(heads), "--plan-reuse",
                                 repr(plan_reuse), "--json"], capture_output=True, text=True, check=True)
        out[key] = json.loads(result.stdout)["decisions"][0]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", type=pathlib.Path)
    parser.add_argument("--profile", type=pathlib.Path, required=True)
    parser.add_argument("--wavealign", default="build/wavealign", help="the CLI binary")
    parser.add_argument("--plan-reuse", type=float, default=1.0)
    parser.add_argument("--noise-floor", type=float, default=0.02,
                        help="smallest relative noise assumed for a cell (a single repeat underestimates it)")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--table", type=pathlib.Path)
    args = parser.parse_args()

    cells = collect(args.logs)
    complete = {k: c for k, c in cells.items() if c["original"] and c["wavealign"] and c["plan"]}
    for key in sorted(set(cells) - set(complete)):
        print(f"warning: cell {key} left out: a kernel order or the plan is missing", file=sys.stderr)
    if not complete:
        sys.exit(f"no complete cell in {args.logs}")
    heads = {c["heads"] for c in complete.values()}
    if len(heads) != 1:
        sys.exit(f"cells measured with different head counts: {sorted(heads)}")
    heads = heads.pop()
    decided = decisions(args.wavealign, args.profile, complete, heads, args.plan_reuse)

    rows, failures = [], []
    for key in sorted(complete):
        cell, decision = complete[key], decided[key]
        original, wavealign = cell["original"][0], cell["wavealign"][0]
        plan = statistics.median(cell["plan"])
        noise = abs(cell["original"][1] - original) / original if len(cell["original"]) > 1 else None
        tolerance = max(noise or 0.0, args.noise_floor)
        reordered_ms = wavealign + plan / args.plan_reuse
        pays = (original - wavealign) * args.plan_reuse > plan
        adaptive = original if decision["skipped"] else reordered_ms
        best = min(original, reordered_ms)
        right = decision["skipped"] != pays
        within = adaptive <= best * (1 + tolerance) and adaptive <= original * (1 + tolerance)
        row = {"frames": key[0], "tokens": cell["tokens"], "target_density": key[1], "density": cell["density"],
               "heads": heads, "original_ms": original, "wavealign_ms": wavealign, "plan_ms": plan,
               "noise": noise, "predicted_gain_ms": decision["gain_ms"], "predicted_plan_ms": decision["plan_ms"],
               "skipped": decision["skipped"], "pays": pays, "right": right, "adaptive_ms": adaptive,
               "adaptive_speedup": original / adaptive, "within_noise": within}
        rows.append(row)
        if not within:
            failures.append(row)

    densities = sorted({r["target_density"] for r in rows})
    header = "| L (tokens) | frames | " + " | ".join(f"{100 * d:g}%" for d in densities) + " |"
    lines = [f"Held-out cells ({heads} heads, plan reused {args.plan_reuse:g}x): the profile's decision, the "
             "adaptive path's speedup over the original order (measured), and whether reordering measured as "
             "paying; '!' marks a wrong decision, '!!' one that cost more than the noise:", "",
             header, "|---:|---:|" + "---:|" * len(densities)]
    for tokens in sorted({r["tokens"] for r in rows}):
        by_density = {r["target_density"]: r for r in rows if r["tokens"] == tokens}
        cells_text = []
        for d in densities:
            r = by_density.get(d)
            if r is None:
                cells_text.append("-")
                continue
            mark = "" if r["right"] else ("!" if r["within_noise"] else "!!")
            verb = "skip" if r["skipped"] else "reorder"
            cells_text.append(f"{verb} {r['adaptive_speedup']:.2f}x (pays: {'yes' if r['pays'] else 'no'}){mark}")
        frames = next(iter(by_density.values()))["frames"]
        lines.append(f"| {tokens:,} | {frames} | " + " | ".join(cells_text) + " |")
    right = sum(r["right"] for r in rows)
    noises = [r["noise"] for r in rows if r["noise"] is not None]
    lines += ["", f"{right}/{len(rows)} decisions agree with the measurement; {len(rows) - len(failures)}/{len(rows)} "
              f"cells within noise of the better choice (noise: median {100 * statistics.median(noises):.1f}%, "
              f"max {100 * max(noises):.1f}% over {len(noises)} repeated cells; floor {100 * args.noise_floor:g}%)."
              if noises else f"{right}/{len(rows)} decisions agree with the measurement.", ""]
    text = "\n".join(lines)
    print(text)
    if args.table:
        args.table.write_text(text)
    if args.out:
        meta = read_meta(args.logs / "meta.txt")
        profile = json.loads(args.profile.read_text())
        result_record.write(args.out, {
            "device": profile.get("device"), "commit": meta.get("commit", "unknown"),
            "date": meta.get("date") or datetime.date.today().isoformat(),
            "command": "bench/gpu/calibrate_skip.sh BUILD_DIR LOG_DIR (held-out FRAMES/DENSITIES, ORDERS="
                       "'original wavealign original'); bench/gpu/validate_skip_profile.py LOG_DIR --profile "
                       f"{args.profile}",
            "profile": str(args.profile), "plan_reuse": args.plan_reuse, "noise_floor": args.noise_floor,
            "decisions_right": right, "cells": len(rows), "cells_within_noise": len(rows) - len(failures),
            "rows": rows})
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
