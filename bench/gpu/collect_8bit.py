#!/usr/bin/env python3
"""Merges the logs of bench/gpu/run_h200_8bit.sh into bench/results/h200-8bit.json and prints the tables of
docs/kernel-8bit.md: speed of the 8-bit kernel against the bf16 kernel on the same masks (issue targets: 8-bit
in WaveAlign order >= 1.6x bf16 in WaveAlign order, >= 1.5x with the quantization; dense >= 1,050 TOPS), the
peers measured in one process on the same masks (SpargeAttn, SageAttention2, FA4, SDPA, our two kernels), the
L2 figures of both kernels in both orders, the accuracy against fp64 (worst head per input) and the 8-bit
kernel through the diffusers Wan transformer.

Usage: bench/gpu/collect_8bit.py LOG_DIR[@COMMIT] [LOG_DIR[@COMMIT] ...] [--out bench/results/h200-8bit.json]
                                 [--date D]

Each LOG_DIR holds any of speed.jsonl, peers.jsonl, ncu.csv, accuracy.json, wan.jsonl, gpu.txt and the text
reports of bench/gpu/ncu_8bit_issue.sh (ncu_<impl>.txt, here or under ncu/: the "issue_profile"); its rows
carry COMMIT (default: HEAD). Rows of the existing record that no LOG_DIR measures again stay, with their own
commit, so a call that re-measures one part does not drop the others; the record's commit lists every commit
its rows came from.
"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import result_record  # noqa: E402
from collect_attention import read_jsonl, read_ncu  # noqa: E402

COMMAND = ("bench/gpu/run_h200_8bit.sh build build-py312 LOG_DIR [speed,heads40,ncu,accuracy,peers,wan] && "
           "bench/gpu/collect_8bit.py LOG_DIR@COMMIT ...")
# Which rows a new measurement replaces, per section.
CASE_KEY = ("source", "impl", "mode", "case", "order", "heads", "includes_quantization", "part")
# The peers' arithmetic: INT8 Q.K and FP8 P.V for the 8-bit kernels, bf16 for the others.
PEER_PRECISION = {"spargeattn": "int8", "sageattention2": "int8", "wavealign-int8": "int8"}


def case_of(row):
    """One case in the record's schema from a wa_bench_attention --json line."""
    int8 = row.get("precision") == "int8"
    impl = {"int8": "wavealign-int8", "int8-quantize": "wavealign-int8-quantize",
            "int8-kernel": "wavealign-int8"}[row["part"]] if int8 else "wavealign-bf16"
    return {"source": "wa_bench_attention", "impl": impl, "precision": "int8" if int8 else row["dtype"],
            "mode": row["mode"], "case": "dense" if row["mode"] == "dense" else row["mask"], "order": row["order"],
            "tokens": row["tokens"], "heads": row["heads"], "ms": row["ms"], "tflops": row["tflops"],
            "includes_quantization": row.get("includes_quantization", False),
            **({"part": row["part"]} if int8 else {}),
            "sm_clock_mhz": row.get("sm_clock_mhz"), "power_w": row.get("power_w")}


def peer_case_of(row):
    """One case in the record's schema from a bench_peers.py timing line (one process, the same masks)."""
    impl = row["impl"]
    dense = row["order"] == "dense"
    return {"source": "bench_peers", "impl": impl, "precision": PEER_PRECISION.get(impl, "bf16"),
            "mode": "dense" if dense else "sparse", "case": "dense" if dense else row["mask"],
            "order": "dense" if dense else row["order"], "tokens": row["tokens"], "heads": row["heads"],
            "ms": row["ms"], "tflops": row["tflops"], "includes_quantization": impl in PEER_PRECISION,
            "sm_clock_mhz": row.get("sm_clock_mhz"), "power_w": row.get("power_w")}


# The lines of ncu_8bit_issue.sh's reports that say where a kernel's issue slots go.
PROFILE_METRICS = ("SM Frequency", "Duration", "Executed Ipc Active", "Issue Slots Busy", "Active Warps Per Scheduler",
                   "Eligible Warps Per Scheduler", "No Eligible", "Warp Cycles Per Issued Instruction",
                   "Executed Instructions", "Registers Per Thread", "Block Size", "Theoretical Occupancy",
                   "Achieved Occupancy")


def read_issue_profiles(logs):
    """[{"impl", metric: {"value", "unit"}, ...}] from the ncu_<impl>.txt reports of ncu_8bit_issue.sh, whose
    metric lines read `NAME [UNIT] VALUE` (the first occurrence of a metric counts)."""
    profiles = []
    for path in sorted(list(logs.glob("ncu_*.txt")) + list(logs.glob("ncu/ncu_*.txt"))):
        profile = {"impl": path.stem[len("ncu_"):].replace("_", "-")}
        for line in path.read_text().splitlines():
            metric = next((m for m in PROFILE_METRICS if line.strip().startswith(m + " ")), None)
            if metric is None:
                continue
            words = line.strip()[len(metric):].split()
            profile.setdefault(metric.lower().replace(" ", "_"),
                               {"value": float(words[-1].replace(",", "")), "unit": " ".join(words[:-1])})
        profiles.append(profile)
    return profiles


def key_of(row, fields):
    return tuple(row.get(field) for field in fields)


def merge(old_rows, new_rows, fields):
    """new_rows, then the old rows whose key no new row has."""
    new_keys = {key_of(row, fields) for row in new_rows}
    return new_rows + [row for row in old_rows if key_of(row, fields) not in new_keys]


def read_logs(spec, default_commit):
    """The rows of one LOG_DIR[@COMMIT], each tagged with the commit."""
    path, _, commit = spec.partition("@")
    logs, commit = pathlib.Path(path), commit or default_commit
    tag = lambda rows: [{**row, "commit": commit} for row in rows]  # noqa: E731
    cases = [case_of(row) for row in read_jsonl(logs / "speed.jsonl")]
    cases += [peer_case_of(row) for row in read_jsonl(logs / "peers.jsonl") if "ms" in row]
    checks = [row for row in read_jsonl(logs / "peers.jsonl") if "check" in row]
    accuracy_path = logs / "accuracy.json"
    accuracy = json.loads(accuracy_path.read_text()) if accuracy_path.exists() else []
    ncu = read_ncu(logs / "ncu.csv", ("mask", "order", "precision"))
    ncu_rows = [{"mask": m, "order": o, "precision": p, **values} for (m, o, p), values in sorted(ncu.items())]
    wan = [{key: row.get(key) for key in ("frames", "tokens", "layers", "method", "backend", "precision", "order",
                                          "density", "step_ms", "attention_ms", "cos_vs_dense", "cos_vs_native")}
           for row in read_jsonl(logs / "wan.jsonl") if row.get("bench") == "e2e"]
    gpu = logs / "gpu.txt"
    device = gpu.read_text().splitlines()[-1].split(",")[0].strip() if gpu.exists() else None
    return {"cases": tag(cases), "plug_in_checks": tag(checks), "accuracy": tag(accuracy), "ncu": tag(ncu_rows),
            "wan": tag(wan), "issue_profile": tag(read_issue_profiles(logs)), "device": device}


def find(cases, impl, case, order, heads, includes_quantization, source="wa_bench_attention"):
    for row in cases:
        if (row.get("source", "wa_bench_attention"), row["impl"], row["case"], row["order"], row["heads"]) == \
                (source, impl, case, order, heads) and row["includes_quantization"] == includes_quantization and \
                row.get("part") != "int8-quantize":
            return row
    return None


def print_tables(record):
    cases = record["cases"]
    print("| case | heads | order | bf16 TF/s | int8 kernel TOPS | int8 with quantization | quantization ms | "
          "kernel / bf16 | call / bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in cases:
        if row["impl"] != "wavealign-bf16" or row.get("source", "wa_bench_attention") != "wa_bench_attention":
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
    peers = [row for row in cases if row.get("source") == "bench_peers"]
    if peers:
        impls = list(dict.fromkeys(row["impl"] for row in peers))
        print("\n| case | order | " + " | ".join(impls) + " |")
        print("|---|---|" + "---|" * len(impls))
        for case, order in dict.fromkeys((row["case"], row["order"]) for row in peers):
            cells = []
            for impl in impls:
                row = next((r for r in peers if (r["impl"], r["case"], r["order"]) == (impl, case, order)), None)
                cells.append(f"{row['tflops']:.1f}" if row else "-")
            print(f"| {case} | {order} | " + " | ".join(cells) + " |")
    if record.get("ncu"):
        print("\n| mask | order | precision | L2 hit % | DRAM read GB | kernel ms |")
        print("|---|---|---|---|---|---|")
        for values in record["ncu"]:
            print(f"| {values['mask']} | {values['order']} | {values['precision']} | "
                  f"{values.get('lts__t_sector_hit_rate.pct', float('nan')):.1f} | "
                  f"{values.get('dram__bytes_read.sum', float('nan')) / 1e9:.2f} | "
                  f"{values.get('gpu__time_duration.sum', float('nan')):.2f} |")
    if record.get("accuracy"):
        print("\n| input | tokens | impl | worst cos | worst rel L1 | worst max abs |")
        print("|---|---|---|---|---|---|")
        groups = {}
        for row in record["accuracy"]:
            groups.setdefault((row["input"], row["tokens"], row["impl"]), []).append(row)
        for (kind, tokens, impl), rows in groups.items():
            print(f"| {kind} | {tokens} | {impl} | {min(r['cos_sim'] for r in rows):.5f} | "
                  f"{max(r['rel_l1'] for r in rows):.4f} | {max(r['max_abs'] for r in rows):.2e} |")
    if record.get("issue_profile"):
        names = ("sm_frequency", "duration", "issue_slots_busy", "active_warps_per_scheduler",
                 "eligible_warps_per_scheduler", "registers_per_thread", "block_size", "executed_instructions")
        print("\n| kernel | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for profile in record["issue_profile"]:
            cells = [f"{profile[n]['value']:g} {profile[n]['unit']}".strip() if n in profile else "-" for n in names]
            print(f"| {profile['impl']} | " + " | ".join(cells) + " |")
    if record.get("wan"):
        print("\n| frames | layers | method | precision | step ms | attention ms | cos vs dense | cos vs bf16 |")
        print("|---|---|---|---|---|---|---|---|")
        for row in record["wan"]:
            cells = [("-" if row[key] is None else f"{row[key]:.6f}") for key in ("cos_vs_dense", "cos_vs_native")]
            print(f"| {row['frames']} | {row['layers']} | {row['method']} | {row['precision'] or 'bf16 (SDPA)'} | "
                  f"{row['step_ms']:.0f} | {row['attention_ms']:.0f} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", help="LOG_DIR[@COMMIT]")
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[1] / "results" / "h200-8bit.json")
    parser.add_argument("--date")
    args = parser.parse_args()
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    old_commit = old.get("commit", "unknown").split(",")[0]
    sections = {name: [{"commit": old_commit, **row} for row in old.get(name, [])]
                for name in ("cases", "plug_in_checks", "accuracy", "ncu", "wan", "issue_profile")}
    for row in sections["cases"]:  # rows from before the peers joined the record all came from the C++ bench
        row.setdefault("source", "wa_bench_attention")
    device = old.get("device")
    for spec in args.logs:
        new = read_logs(spec, result_record.git_commit())
        device = new.pop("device") or device
        sections["cases"] = merge(sections["cases"], new["cases"], CASE_KEY)
        sections["plug_in_checks"] = merge(sections["plug_in_checks"], new["plug_in_checks"], ("check", "mask"))
        sections["ncu"] = merge(sections["ncu"], new["ncu"], ("mask", "order", "precision"))
        sections["wan"] = merge(sections["wan"], new["wan"], ("frames", "method", "precision", "order"))
        sections["issue_profile"] = merge(sections["issue_profile"], new["issue_profile"], ("impl",))
        if new["accuracy"]:  # one accuracy run is one consistent set of reference rows
            sections["accuracy"] = new["accuracy"]
    commits = ",".join(dict.fromkeys(row["commit"] for rows in sections.values() for row in rows))
    if device is None:
        parser.error("no gpu.txt in the logs and no existing record to take the device from")
    record = result_record.make(device, COMMAND, commits, args.date,
                                **{name: rows for name, rows in sections.items() if rows})
    result_record.write(args.out, record)
    print_tables(record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
