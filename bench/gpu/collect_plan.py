#!/usr/bin/env python3
"""Turns wa_bench_plan_gpu's JSON lines into bench/results/h200-plan.json: each run's plan time and breakdown,
next to the sparse attention time of the same layer (40 heads, WaveAlign order) from h200-attention.json, so
that the plan's share of the layer's attention is recorded with it.

Usage: bench/gpu/collect_plan.py PLAN_LOG [--attention bench/results/h200-attention.json]
                                 [--out bench/results/h200-plan.json] [--commit SHA] [--date YYYY-MM-DD]
                                 [--command "..."]
"""
import argparse
import datetime
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402


def layer_attention_ms(path, heads, tokens):
    """Our kernel's time for `heads` heads of `tokens` tokens in WaveAlign order, and the record's commit."""
    record = json.loads(path.read_text())
    for case in record["cases"]:
        if (case["impl"] == "wavealign-kernel" and case["mode"] == "sparse" and case["order"] == "wavealign"
                and case["heads"] == heads and case["tokens"] == tokens):
            return case["ms"], record.get("commit")
    return None, None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=pathlib.Path)
    parser.add_argument("--attention", type=pathlib.Path, default=pathlib.Path("bench/results/h200-attention.json"))
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/h200-plan.json"))
    parser.add_argument("--tokens", type=int, default=363600, help="sequence length of the planned layer")
    parser.add_argument("--commit", default=None, help="the commit the planner was built from (default: HEAD)")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--command", default="wa_bench_plan_gpu --repeats 20 --stage1 all --input both")
    args = parser.parse_args()

    runs = []
    for line in args.log.read_text().splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        attention_ms, attention_commit = layer_attention_ms(args.attention, row["heads"], args.tokens)
        runs.append({
            "heads": row["heads"], "rows": row["rows"], "density": row["density"], "input": row["input"],
            "order": row["order"], "stage1_products": row["stage1"], "plan_ms": row["plan_ms"],
            "graph_plan_ms": row["graph_plan_ms"], "attention_ms": attention_ms,
            "attention_commit": attention_commit,
            "plan_share_of_attention": row["plan_ms"] / attention_ms if attention_ms else None,
            "cpu_plan_ms": row["cpu_plan_ms"], "heads_equal_to_cpu": row["heads_equal_to_cpu"],
            "breakdown": row["breakdown"], "bandwidth_gbps": row["bandwidth_gbps"]})
    if not runs:
        sys.exit(f"no JSON line in {args.log}")
    device = json.loads(next(l for l in args.log.read_text().splitlines() if l.startswith("{")))["device"]
    result_record.write(args.out, result_record.make(device, args.command, commit=args.commit, date=args.date,
                                                     runs=runs))
    for run in runs:
        share = run["plan_share_of_attention"]
        print(f"{run['stage1_products']:>7} {run['input']:>5}: plan {run['plan_ms']:.2f} ms, graph "
              f"{run['graph_plan_ms']:.2f} ms, Stage 1 {run['breakdown']['iterations_ms']:.2f} ms"
              + (f", {100 * share:.2f} % of the layer's attention ({run['attention_ms']:.0f} ms)" if share else ""))


if __name__ == "__main__":
    main()
