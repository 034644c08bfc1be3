#!/usr/bin/env python3
"""The plug-in path's row permutation on the GPU: wavealign.fa4.permute_rows / unpermute_rows on contiguous
[B, L, H, d] tensors (FA4's layout) and Plan.permute_rows / unpermute_rows on contiguous [B, H, L, d] ones: the
same row gather, each laid out like its input. Wan2.1-14B at 401 frames (363,600 tokens, 2,841 query blocks of 128), bf16,
d = 128, a random mask of density 0.3 planned in WaveAlign order. FA4 itself is not needed.

    PYTHONPATH=build/python python3 bench/gpu/bench_fa4_permute.py [--heads 4,40] [--iters 20]
                                                                    [--out bench/results/h200-fa4-permute.json]

Prints one JSON line per (heads, path): median ms of permute (Q) + unpermute (O) over --iters after 3 untimed
calls, the bytes both move once (read + write of Q and O) and the achieved GB/s, and whether the two layouts give
the same values bit for bit. --out writes them as a record in bench/result_record.py's schema.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch

import wavealign
from wavealign import fa4

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

TOKENS, BLOCK, HEAD_DIM = 363_600, 128, 128
NOTE = ("permute_rows (Q) + unpermute_rows (O) of the plug-in path, bf16, 363,600 tokens, d = 128: one row "
        "gather in the input's memory layout, in FA4's [B, L, H, d] layout and on contiguous [B, H, L, d]; "
        "bitwise_equal_paths says whether both layouts give the same values bit for bit.")


def timed(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="4,40")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=pathlib.Path, help="write the rows as a results record")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "bench_fa4_permute", "reason": "no CUDA device"}))
        return 0
    blocks = (TOKENS + BLOCK - 1) // BLOCK
    rows = []
    generator = torch.Generator(device="cuda").manual_seed(0)
    for heads in (int(h) for h in args.heads.split(",")):
        mask = torch.rand(heads, blocks, blocks, device="cuda", generator=generator) < 0.3
        plan = wavealign.plan(mask, order="wavealign", skip="never")
        del mask
        q = torch.randn(1, TOKENS, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=generator)
        o = torch.randn(1, blocks * BLOCK, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=generator)
        q_bhld, o_bhld = q.transpose(1, 2).contiguous(), o.transpose(1, 2).contiguous()
        paths = {
            "fa4 layout [B, L, H, d]": lambda: (fa4.permute_rows(plan, q), fa4.unpermute_rows(plan, o, seq_len=TOKENS)),
            "plan, contiguous [B, H, L, d]": lambda: (
                plan.permute_rows(q_bhld).transpose(1, 2), plan.unpermute_rows(o_bhld, seq_len=TOKENS).transpose(1, 2)),
        }
        outputs = {name: fn() for name, fn in paths.items()}
        same = all(torch.equal(a, b) for a, b in zip(*outputs.values()))
        moved = 2 * (q.numel() + o.numel()) * q.element_size()  # each read once and written once
        for name, fn in paths.items():
            ms = timed(fn, args.iters)
            rows.append({"bench": "fa4_permute", "device": torch.cuda.get_device_name(), "heads": heads,
                         "tokens": TOKENS, "path": name, "ms": round(ms, 4), "bytes_moved": moved,
                         "gb_per_s": round(moved / ms / 1e6, 1), "bitwise_equal_paths": same})
            print(json.dumps(rows[-1]))
        del q, o, q_bhld, o_bhld, outputs
        torch.cuda.empty_cache()
    if args.out is not None:
        command = "PYTHONPATH=build/python python3 bench/gpu/bench_fa4_permute.py " + " ".join(sys.argv[1:])
        result_record.write(args.out, result_record.make(torch.cuda.get_device_name(), command, note=NOTE,
                                                         rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
