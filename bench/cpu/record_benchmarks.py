#!/usr/bin/env python3
"""Runs the CPU Google Benchmark programs and records their results with device, commit, date and command.

Usage: bench/cpu/record_benchmarks.py [--build build] [--out bench/results/cpu-benchmarks.json]
Prints one line per benchmark: name, real and CPU time.
"""
import argparse
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

PROGRAMS = ["wa_bench_plan", "wa_bench_simulate"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="bench/results/cpu-benchmarks.json")
    args = parser.parse_args()
    record = result_record.make(f"{result_record.cpu_model()}, one thread",
                                "bench/cpu/record_benchmarks.py --build " + args.build, benchmarks=[])
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
    result_record.write(args.out, record)


if __name__ == "__main__":
    main()
