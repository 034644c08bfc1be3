#!/usr/bin/env python3
"""Mask generation of the four methods for a full Wan2.1-14B layer on the GPU, next to the sparse attention
each mask feeds, recorded as bench/results/h200-masks.json. Runs BUILD/bench/wa_bench_masks (it builds
nothing; the arithmetic behind the targets is in bench_masks.cu) and keeps its JSON lines with the device,
the commit and the date. About two minutes on an H200: the synthetic Q/K/V of 40 heads at 363,600 tokens
take ~10 s to generate, each case ~3 mask runs and 3 attention calls of ~1-4 s.

Usage: bench/gpu/bench_masks.py BUILD [--out bench/results/h200-masks.json] [--cases NAME,...]
                                [--frames 401] [--heads 40] [--iters 3] [--attention-iters 2]
Exit status 1 when the benchmark fails; a case that misses its target is marked MISSED (XAttention at S = 8
does by construction, see bench_masks.cu) and recorded with meets_target false. XAttention's rows also print
its estimate against its FLOP floor (floor_ms, the cuBLAS path's time, the mask's agreement with that path).

The record holds one row per case, each with the commit, date and command of the call that measured it: the
cases this call ran replace their rows, the other cases keep theirs, so a call with --cases re-measures part
of the table without losing the rest.
"""
import argparse
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402


def merged_runs(previous: list[dict], runs: list[dict], stamp: dict) -> list[dict]:
    """This call's runs, each stamped with its commit, date and command, after the previous record's rows of
    the cases this call did not run (which keep their own stamps)."""
    ran = {run["case"] for run in runs}
    return [row for row in previous if row["case"] not in ran] + [{**run, **stamp} for run in runs]


MERGED_COMMAND = ("bench/gpu/bench_masks.py BUILD --cases CASES (one call per row group; each row's commit, date "
                  "and command name its call)")


def merged_record(record: dict, previous: list[dict], runs: list[dict]) -> dict:
    """The results file after this call: its rows (merged_runs) and, where they come from several calls, the
    calls' commits in row order and the general command instead of this call's."""
    rows = merged_runs(previous, runs, {field: record[field] for field in ("commit", "date", "command")})
    commits = list(dict.fromkeys(row["commit"] for row in rows))
    if len(commits) > 1:
        record = {**record, "commit": ",".join(commits), "command": MERGED_COMMAND}
    return {**record, "runs": rows}


def summary(run: dict) -> str:
    """The printed lines of one case: its share of the attention and, for XAttention, its estimate's floor ratio
    with the cuBLAS path's time (16-bit) or the Jaccard index with the 16-bit mask (INT8 estimate)."""
    lines = [f"{run['case']:>16}: density {run['density']:.3f}, mask {run['mask_ms']:8.2f} ms, attention "
             f"{run['attention_ms']:8.1f} ms, share {100 * run['mask_share']:5.2f} % "
             f"(target {100 * run['target_share']:.0f} %{'' if run['meets_target'] else ', MISSED'})"]
    if "floor_ms" in run:
        ratio = run["floor_ratio"]
        floor = (f"floor {run['floor_ms']:8.2f} ms at {run['floor_gemm_tflops']:.0f} TF/s, mask / floor "
                 f"{ratio:.3f}")
        if "cublas_mask_ms" in run:
            lines.append(f"{'':>16}  {run['estimate']} estimate: mask {run['mask_ms']:8.2f} ms, cuBLAS path "
                         f"{run['cublas_mask_ms']:8.2f} ms, {floor} (target {run['target_floor_ratio']}"
                         f"{'' if ratio <= run['target_floor_ratio'] else ', MISSED'}), "
                         f"{run['blocks_differing_from_cublas']} blocks differ from the cuBLAS path's mask")
        else:
            lines.append(f"{'':>16}  {run['estimate']} estimate: mask {run['mask_ms']:8.2f} ms, {floor} (the bf16 "
                         f"floor), Jaccard with the 16-bit mask {run['jaccard_vs_16bit']:.4f} "
                         f"({run['blocks_differing_from_16bit']} blocks differ)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", type=pathlib.Path, help="CMake build directory holding bench/wa_bench_masks")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/h200-masks.json"))
    parser.add_argument("--cases", default="all")
    parser.add_argument("--frames", type=int, default=401)
    parser.add_argument("--heads", type=int, default=40)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--attention-iters", type=int, default=2)
    args = parser.parse_args()

    binary = args.build / "bench" / "wa_bench_masks"
    if not binary.exists():
        sys.exit(f"bench_masks.py: {binary} not found (build the project with CUDA first)")
    command = [str(binary), "--frames", str(args.frames), "--heads", str(args.heads), "--iters", str(args.iters),
               "--attention-iters", str(args.attention_iters), "--cases", args.cases]
    result = subprocess.run(command, capture_output=True, text=True)
    sys.stderr.write(result.stderr)
    runs = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    for run in runs:
        print(summary(run))
    record = result_record.make(runs[0]["gpu"] if runs else "unknown",
                                "bench/gpu/bench_masks.py " + " ".join(sys.argv[1:]))
    previous = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
    result_record.write(args.out, merged_record(record, previous, runs))
    print(f"wrote {args.out}")
    if result.returncode != 0 or not runs:
        sys.exit(f"bench_masks.py: wa_bench_masks exited {result.returncode} after {len(runs)} cases")


if __name__ == "__main__":
    main()
