#!/usr/bin/env python3
"""Merges the logs of bench/gpu/run_h200_attention.sh into bench/results/h200-attention.json and prints the
tables of docs/performance.md and docs/simulator.md (the simulator's prediction for each profiled schedule is
computed here with the CLI, on the identical mask and plan), and our kernel against FlashAttention-4 on the same
masks (issue targets: WaveAlign order >= 1.05x FA4's best plug-in order, original >= 1.05x FA4's original,
dense >= 1.03x FA4 dense).

Usage: bench/gpu/collect_attention.py LOG_DIR [--wavealign build/wavealign] [--out bench/results/h200-attention.json]

The record is this call's (bench/result_record.py's schema). The FlexAttention and SDPA rows and the ncu
figures come from the script's peers and ncu parts; a call without them (kernel,fa4, say) keeps the previous
record's call that had them, whole, under "flexattention_sdpa_ncu", so those numbers stay next to our kernel's
rows of the same call.
"""
import argparse
import csv
import io
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

FRAMES = {363600: 401, 147600: 161}
PEERS = "flexattention_sdpa_ncu"
PEER_IMPLS = ("flexattention", "flexattention-tuned", "sdpa")
DENSITY = {"video": 0.28, "random": 0.20}
CLOCK_FIELDS = ("sm_clock_mhz", "power_w", "power_capped")


def read_jsonl(path):
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def read_ncu(path, key_fields=("frames", "mask", "order")):
    """{(frames, mask, order): {metric: value}} from the '# case' headers and ncu's CSV blocks (the key: the
    header's `key_fields`, frames as an int)."""
    results, key, block = {}, None, []

    def flush():
        if key and block:
            for row in csv.DictReader(io.StringIO("".join(block))):
                value = row["Metric Value"].replace(",", "")
                unit = row.get("Metric Unit", "")
                scale = {"Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9,
                         "usecond": 1e-3, "msecond": 1.0, "nsecond": 1e-6, "second": 1e3, "us": 1e-3, "ms": 1.0,
                         "ns": 1e-6, "s": 1e3}.get(unit, 1.0)
                results.setdefault(key, {})[row["Metric Name"]] = float(value) * scale
    if not path.exists():
        return results
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("# case"):
            flush()
            fields = dict(part.split("=") for part in line[len("# case"):].split())
            key = tuple(int(fields[name]) if name == "frames" else fields[name] for name in key_fields)
            block = []
        elif line.startswith('"ID"') or (block and line.startswith('"')):
            block.append(line)
    flush()
    return results


def simulate(binary, frames, mask, orders):
    command = [binary, "simulate", "--model", "wan2.1-14b", "--frames", str(frames), "--heads", "4", "--mask", mask,
               "--density", str(DENSITY[mask]), "--seed", "1", "--gpu", "h200", "--orders", ",".join(orders), "--json"]
    out = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return {row["order"]: row for row in out["results"]}


def tflops_of(cases, case, impl, orders, heads=4):
    """(TF/s, order) of the fastest of `orders` that `impl` ran on `case`, or None."""
    rows = [c for c in cases if c["case"] == case and c["impl"] == impl and c["heads"] == heads and
            c["order"] in orders]
    best = max(rows, key=lambda c: c["tflops"], default=None)
    return (best["tflops"], best["order"]) if best else None


def print_fa4_comparison(cases):
    """Our kernel against FlashAttention-4 (impl "flashattention4") on each case both ran, with the goals."""
    names = sorted({c["case"] for c in cases if c["impl"] == "flashattention4"})
    if not names:
        return
    print("\n| case | ours | FA4 | ours / FA4 | goal |")
    print("|---|---|---|---|---|")
    comparisons = (("WaveAlign vs FA4's best plug-in order", ("wavealign",), ("wavealign", "s2"), 1.05),
                   ("original vs original", ("original",), ("original",), 1.05),
                   ("dense vs dense", ("dense",), ("dense",), 1.03))
    for name in names:
        for label, ours_orders, fa4_orders, goal in comparisons:
            ours = tflops_of(cases, name, "wavealign-kernel", ours_orders)
            theirs = tflops_of(cases, name, "flashattention4", fa4_orders)
            if ours and theirs:
                ratio = ours[0] / theirs[0]
                print(f"| {name} {label} | {ours[0]:.0f} ({ours[1]}) | {theirs[0]:.0f} ({theirs[1]}) | "
                      f"{ratio:.3f}x | >= {goal:.2f}x {'met' if ratio >= goal else 'missed'} |")


def has_peers_or_ncu(record: dict) -> bool:
    return any(case["impl"] in PEER_IMPLS or case.get("l2_hit_ratio") is not None for case in record["cases"])


def with_peers(record: dict, previous: dict | None) -> dict:
    """`record`, and when it holds no FlexAttention, SDPA or ncu figures, the latest earlier call that did
    (the previous record itself, or the one it kept) under PEERS."""
    if has_peers_or_ncu(record) or not previous:
        return record
    if has_peers_or_ncu(previous):
        return {**record, PEERS: {key: value for key, value in previous.items() if key != PEERS}}
    return {**record, PEERS: previous[PEERS]} if PEERS in previous else record


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs")
    parser.add_argument("--wavealign", default="build/wavealign")
    parser.add_argument("--out", default="bench/results/h200-attention.json")
    parser.add_argument("--date", default=None, help="the day of the measurement (default: today)")
    args = parser.parse_args()
    logs = pathlib.Path(args.logs)
    kernel = read_jsonl(logs / "kernel.jsonl")
    peers = read_jsonl(logs / "peers.jsonl")
    ncu = read_ncu(logs / "ncu.csv")
    gpu = (logs / "gpu.txt").read_text().splitlines()[1] if (logs / "gpu.txt").exists() else "H200"

    cases = []
    for row in kernel + [r for r in peers if "impl" in r]:
        frames = FRAMES.get(row["tokens"])
        name = f"wan2.1-14b-{frames}f-{row['mask']}" if frames else f"L{row['tokens']}-{row['mask']}"
        metrics = ncu.get((frames, row["mask"], row["order"])) if row["impl"] == "wavealign-kernel" and \
            row["heads"] == 4 and row["mode"] == "sparse" else None
        cases.append({"case": name, "tokens": row["tokens"], "heads": row["heads"], "density": row["density"],
                      "impl": row["impl"], "mode": row["mode"], "order": row["order"], "ms": row["ms"],
                      "tflops": row["tflops"],
                      "l2_hit_ratio": metrics["lts__t_sector_hit_rate.pct"] / 100 if metrics else None,
                      "dram_read_bytes": metrics["dram__bytes_read.sum"] if metrics else None,
                      # The H200 runs these kernels at its 700 W power cap (SM clock 1490-1650 MHz, 1980 at
                      # boost): the clock of the timed runs says which state a number was measured in. Logs
                      # from before the clock was recorded give null.
                      **{field: row.get(field) for field in CLOCK_FIELDS}})
    record = result_record.make(
        gpu, "bench/gpu/run_h200_attention.sh BUILD LOG_DIR PARTS; bench/gpu/collect_attention.py LOG_DIR",
        date=args.date, cases=cases, checks=[r for r in peers if "check" in r],
        skipped=[r for r in peers if "skipped" in r])
    out = pathlib.Path(args.out)
    result_record.write(out, with_peers(record, json.loads(out.read_text()) if out.exists() else None))

    # TF/s per GHz of the SM clock: the work done per cycle, which the power cap does not move.
    print("| case | impl | order | ms | TF/s | SM MHz | TF/s per GHz | vs original | L2 hit | DRAM read GB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        base = next((c for c in cases if c["case"] == case["case"] and c["impl"] == case["impl"] and
                     c["heads"] == case["heads"] and c["order"] == "original"), None)
        speedup = f"{base['ms'] / case['ms']:.2f}x" if base and case["mode"] == "sparse" else ""
        hit = f"{100 * case['l2_hit_ratio']:.1f}%" if case["l2_hit_ratio"] is not None else ""
        dram = f"{case['dram_read_bytes'] / 1e9:.1f}" if case["dram_read_bytes"] is not None else ""
        clock = f"{case['sm_clock_mhz']:.0f}" if case["sm_clock_mhz"] is not None else ""
        per_ghz = f"{case['tflops'] / case['sm_clock_mhz'] * 1e3:.0f}" if case["sm_clock_mhz"] else ""
        print(f"| {case['case']} H={case['heads']} | {case['impl']} | {case['order']} | {case['ms']:.2f} | "
              f"{case['tflops']:.0f} | {clock} | {per_ghz} | {speedup} | {hit} | {dram} |")

    print_fa4_comparison(cases)

    print("\n| frames | mask | order | ncu L2 hit | simulated L2 hit | difference (points) | ncu DRAM read GB | simulated HBM read GB |")
    print("|---|---|---|---|---|---|---|---|")
    for frames in (401, 161):
        for mask in ("video", "random"):
            orders = [o for o in ("original", "s1", "s2", "wavealign", "shuffled") if (frames, mask, o) in ncu]
            if not orders:
                continue
            predicted = simulate(args.wavealign, frames, mask, orders)
            for order in orders:
                measured = ncu[(frames, mask, order)]
                sim = predicted[order]
                print(f"| {frames} | {mask} | {order} | {measured['lts__t_sector_hit_rate.pct']:.1f}% | "
                      f"{100 * sim['l2_hit_ratio']:.1f}% | "
                      f"{100 * sim['l2_hit_ratio'] - measured['lts__t_sector_hit_rate.pct']:+.1f} | "
                      f"{measured['dram__bytes_read.sum'] / 1e9:.1f} | {sim['hbm_read_bytes'] / 1e9:.1f} |")


if __name__ == "__main__":
    main()
