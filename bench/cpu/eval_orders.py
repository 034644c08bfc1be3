#!/usr/bin/env python3
"""Simulator evaluation of every row order (the Table II analogue of docs/reordering.md).

Runs build/bench/wa_eval_orders on the synthetic video (density 0.28) and random (0.20) masks at 401 and 161
frames (Wan2.1-14B, 4 heads), plus any mask files given with --mask NAME=FILE.npy, and writes
  bench/results/cpu-orders.json  every run (order, variant: rank / clusters / seed) with its numbers,
  bench/results/cpu-orders.md    the table per workload (seeded orders: mean over seeds, spread in the JSON),
  docs/reordering.png            L2 hit ratio against plan cost, one panel per workload.
Seeded orders run with --seeds seeds; minhash and shuffled (randomised by nature) with max(5, seeds).
The H200 columns (kernel time, speedup, HBM SOL) stay "pending" until bench/gpu measures them.

Usage: bench/cpu/eval_orders.py [--build build] [--seeds 2] [--mask xattention-364k=mask.npy ...]
       bench/cpu/eval_orders.py --from-json bench/results/cpu-orders.json [--h200 LOG_DIR]
       (table and plot only; --h200: the logs of bench/gpu/run_h200_orders.sh fill the H200 columns)
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

SYNTHETIC = {
    "video-0.28-401f": ["--mask", "video", "--density", "0.28", "--frames", "401"],
    "random-0.20-401f": ["--mask", "random", "--density", "0.2", "--frames", "401"],
    "video-0.28-161f": ["--mask", "video", "--density", "0.28", "--frames", "161"],
    "random-0.20-161f": ["--mask", "random", "--density", "0.2", "--frames", "161"],
}
RANDOMISED = ("minhash", "shuffled")
# The variant a plain `--order NAME` plans (PlanConfig defaults: embedding_rank 4, clusters 0): the rows the
# H200 columns belong to.
DEFAULT_VARIANT = {"hilbert": "rank=4", "morton": "rank=4", "chain": "rank=4", "spectral": "clusters=0"}
FRAMES = {363600: 401, 147600: 161}
HBM_BYTES_PER_S = 4.8e12  # H200 datasheet


def run_eval(binary, workload_args, seeds, workload_seed):
    """Every order on one workload; the randomised orders again with at least 5 seeds, replacing the first run's."""
    common = ["--heads", "4", "--model", "wan2.1-14b", "--workload-seed", str(workload_seed), *workload_args]

    def run(*extra):
        command = [binary, *common, *extra]
        return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)

    every = run("--seeds", str(seeds))
    randomised = run("--seeds", str(max(5, seeds)), "--orders", ",".join(RANDOMISED))
    every["results"] = [row for row in every["results"] if row["order"] not in RANDOMISED] + randomised["results"]
    return every


def variant_name(variant):
    parts = [f"{key}={value}" for key, value in variant.items() if key not in ("seed", "stage2")]
    if variant.get("stage2"):
        parts.append("+S2")
    return ",".join(parts)


def aggregate(results):
    """(order, variant) -> mean/stdev over seeds of each number; keys in first-seen order."""
    groups = defaultdict(list)
    for row in results:
        groups[(row["order"], variant_name(row["variant"]))].append(row)
    summary = {}
    for key, rows in groups.items():
        entry = {"runs": len(rows), "stage2": rows[0]["stage2"]}
        for field in ("l2_hit_ratio", "hbm_read_bytes", "mean_wave_kv_union", "predicted_kernel_ms", "plan_ms"):
            values = [row[field] for row in rows]
            entry[field] = statistics.fmean(values)
            entry[field + "_stdev"] = statistics.stdev(values) if len(values) > 1 else 0.0
        summary[key] = entry
    return summary


def h200_columns(log_dir):
    """{(workload name, order): {ms, plan_ms, l2_hit, dram_read_bytes, gpu_ms}} from run_h200_orders.sh's logs."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "gpu"))
    from collect_attention import read_jsonl, read_ncu

    log = pathlib.Path(log_dir)
    columns = defaultdict(dict)

    def name_of(mask, frames):  # the SYNTHETIC workload names
        return f"{mask}-{0.28 if mask == 'video' else 0.20:.2f}-{frames}f"

    for row in read_jsonl(log / "orders-kernel.jsonl"):
        if row.get("impl") == "wavealign-kernel" and row.get("mode") == "sparse":
            columns[(name_of(row["mask"], FRAMES[row["tokens"]]), row["order"])]["ms"] = row["ms"]
    for (frames, mask, order), metrics in read_ncu(log / "orders-ncu.csv").items():
        entry = columns[(name_of(mask, frames), order)]
        entry["l2_hit"] = metrics.get("lts__t_sector_op_read_hit_rate.pct")
        entry["dram_read_bytes"] = metrics.get("dram__bytes_read.sum")
        entry["gpu_ms"] = metrics.get("gpu__time_duration.sum")
    for path in log.glob("orders-plan-*.json"):
        _, _, mask, frames = path.stem.split("-")
        for row in json.loads(path.read_text())["results"]:
            if not row["variant"].get("stage2"):
                columns[(name_of(mask, int(frames)), row["order"])]["plan_ms"] = row["plan_ms"]
    return columns


def summary_table(record):
    """One row per order at its default parameters (baselines also +S2): the simulated L2 hit of every
    workload, and HBM bytes, plan cost and model speedup on the first (the largest video) workload."""
    names = list(record["workloads"])
    summaries = {name: aggregate(record["workloads"][name]["results"]) for name in names}
    first = names[0]
    header = ("| order | Stage 2 | " + " | ".join(f"L2 hit {name}" for name in names) +
              f" | HBM read GB {first} | plan ms {first} | model speedup {first} |")
    lines = [header, "|" + "---|" * (len(names) + 5)]
    base = summaries[first][("original", "")]
    for (order, variant), entry in summaries[first].items():
        default = DEFAULT_VARIANT.get(order, "")
        if variant not in (default, (default + ",+S2").lstrip(",")):
            continue
        label = order + (" +S2" if "+S2" in variant else "") + (f" ({default})" if default else "")
        hits = " | ".join(f"{100 * summaries[name][(order, variant)]['l2_hit_ratio']:.1f}%" for name in names)
        lines.append(f"| {label} | {'yes' if entry['stage2'] else 'no'} | {hits} | "
                     f"{entry['hbm_read_bytes'] / 1e9:.1f} | {entry['plan_ms']:.0f} | "
                     f"{base['predicted_kernel_ms'] / entry['predicted_kernel_ms']:.3f} |")
    return "\n".join(lines)


def markdown(record, h200=None):
    h200 = h200 or {}
    measured = "H200 columns: bench/gpu/run_h200_orders.sh" if h200 else "H200 columns: pending measurement"
    lines = [f"Simulator (CPU) on the {record['gpu']} model, commit {record['commit']}, {record['date']}; plan cost "
             f"on {record['device']} (one thread per head, summed over the 4 heads). Seeded orders: mean over "
             "seeds. 'model' speedups are the skip model's predicted kernel time (docs/design.md), not "
             f"measurements; 'with plan' adds the CPU plan cost once per call. {measured} (kernel time, speedup "
             "over the original order without and with the plan's CPU cost on the H200 host, ncu L2 read hit, "
             "DRAM read bytes / (kernel time x 4.8 TB/s)).", "", "### Summary: default parameters", "",
             summary_table(record), ""]
    for name, case in record["workloads"].items():
        workload = case["workload"]
        lines += [f"### {name}: {workload['tokens']:,} tokens, {workload['q_blocks']} x {workload['kv_blocks']} "
                  f"blocks, {workload['heads']} heads, density {workload['density']:.3f}", "",
                  "| order | variant | Stage 2 | L2 hit (sim) | HBM read GB (sim) | mean wave K/V union | model ms | "
                  "model speedup | plan ms (CPU) | model speedup with plan | H200 ms | H200 speedup w/o / w/ plan "
                  "| L2 hit (ncu) | HBM SOL |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        summary = aggregate(case["results"])
        base = summary[("original", "")]
        base_ms = h200.get((name, "original"), {}).get("ms")
        for (order, variant), entry in summary.items():
            with_plan = base["predicted_kernel_ms"] / (entry["predicted_kernel_ms"] + entry["plan_ms"])
            gpu = h200.get((name, order), {}) if variant == DEFAULT_VARIANT.get(order, "") else {}
            cells = ["pending"] * 4
            if "ms" in gpu and base_ms:
                cells[0] = f"{gpu['ms']:.2f}"
                cells[1] = f"{base_ms / gpu['ms']:.3f} / " + (f"{base_ms / (gpu['ms'] + gpu['plan_ms']):.3f}"
                                                             if "plan_ms" in gpu else "n/a")
            if gpu.get("l2_hit") is not None:
                cells[2] = f"{gpu['l2_hit']:.1f}%"
            if gpu.get("dram_read_bytes") and gpu.get("gpu_ms"):
                cells[3] = f"{100 * gpu['dram_read_bytes'] / (gpu['gpu_ms'] * 1e-3) / HBM_BYTES_PER_S:.1f}%"
            lines.append(
                f"| {order} | {variant or '-'} | {'yes' if entry['stage2'] else 'no'} | "
                f"{100 * entry['l2_hit_ratio']:.1f}% | {entry['hbm_read_bytes'] / 1e9:.2f} | "
                f"{entry['mean_wave_kv_union']:.0f} | {entry['predicted_kernel_ms']:.2f} | "
                f"{base['predicted_kernel_ms'] / entry['predicted_kernel_ms']:.3f} | {entry['plan_ms']:.1f} | "
                f"{with_plan:.3f} | {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines)


def plot(record, path):
    """Two panels over every order (seeded ones: mean; r and k: the best variant; baselines pure and +S2):
    the simulated L2 hit ratio per workload, and the CPU plan cost per workload (log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(record["workloads"])
    per_workload = {}
    for name in names:
        best = {}
        for (order, variant), entry in aggregate(record["workloads"][name]["results"]).items():
            label = order + (" +S2" if "+S2" in variant else "")
            if label not in best or entry["l2_hit_ratio"] > best[label]["l2_hit_ratio"]:
                best[label] = entry
        per_workload[name] = best
    labels = list(per_workload[names[0]])
    figure, (hits, costs) = plt.subplots(1, 2, figsize=(13, 0.32 * len(labels) + 1.6), sharey=True)
    height = 0.8 / len(names)
    for w, name in enumerate(names):
        positions = [i + (w - (len(names) - 1) / 2) * height for i in range(len(labels))]
        hits.barh(positions, [100 * per_workload[name][label]["l2_hit_ratio"] for label in labels], height,
                  label=name)
        costs.barh(positions, [max(per_workload[name][label]["plan_ms"], 0.01) for label in labels], height,
                   label=name)
    hits.set_yticks(range(len(labels)), labels, fontsize=8)
    hits.invert_yaxis()
    hits.set_xlabel("simulated L2 hit ratio, % (H200 model)")
    hits.grid(True, axis="x", alpha=0.3)
    hits.legend(fontsize=7, loc="lower right")
    costs.set_xscale("log")
    costs.set_xlabel("plan cost, CPU ms (4 heads, one thread each)")
    costs.grid(True, axis="x", alpha=0.3)
    figure.suptitle("Row orders on the synthetic masks (best r / k per order; +S2: a Table II baseline followed "
                    "by Stage 2)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--workload-seed", type=int, default=1, help="seed of the synthetic masks (1: the H200 "
                        "benchmark's, bench/gpu/bench_attention.cu)")
    parser.add_argument("--mask", action="append", default=[], metavar="NAME=FILE.npy")
    parser.add_argument("--only", action="append", default=[], help="run only these workload names")
    parser.add_argument("--from-json", help="rewrite the table and the plot from a recorded JSON")
    parser.add_argument("--h200", metavar="LOG_DIR", help="fill the H200 columns from run_h200_orders.sh's logs")
    parser.add_argument("--out", default="bench/results/cpu-orders.json")
    parser.add_argument("--table", default="bench/results/cpu-orders.md")
    parser.add_argument("--plot", default="docs/reordering.png")
    args = parser.parse_args()

    if args.from_json:
        record = json.loads(pathlib.Path(args.from_json).read_text())
    else:
        binary = str(pathlib.Path(args.build) / "bench" / "wa_eval_orders")
        workloads = dict(SYNTHETIC)
        for item in args.mask:
            name, _, path = item.partition("=")
            if not path:
                parser.error(f"--mask expects NAME=FILE.npy, got {item!r}")
            workloads[name] = ["--mask", path]
        if args.only:
            workloads = {name: value for name, value in workloads.items() if name in args.only}
        record = result_record.make(
            result_record.cpu_model(), f"bench/cpu/eval_orders.py --seeds {args.seeds} --workload-seed "
            f"{args.workload_seed}", gpu="h200", workloads={})
        for name, workload_args in workloads.items():
            print(f"eval_orders: {name}", flush=True)
            record["workloads"][name] = run_eval(binary, workload_args, args.seeds, args.workload_seed)
        result_record.write(args.out, record)
    table = markdown(record, h200_columns(args.h200) if args.h200 else None)
    pathlib.Path(args.table).write_text(table + "\n")
    plot(record, args.plot)
    print(table)


if __name__ == "__main__":
    main()
