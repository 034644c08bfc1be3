#!/usr/bin/env python3
"""Simulator predictions for every row order on the issue's reference workloads, and their sensitivity to the
usable-L2 fraction (alpha) and the per-block time jitter. Writes bench/results/cpu-simulator-sweep.json and
prints a Markdown table.

Usage: bench/cpu/simulator_sweep.py [--wavealign build/wavealign] [--out bench/results/cpu-simulator-sweep.json]
"""
import argparse
import json
import pathlib
import platform
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

ORDERS = "original,s1,s2,wavealign,shuffled"
WORKLOADS = {
    "random-0.20": ["--model", "wan2.1-14b", "--frames", "401", "--heads", "1", "--mask", "random", "--density", "0.2"],
    "video-0.28": ["--model", "wan2.1-14b", "--frames", "401", "--heads", "4", "--mask", "video", "--density", "0.28"],
}
ALPHAS = [0.5, 0.64, 1.0]
JITTERS = [0.0, 0.1, 0.25, 0.5]


def simulate(binary, workload_args, extra):
    command = [binary, "simulate", *workload_args, "--gpu", "h200", "--orders", ORDERS, "--seed", "0", "--json", *extra]
    out = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return command, {row["order"]: row for row in out["results"]}, out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wavealign", default="build/wavealign")
    parser.add_argument("--out", default="bench/results/cpu-simulator-sweep.json")
    args = parser.parse_args()
    record = result_record.make(f"CPU simulator ({platform.machine()}), GPU model h200",
                                "bench/cpu/simulator_sweep.py", cases=[])
    print("| workload | alpha | jitter | order | L2 hit | HBM read GB | vs original |")
    print("|---|---|---|---|---|---|---|")
    for name, workload_args in WORKLOADS.items():
        settings = [(0.5, 0.25)] + [(a, 0.25) for a in ALPHAS if a != 0.5] + [(0.5, j) for j in JITTERS if j != 0.25]
        for alpha, jitter in settings:
            command, rows, out = simulate(args.wavealign, workload_args, ["--usable-l2", str(alpha), "--jitter", str(jitter)])
            base = rows["original"]
            for order, row in rows.items():
                record["cases"].append({
                    "workload": name, "tokens": out["workload"]["tokens"], "heads": out["workload"]["heads"],
                    "density": out["workload"]["density"], "usable_l2_fraction": alpha, "jitter": jitter,
                    "order": order, "l2_hit_ratio": row["l2_hit_ratio"], "hbm_read_bytes": row["hbm_read_bytes"],
                    "plan_ms": row["plan_ms"], "command": " ".join(command[1:])})
                print(f"| {name} | {alpha} | {jitter} | {order} | {100 * row['l2_hit_ratio']:.1f}% | "
                      f"{row['hbm_read_bytes'] / 1e9:.1f} | {row['l2_hit_ratio'] / base['l2_hit_ratio']:.2f}x hit, "
                      f"{row['hbm_read_bytes'] / base['hbm_read_bytes']:.2f}x bytes |")
    result_record.write(args.out, record)


if __name__ == "__main__":
    main()
