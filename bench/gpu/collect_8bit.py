#!/usr/bin/env python3
"""Merges the logs of bench/gpu/run_h200_8bit.sh into bench/results/h200-8bit.json and prints the tables of
docs/kernel-8bit.md: speed of the 8-bit kernel against the bf16 kernel on the same masks (issue targets: 8-bit
in WaveAlign order >= 1.6x bf16 in WaveAlign order, >= 1.5x with the quantization; dense >= 1,050 TOPS), the
L2 figures of both kernels in both orders, and the accuracy against fp64 (worst head per input).

Usage: bench/gpu/collect_8bit.py LOG_DIR [--out bench/results/h200-8bit.json] [--commit C] [--date D]
"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import result_record  # noqa: E402
from collect_attention import read_jsonl, read_ncu  # noqa: E402

COMMAND = "bench/gpu/run_h200_8bit.sh build build-py312 LOG_DIR && bench/gpu/collect_8bit.py LOG_DIR"


def case_of(row):
    """One case in the record's schema from a wa_bench_attention --json line."""
    int8 = row.get("precision") == "int8"
    impl = {"int8": "wavealign-int8", "int8-quantize": "wavealign-int8-quantize",
            "int8-kernel": "wavealign-int8"}[row["part"]] if int8 else "wavealign-bf16"
    return {"impl": impl, "precision": "int8" if int8 else row["dtype"], "mode": row["mode"],
            "case": "dense" if row["mode"] == "dense" else row["mask"], "order": row["order"],
            "tokens": row["tokens"], "heads": row["heads"], "ms": row["ms"], "tflops": row["tflops"],
            "includes_quantization": row.get("includes_quantization", False),
            **({"part": row["part"]} if int8 else {}),
            "sm_clock_mhz": row.get("sm_clock_mhz"), "power_w": row.get("power_w")}


def find(cases, impl, case, order, heads, includes_quantization):
    for row in cases:
        if (row["impl"], row["case"], row["order"], row["heads"]) == (impl, case, order, heads) and \
                row["includes_quantization"] == includes_quantization and row.get("part") != "int8-quantize":
            return row
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[1] / "results" / "h200-8bit.json")
    parser.add_argument("--commit")
    parser.add_argument("--date")
    args = parser.parse_args()
    cases = [case_of(row) for row in read_jsonl(args.logs / "speed.jsonl")]
    accuracy_path = args.logs / "accuracy.json"
    accuracy = json.loads(accuracy_path.read_text()) if accuracy_path.exists() else []
    ncu = read_ncu(args.logs / "ncu.csv", ("mask", "order", "precision"))
    device = (args.logs / "gpu.txt").read_text().splitlines()[-1].split(",")[0].strip()
    record = result_record.make(device, COMMAND, args.commit, args.date, cases=cases, accuracy=accuracy,
                                ncu=[{"mask": m, "order": o, "precision": p, **values}
                                     for (m, o, p), values in sorted(ncu.items())])
    result_record.write(args.out, record)

    print("| case | heads | order | bf16 TF/s | int8 kernel TOPS | int8 with quantization | quantization ms | "
          "kernel / bf16 | call / bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in cases:
        if row["impl"] != "wavealign-bf16":
            continue
        key = (row["case"], row["order"], row["heads"])
        kernel = find(cases, "wavealign-int8", *key, False)
        call = find(cases, "wavealign-int8", *key, True)
        quantize = next((c for c in cases if c.get("part") == "int8-quantize" and
                         (c["case"], c["order"], c["heads"]) == key), None)
        cells = [f"{kernel['tflops']:.0f}" if kernel else "-", f"{call['tflops']:.0f}" if call else "-",
                 f"{quantize['ms']:.3f}" if quantize else "-",
                 f"{kernel['tflops'] / row['tflops']:.2f}x" if kernel else "-",
                 f"{call['tflops'] / row['tflops']:.2f}x" if call else "-"]
        print(f"| {row['case']} | {row['heads']} | {row['order']} | {row['tflops']:.0f} | " + " | ".join(cells) + " |")
    if ncu:
        print("\n| mask | order | precision | L2 hit % | DRAM read GB | kernel ms |")
        print("|---|---|---|---|---|---|")
        for (mask, order, precision), values in sorted(ncu.items()):
            print(f"| {mask} | {order} | {precision} | {values.get('lts__t_sector_hit_rate.pct', float('nan')):.1f} | "
                  f"{values.get('dram__bytes_read.sum', float('nan')) / 1e9:.2f} | "
                  f"{values.get('gpu__time_duration.sum', float('nan')):.2f} |")
    if accuracy:
        print("\n| input | tokens | impl | worst cos | worst rel L1 | worst max abs |")
        print("|---|---|---|---|---|---|")
        groups = {}
        for row in accuracy:
            groups.setdefault((row["input"], row["tokens"], row["impl"]), []).append(row)
        for (kind, tokens, impl), rows in groups.items():
            print(f"| {kind} | {tokens} | {impl} | {min(r['cos_sim'] for r in rows):.5f} | "
                  f"{max(r['rel_l1'] for r in rows):.4f} | {max(r['max_abs'] for r in rows):.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
