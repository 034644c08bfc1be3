#!/usr/bin/env python3
"""The side-by-side table of our kernel and FlashAttention-4 from bench/gpu/ncu_side_by_side.sh's logs
(docs/kernel.md, "Side by side under Nsight Compute"): per kernel the duration and SM clock, elapsed SM cycles,
executed warp instructions (in total and per 128 x 128 block), issue rate, the pipes' utilisation, active and
predicated-on threads per warp, the top stall reasons (warps stalled per issue), registers and shared memory per
CTA, grid, L2 hit rate and DRAM bytes (read and written).

    python3 bench/gpu/collect_side_by_side.py LOG_DIR [--json OUT.json [--device D] [--commit C] [--command X]]
                                              [--markdown] [--source]

Reads LOG_DIR/{ours-sparse,ours-dense,fa4}.csv (ncu's raw page; fa4.csv holds the sparse then the dense launch;
without ours-dense.csv, SIDE_DENSE=0, the sparse launches alone)
and LOG_DIR/side-cases.jsonl (the mask's nonzero block count). --source also reads LOG_DIR/{ours,fa4}-source.csv
(ncu's source page of the sparse launch, `SIDE_SOURCE=1 bench/gpu/ncu_side_by_side.sh`) and splits each
consumer loop at its landmarks (the S GEMM's first wgmma, the PV GEMM's first wgmma, the wait for S) into
phases, each with its instructions and SM cycles per consumer warp and KV block and its largest stall reasons.
--json writes the call's record in bench/result_record.py's schema (device: the profiled GPU, else --device;
commit: --commit, else the checkout's HEAD). bench/results/h200-kernel-side-by-side.json holds the WaveAlign-order
call and, under "original_order", the SIDE_ORDER=original one.
"""
import argparse
import collections
import csv
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

BLOCK = 128
PIPES = ("tensor_op_gmma", "fma", "alu", "fmaheavy", "xu", "lsu", "uniform", "adu", "cbu")


def kernels(path: pathlib.Path) -> list[dict]:
    """The profiled kernels of one raw-page CSV, each as {metric: (value, unit)}."""
    rows = list(csv.reader(line for line in path.read_text().splitlines() if line.startswith('"')))
    if len(rows) < 3:
        raise SystemExit(f"collect_side_by_side: {path} holds no profiled kernel")
    header, units = rows[0], rows[1]
    return [{name: (value, unit) for name, unit, value in zip(header, units, row)} for row in rows[2:]]


# The units the raw page gives the metrics read with a scale (ncu 2025.3); another unit is an error, not a
# silently mis-scaled number.
UNITS = {"gpu__time_duration.sum": "ns", "sm__cycles_elapsed.avg.per_second": "hz",
         "dram__bytes.sum.per_second": "byte/s", "sm__cycles_active.avg": "cycle",
         "launch__shared_mem_per_block_dynamic": "byte/block", "launch__shared_mem_per_block_static": "byte/block"}


def number(kernel: dict, metric: str) -> float:
    text, unit = kernel[metric]
    if metric in UNITS and unit != UNITS[metric]:
        raise SystemExit(f"collect_side_by_side: {metric} is in '{unit}', expected '{UNITS[metric]}'")
    return float(text.split(" (")[0].replace(",", ""))


def summary(kernel: dict, blocks: int) -> dict:
    duration_ms = number(kernel, "gpu__time_duration.sum") / 1e6  # ns
    clock = number(kernel, "sm__cycles_elapsed.avg.per_second")
    cycles = duration_ms / 1e3 * clock  # the raw page has the elapsed cycles only as a rate
    instructions = number(kernel, "smsp__inst_executed.sum")
    stalls = {name.split("issue_stalled_")[1].split("_per_issue")[0]: number(kernel, name)
              for name in kernel if name.startswith("smsp__average_warps_issue_stalled_")
              and name.endswith("_per_issue_active.ratio")}
    return {
        "kernel": kernel["Kernel Name"][0][:90],
        "duration_ms": duration_ms,
        "sm_clock_ghz": clock / 1e9,
        "sm_cycles_m": cycles / 1e6,
        "sm_cycles_per_block": cycles * number(kernel, "device__attribute_multiprocessor_count") / blocks,
        "sm_cycles_active_pct": 100 * number(kernel, "sm__cycles_active.avg") / cycles,
        "warp_instructions_g": instructions / 1e9,
        "warp_instructions_per_block": instructions / blocks,
        "ipc_issued": number(kernel, "sm__inst_issued.avg.per_cycle_active"),
        "issue_slots_busy_pct": number(kernel, "sm__issue_active.avg.pct_of_peak_sustained_elapsed"),
        "sm_busy_pct": number(kernel, "sm__instruction_throughput.avg.pct_of_peak_sustained_elapsed"),
        "pipes_pct_of_peak_active": {pipe: number(kernel, f"sm__inst_executed_pipe_{pipe}.avg.pct_of_peak_sustained_active")
                                     for pipe in PIPES if f"sm__inst_executed_pipe_{pipe}.avg.pct_of_peak_sustained_active" in kernel},
        "threads_per_warp_active": number(kernel, "smsp__thread_inst_executed_per_inst_executed.ratio"),
        "threads_per_warp_pred_on": number(kernel, "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio"),
        "top_stalls_per_issue": dict(sorted(stalls.items(), key=lambda item: -item[1])[:6]),
        "registers_per_thread": number(kernel, "launch__registers_per_thread"),
        "shared_kb_per_cta": (number(kernel, "launch__shared_mem_per_block_dynamic")
                              + number(kernel, "launch__shared_mem_per_block_static")) / 1024,
        "threads_per_cta": number(kernel, "launch__block_size"),
        "grid": number(kernel, "launch__grid_size"),
        "l2_hit_pct": number(kernel, "lts__t_sector_hit_rate.pct"),
        "dram_gb": number(kernel, "dram__bytes.sum.per_second") * duration_ms / 1e12,  # read + written
        "dram_throughput_pct": number(kernel, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
        "tflops": 4.0 * BLOCK * BLOCK * 128 * blocks / (duration_ms * 1e9),
    }


CONSUMER_WARPS = 8  # per CTA in both kernels: two consumer warpgroups
PHASES = ("loop head to the S GEMM (K/V waits)", "S GEMM issue", "PV GEMM issue", "wait for S",
          "softmax to the loop's end")
# Stall samples that ncu's source page gives no reason column for: at a warpgroup's first wgmma of a batch,
# the wait until the tensor core takes it (the other warpgroup's GEMMs still run).
UNNAMED = "wgmma issue (no named reason)"


def source_rows(path: pathlib.Path) -> tuple[list, list]:
    """(header, rows) of ncu's source page in SASS: the row of column names starts with 'Address'."""
    rows = [row for row in csv.reader(path.read_text().splitlines()) if row]
    start = next((i for i, row in enumerate(rows) if row[0] == "Address"), None)
    if start is None:
        raise SystemExit(f"collect_side_by_side: {path} holds no source page (no 'Address' column)")
    header = rows[start]
    return header, [dict(zip(header, row)) for row in rows[start + 1:] if len(row) == len(header)]


def plain(text: str) -> float:
    text = text.replace(",", "").strip()
    return float(text) if text else 0.0


def source_phases(path: pathlib.Path, blocks: int, cycles_per_block: float) -> dict:
    """The consumer loop of one source page in phases. The loop is every instruction executed once per consumer
    warp and block (at least half of 8 per block; the per-row and producer code runs far less often); its
    landmarks, in address order: the first wgmma with a zero accumulator (S = Q K^T starts), the first wgmma
    reading a transposed B operand (V: the PV GEMM starts), the `WARPGROUP.DEPBAR.LE gsb0, 0x1` that waits for
    S. A consumer warp spends the SM's cycles per block in the loop, so a phase's cycles are that many times
    its share of the loop's stall samples."""
    header, rows = source_rows(path)
    reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    loop = [row for row in rows if plain(row["Instructions Executed"]) >= 0.5 * CONSUMER_WARPS * blocks]
    if not loop:
        raise SystemExit(f"collect_side_by_side: {path}: no instruction runs once per consumer warp and block")
    text = [row["Source"].strip() for row in loop]
    def first(predicate, what):
        index = next((i for i, t in enumerate(text) if predicate(t)), None)
        if index is None:
            raise SystemExit(f"collect_side_by_side: {path}: the loop has no {what}")
        return index
    s_start = first(lambda t: t.startswith("HGMMA") and ", RZ" in t, "wgmma with a zero accumulator")
    pv_start = first(lambda t: t.startswith("HGMMA") and "tnspB" in t, "wgmma with a transposed B")
    s_wait = first(lambda t: t.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x1"), "wait for S (DEPBAR.LE gsb0, 0x1)")
    if not s_start < pv_start < s_wait:
        raise SystemExit(f"collect_side_by_side: {path}: landmarks out of order ({s_start}, {pv_start}, {s_wait})")
    bounds = (0, s_start, pv_start, s_wait, s_wait + 1, len(loop))
    samples = [plain(row["Warp Stall Sampling (All Samples)"]) for row in loop]
    cycles_per_sample = cycles_per_block / sum(samples)
    phases = []
    for name, lo, hi in zip(PHASES, bounds, bounds[1:]):
        by_reason = collections.Counter()
        for row, total in zip(loop[lo:hi], samples[lo:hi]):
            named = {reason[6:]: plain(row[reason]) for reason in reasons}
            by_reason.update(named)
            by_reason[UNNAMED] += max(0.0, total - sum(named.values()))
        phases.append({
            "phase": name,
            "instructions_per_warp": sum(plain(row["Instructions Executed"]) for row in loop[lo:hi])
                                     / (CONSUMER_WARPS * blocks),
            "cycles_per_warp": sum(samples[lo:hi]) * cycles_per_sample,
            "top_reasons_cycles": {reason: value * cycles_per_sample
                                   for reason, value in by_reason.most_common(4) if value > 0}})
    yields = [t for t in text if re.match(r"(@!?U?P\w+\s+)?(YIELD|BSSY|BSYNC|WARPSYNC)", t)]
    return {"loop_instructions": len(loop), "cycles_per_block": cycles_per_block, "phases": phases,
            "reconvergence_in_loop": dict(collections.Counter(t.split()[0] for t in yields))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--device", help="the GPU, when ncu's page does not name it")
    parser.add_argument("--commit", help="the commit the profiled binaries were built from (default: HEAD)")
    parser.add_argument("--command", help="the command of the profile (default: ncu_side_by_side.sh LOG)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--source", action="store_true", help="also the consumer loops' phases from the source pages")
    args = parser.parse_args()
    case = json.loads((args.logs / "side-cases.jsonl").read_text().splitlines()[0])
    sparse_blocks = int(case["nnz_blocks"])
    heads, q_blocks, kv_blocks = case["shape"]
    dense_blocks = heads * q_blocks * kv_blocks
    fa4 = kernels(args.logs / "fa4.csv")
    with_dense = (args.logs / "ours-dense.csv").exists()  # SIDE_DENSE=0 profiles the sparse launches only
    if len(fa4) != 1 + with_dense:
        raise SystemExit(f"collect_side_by_side: fa4.csv holds {len(fa4)} kernels, expected "
                         + ("the sparse and the dense" if with_dense else "the sparse one (no ours-dense.csv)"))
    table = {
        "ours sparse": summary(kernels(args.logs / "ours-sparse.csv")[0], sparse_blocks),
        "FA4 sparse": summary(fa4[0], sparse_blocks),
    }
    if with_dense:
        table["ours dense"] = summary(kernels(args.logs / "ours-dense.csv")[0], dense_blocks)
        table["FA4 dense"] = summary(fa4[1], dense_blocks)
    result = {"case": case, "kernels": table}
    if args.source:
        result["source_phases"] = {
            name: source_phases(args.logs / f"{file}-source.csv", sparse_blocks, table[f"{name} sparse"]["sm_cycles_per_block"])
            for name, file in (("ours", "ours"), ("FA4", "fa4"))}
        for name, loop in result["source_phases"].items():
            print(f"{name}: {loop['loop_instructions']} loop instructions, {loop['cycles_per_block']:,.0f} SM cycles per "
                  f"block; in the loop: {loop['reconvergence_in_loop'] or 'no YIELD/BSSY/BSYNC/WARPSYNC'}")
        print("| phase | " + " | ".join(f"{n}: instructions / cycles per warp and block (largest stalls)"
                                        for n in result["source_phases"]) + " |")
        print("|---" * (1 + len(result["source_phases"])) + "|")
        for i, phase in enumerate(PHASES):
            cells = []
            for loop in result["source_phases"].values():
                entry = loop["phases"][i]
                top = ", ".join(f"{r} {c:.0f}" for r, c in list(entry["top_reasons_cycles"].items())[:3])
                cells.append(f"{entry['instructions_per_warp']:.0f} / {entry['cycles_per_warp']:.0f} ({top})")
            print(f"| {phase} | " + " | ".join(cells) + " |")
    if args.json:
        named = fa4[0].get("device__attribute_display_name", (None,))[0]
        result_record.write(args.json, result_record.make(
            named or args.device or "unknown",
            args.command or "bench/gpu/ncu_side_by_side.sh BUILD LOG; bench/gpu/collect_side_by_side.py LOG --json OUT",
            commit=args.commit, **result))
    if args.markdown:
        names = list(table)
        def line(label, fmt):
            return f"| {label} | " + " | ".join(fmt(table[name]) for name in names) + " |"
        out = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
               line("duration / SM clock", lambda k: f"{k['duration_ms']:.1f} ms / {k['sm_clock_ghz']:.3f} GHz"),
               line("TF/s (one profiled launch)", lambda k: f"{k['tflops']:.0f}"),
               line("elapsed SM cycles", lambda k: f"{k['sm_cycles_m']:.1f} M"),
               line("SM cycles per 128 x 128 block", lambda k: f"{k['sm_cycles_per_block']:,.0f}"),
               line("executed warp instructions", lambda k: f"{k['warp_instructions_g']:.2f} G"),
               line("per 128 x 128 block", lambda k: f"{k['warp_instructions_per_block']:,.0f}"),
               line("issued IPC / issue slots busy", lambda k: f"{k['ipc_issued']:.2f} / {k['issue_slots_busy_pct']:.1f} %"),
               line("SM busy", lambda k: f"{k['sm_busy_pct']:.1f} %")]
        for pipe in PIPES:
            if all(pipe in table[name]["pipes_pct_of_peak_active"] for name in names):
                out.append(line(f"pipe {pipe} (% of peak, active)", lambda k, p=pipe: f"{k['pipes_pct_of_peak_active'][p]:.1f}"))
        out += [line("threads per warp: active / predicated on",
                     lambda k: f"{k['threads_per_warp_active']:.2f} / {k['threads_per_warp_pred_on']:.2f}"),
                line("top stalls (warps per issue)", lambda k: ", ".join(f"{n} {v:.2f}" for n, v in list(k['top_stalls_per_issue'].items())[:4])),
                line("registers / shared memory per CTA", lambda k: f"{k['registers_per_thread']:.0f} / {k['shared_kb_per_cta']:.0f} KB"),
                line("threads per CTA / grid", lambda k: f"{k['threads_per_cta']:.0f} / {k['grid']:,.0f}"),
                line("L2 hit / DRAM bytes / DRAM throughput", lambda k: f"{k['l2_hit_pct']:.1f} % / {k['dram_gb']:.2f} GB / {k['dram_throughput_pct']:.1f} %")]
        print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
