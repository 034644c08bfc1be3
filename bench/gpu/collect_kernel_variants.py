#!/usr/bin/env python3
"""Summarizes the logs of bench/gpu/run_kernel_variants.sh: median TF/s (and SM clock) per variant and case
over the timing rounds (wa_bench_attention --variants lines in variants.jsonl), the Nsight Compute counts per
128 x 128 block (warp instructions, active and not-predicated-off threads per warp, SM cycles), and
LOG_DIR/run.json, the record for bench/results/h200-kernel-variants.json.

Usage: bench/gpu/collect_kernel_variants.py LOG_DIR [--commit HASH] [--sms 132]
"""
import argparse
import csv
import datetime
import io
import json
import pathlib
import statistics

NCU_METRICS = {
    "smsp__inst_executed.sum": "instructions",
    "smsp__thread_inst_executed_per_inst_executed.ratio": "active_threads",
    "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio": "predicated_on_threads",
    "sm__cycles_elapsed.avg": "sm_cycles",
}
CASE_FIELDS = ("variant", "round", "mode", "mask", "order", "tokens", "heads", "head_dim", "block", "density", "ms",
               "tflops", "sm_clock_mhz", "power_w", "power_capped")
COMMAND = ("bench/gpu/run_kernel_variants.sh: wa_bench_attention {--model wan2.1-14b --frames 401 --heads 4 "
           "{--mask video --density 0.28 --order wavealign | --mask random --density 0.2 --order wavealign | --dense | "
           "--mask video --density 0.28 --order original} | --heads 8 --tokens 32768 --dense {--head-dim 64 | "
           "--block 64}} --variants {variants} --rounds 2 --cold-l2 --warmup 1 --warmup-ms 2000 --iters 5 --json; "
           "one build with -DWA_BUILD_KERNEL_VARIANTS=ON, one machine")


def command_of(runs):
    """COMMAND with the variants the runs hold, in first-seen order."""
    return COMMAND.replace("{variants}", ",".join(dict.fromkeys(r["variant"] for r in runs)))


def case_of(run):
    """'dense' or 'MASK DENSITY ORDER', plus the head_dim, block and length where they are not the main
    case's (d = 128, 128 x 128, 363,600 tokens)."""
    label = "dense" if run["mode"] == "dense" else f"{run['mask']} {run['density']:.2f} {run['order']}"
    if run.get("head_dim", 128) != 128:
        label += f" d{run['head_dim']}"
    if run.get("block", 128) != 128:
        label += f" {run['block']}x{run['block']}"
    if run.get("tokens", 363600) != 363600:
        label += f" L{run['tokens']}"
    return label


def read_runs(logs):
    path = logs / "variants.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def timing_table(runs):
    """{variant: {case: (median TF/s, median SM clock or None, runs)}} in first-seen order."""
    table = {}
    for run in runs:
        table.setdefault(run["variant"], {}).setdefault(case_of(run), []).append(run)
    out = {}
    for variant, by_case in table.items():
        out[variant] = {}
        for case, sel in by_case.items():
            clocks = [r["sm_clock_mhz"] for r in sel if r.get("sm_clock_mhz") is not None]
            out[variant][case] = (statistics.median(r["tflops"] for r in sel),
                                  statistics.median(clocks) if clocks else None, len(sel))
    return out


# Reported when the profile has them (the 363,600-token dense case): L2 hit rate and DRAM bytes read.
NCU_MEMORY = {"lts__t_sector_hit_rate.pct": "l2_hit_pct", "dram__bytes_read.sum": "dram_read_gb"}
BYTES_PER_UNIT = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}


def read_ncu(path, sms):
    """[(case label, {instructions, active_threads, predicated_on_threads, sm_cycles} per block)] of one
    ncu_<variant>.txt: '# case LABEL' lines, the benchmark's JSON line (for nnz_blocks), ncu's CSV rows."""
    cases, label, nnz, metric = [], None, None, {}

    def flush():
        if label is not None and nnz and all(name in metric for name in NCU_METRICS):
            values = {NCU_METRICS[name]: metric[name] for name in NCU_METRICS}
            entry = {"instructions_per_block": values["instructions"] / nnz,
                     "active_threads": values["active_threads"],
                     "predicated_on_threads": values["predicated_on_threads"],
                     "sm_cycles_per_block": values["sm_cycles"] * sms / nnz}
            entry.update({NCU_MEMORY[name]: metric[name] for name in NCU_MEMORY if name in metric})
            cases.append((label, entry))

    for line in path.read_text().splitlines():
        if line.startswith("# case "):
            flush()
            label, nnz, metric = line[len("# case "):], None, {}
        elif line.startswith("{"):
            nnz = json.loads(line).get("nnz_blocks")
        elif line.startswith('"'):
            row = next(csv.reader(io.StringIO(line)))
            if len(row) >= 3 and row[-3] in NCU_METRICS:
                metric[row[-3]] = float(row[-1].replace(",", ""))
            elif len(row) >= 3 and row[-3] == "dram__bytes_read.sum":
                if row[-2] not in BYTES_PER_UNIT:
                    raise SystemExit(f"collect_kernel_variants: dram__bytes_read.sum in '{row[-2]}', expected bytes")
                metric[row[-3]] = float(row[-1].replace(",", "")) * BYTES_PER_UNIT[row[-2]] / 1e9
            elif len(row) >= 3 and row[-3] == "lts__t_sector_hit_rate.pct":
                metric[row[-3]] = float(row[-1].replace(",", ""))
    flush()
    return cases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", type=pathlib.Path)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--sms", type=int, default=132, help="SMs of the GPU (cycles per block per SM)")
    args = parser.parse_args(argv)
    runs = read_runs(args.logs)
    table = timing_table(runs)
    cases = list(dict.fromkeys(case_of(r) for r in runs))
    print("median TF/s over the rounds (median SM clock, MHz; runs)")
    print(f"{'variant':26s}" + "".join(f"{c:>28s}" for c in cases))
    for variant, by_case in table.items():
        cells = []
        for case in cases:
            if case not in by_case:
                cells.append(f"{'-':>28s}")
                continue
            tflops, clock, count = by_case[case]
            clock_text = f" ({clock:.0f})" if clock is not None else ""
            cells.append(f"{f'{tflops:.1f}{clock_text} x{count}':>28s}")
        print(f"{variant:26s}" + "".join(cells))
    print("\nncu, one launch each: warp instructions per 128 x 128 block, active / not-predicated-off threads per"
          " warp, SM cycles per block")
    for variant in table:
        path = args.logs / f"ncu_{variant}.txt"
        if not path.exists():
            continue
        for label, v in read_ncu(path, args.sms):
            memory = (f"  L2 hit {v['l2_hit_pct']:.1f} %, DRAM read {v['dram_read_gb']:.1f} GB"
                      if "l2_hit_pct" in v and "dram_read_gb" in v else "")
            print(f"{variant:26s} {label:28s} {v['instructions_per_block']:8.0f} {v['active_threads']:6.2f} / "
                  f"{v['predicated_on_threads']:5.2f} {v['sm_cycles_per_block']:8.0f}{memory}")
    run = {"device": "NVIDIA H200", "commit": args.commit, "date": datetime.date.today().isoformat(),
           "command": command_of(runs), "cases": [{k: r.get(k) for k in CASE_FIELDS} for r in runs]}
    (args.logs / "run.json").write_text(json.dumps(run, indent=1) + "\n")


if __name__ == "__main__":
    main()
