#!/usr/bin/env python3
"""Runs the CPU Google Benchmark programs and records their results with device, commit, date and command.

Usage: bench/cpu/record_benchmarks.py [--build build] [--out bench/results/cpu-benchmarks.json]
Prints one line per benchmark: name, real and CPU time.
"""
import argparse
import datetime
import json
import pathlib
import platform
import subprocess

PROGRAMS = ["wa_bench_plan", "wa_bench_simulate"]


def cpu_model():
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="bench/results/cpu-benchmarks.json")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"device": f"{cpu_model()}, one thread", "commit": commit, "date": datetime.date.today().isoformat(),
              "command": "bench/cpu/record_benchmarks.py --build " + args.build, "benchmarks": []}
    for program in PROGRAMS:
        binary = pathlib.Path(args.build) / "bench" / program
        command = [str(binary), "--benchmark_format=json", "--benchmark_repetitions=5",
                   "--benchmark_report_aggregates_only=true"]
        result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        for bench in result["benchmarks"]:
            if bench.get("aggregate_name") != "median":
                continue
            entry = {"program": program, "name": bench["run_name"], "real_time": bench["real_time"],
                     "cpu_time": bench["cpu_time"], "time_unit": bench["time_unit"], "statistic": "median of 5"}
            entry.update({k: v for k, v in bench.items() if k in ("rows", "density", "nnz", "kv_accesses", "hit_ratio")})
            record["benchmarks"].append(entry)
            print(f"{entry['name']:40s} {entry['real_time']:10.2f} {entry['time_unit']} real "
                  f"{entry['cpu_time']:10.2f} {entry['time_unit']} cpu")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
