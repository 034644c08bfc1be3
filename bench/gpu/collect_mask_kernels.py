#!/usr/bin/env python3
"""Tables from bench/gpu/ncu_mask_kernels.sh: the mask's time per kernel (every launch's duration summed by
kernel, template arguments kept, so FlexPrefill's two fused passes stay apart); for the kernels profiled in
detail, duration, SM and memory throughput, occupancy, registers, shared memory and the top stall reasons; and
from the source page (one kernel, per SASS instruction) the executed warp instructions by opcode and the
instructions with the most stall samples.

Usage: bench/gpu/collect_mask_kernels.py LOG_DIR [--json OUT]
"""
import argparse
import collections
import csv
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from collect_side_by_side import kernels, number, source_rows  # noqa: E402  (ncu's pages, one reader each)

TIME_SCALE_TO_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
                    "s": 1e9, "second": 1e9}


def short_name(demangled: str) -> str:
    """'ns::<unnamed>::fused_tile_kernel<__nv_bfloat16, 128, false>(Params)' -> 'fused_tile_kernel<__nv_bfloat16,
    128, false>': the name without its namespaces and parameter list (ncu's '<unnamed>' and CUPTI's '(anonymous
    namespace)' alike)."""
    demangled = demangled.replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
    depth, cut = 0, len(demangled)
    for i, ch in enumerate(demangled):  # the parameter list is the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = demangled[:cut]
    template = name.find("<")
    head, tail = (name[:template], name[template:]) if template >= 0 else (name, "")
    return head.split()[-1].split("::")[-1] + tail  # without a return type ('void ') and namespaces


def launch_times(path: pathlib.Path) -> dict:
    """{kernel: (total ns, launches)} from the default CSV page of `ncu --metrics gpu__time_duration.sum`."""
    rows = list(csv.reader(line for line in path.read_text().splitlines() if line.startswith('"')))
    if len(rows) < 2:
        raise SystemExit(f"collect_mask_kernels: {path} holds no launch")
    header = rows[0]
    name_at, metric_at, unit_at, value_at = (header.index(k) for k in
                                             ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
    totals = collections.OrderedDict()
    for row in rows[1:]:
        if row[metric_at] != "gpu__time_duration.sum":
            continue
        unit = row[unit_at]
        if unit not in TIME_SCALE_TO_NS:
            raise SystemExit(f"collect_mask_kernels: gpu__time_duration.sum in '{unit}', expected a time unit")
        ns = float(row[value_at].replace(",", "")) * TIME_SCALE_TO_NS[unit]
        name = short_name(row[name_at])
        total, count = totals.get(name, (0.0, 0))
        totals[name] = (total + ns, count + 1)
    return totals


STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
OPTIONAL = {  # label: metric (reported when the page has it)
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue_active_pct": "sm__issue_active.avg.pct_of_peak_sustained_elapsed",
    "tensor_pipe_pct": "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
    "registers": "launch__registers_per_thread",
    "dynamic_shared_bytes": "launch__shared_mem_per_block_dynamic",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
}


def detail(kernel: dict) -> dict:
    out = {"kernel": short_name(kernel["Kernel Name"][0]),
           "duration_us": number(kernel, "gpu__time_duration.sum") / 1e3}
    for label, metric in OPTIONAL.items():
        if metric in kernel:
            out[label] = number(kernel, metric)
    stalls = {STALL.match(name).group(1): number(kernel, name) for name in kernel if STALL.match(name)}
    out["top_stalls"] = dict(sorted(stalls.items(), key=lambda item: -item[1])[:5])
    return out


def column(header: list, *words: str) -> int:
    """The first column whose name holds every word (the source page's names vary between ncu versions)."""
    for index, name in enumerate(header):
        if all(word.lower() in name.lower() for word in words):
            return index
    raise SystemExit(f"collect_mask_kernels: the source page has no column with {' '.join(words)!r}")


def source_summary(path: pathlib.Path, top: int = 15) -> dict:
    """Executed warp instructions by opcode (predicates and modifiers dropped) and the `top` instructions by
    stall samples, from ncu's source page in SASS."""
    header, records = source_rows(path)  # ncu puts a "Kernel Name" row above the column names
    rows = [[record.get(name, "") for name in header] for record in records]
    source, executed = column(header, "source"), column(header, "instructions executed")
    try:
        stalls = column(header, "warp stall sampling", "all")
    except SystemExit:
        stalls = None
    by_opcode, lines = collections.Counter(), []
    for row in rows:
        text = row[source].strip()
        if not text or not row[executed].replace(",", "").strip().isdigit():
            continue
        opcode = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
        count = int(row[executed].replace(",", ""))
        by_opcode[opcode] += count
        samples = int(row[stalls].replace(",", "") or 0) if stalls is not None else 0
        lines.append((samples, count, text))
    total = sum(by_opcode.values())
    return {"executed": total, "by_opcode": dict(by_opcode.most_common()),
            "top_stalled": [{"samples": s, "executed": c, "sass": t}
                            for s, c, t in sorted(lines, key=lambda line: -line[0])[:top] if s > 0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path, help="write both tables here")
    args = parser.parse_args()
    times = launch_times(args.logs / "times.csv")
    total = sum(ns for ns, _ in times.values())
    print(f"mask: {total / 1e6:.2f} ms in {sum(n for _, n in times.values())} launches")
    print("| kernel | launches | ms | share |\n| --- | --- | --- | --- |")
    by_kernel = []
    for name, (ns, count) in sorted(times.items(), key=lambda item: -item[1][0]):
        by_kernel.append({"kernel": name, "launches": count, "ms": ns / 1e6, "share": ns / total})
        print(f"| {name} | {count} | {ns / 1e6:.3f} | {100 * ns / total:.1f} % |")
    details = []
    detail_path = args.logs / "detail.csv"
    if detail_path.exists():
        details = [detail(kernel) for kernel in kernels(detail_path)]
        for item in details:
            stalls = ", ".join(f"{name} {value:.2f}" for name, value in item["top_stalls"].items())
            rest = ", ".join(f"{k} {v:g}" for k, v in item.items() if k not in ("kernel", "top_stalls"))
            print(f"{item['kernel']}: {rest}; stalls per issue: {stalls}")
    source = None
    source_path = args.logs / "source.csv"
    if source_path.exists():
        source = source_summary(source_path)
        mix = ", ".join(f"{op} {100 * n / source['executed']:.1f} %" for op, n in list(source["by_opcode"].items())[:12])
        print(f"source page: {source['executed']:,} warp instructions executed; {mix}")
        for line in source["top_stalled"]:
            print(f"  {line['samples']:>8} samples  {line['executed']:>12,}  {line['sass']}")
    if args.json:
        args.json.write_text(json.dumps({"total_ms": total / 1e6, "kernels": by_kernel, "details": details,
                                         "source": source}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
