"""How close XAttention's INT8 estimate (`int8_estimate`) comes to the 16-bit one: per head, the Jaccard index
of the two masks and their densities, on the synthetic workload's Wan2.1-14B heads (bf16-rounded Q and K, as
the GPU reads them), through the CPU references of both rules. The GPU's fused INT8 estimate quantizes to the
same codes as the CPU reference (tests/cuda/test_masks.cpp), so its mask differs from these by near-ties only;
its cost is measured on the GPU (bench/gpu/run_h200_xattention.sh).

    python3 bench/cpu/xattention_int8.py [--heads 8] [--grids 8x64x64 26x45x80] [--strides 8 16] [--out FILE]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

import wavealign  # noqa: E402,F401
from wavealign import _core, methods  # noqa: E402

WAN_HEADS, HEAD_DIM = 40, 128


def bf16_rounded(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.bfloat16).float().numpy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=8, help="the first heads of the 40")
    parser.add_argument("--grids", nargs="+", default=["8x64x64", "26x45x80"],
                        help="token grids, latent frames x height x width (32,768 and 93,600 tokens)")
    parser.add_argument("--strides", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(result_record.ROOT / "bench/results/cpu-xattention-int8.json"))
    args = parser.parse_args()
    rows = []
    for grid, stride in [(grid, stride) for grid in args.grids for stride in args.strides]:
        shape = [int(x) for x in grid.split("x")]
        parts = [_core.synthetic_head_qkv(*shape, WAN_HEADS, HEAD_DIM, head, args.seed) for head in range(args.heads)]
        q = bf16_rounded(np.stack([part[0] for part in parts]))  # [heads, tokens, d]: one call scores every head
        k = bf16_rounded(np.stack([part[1] for part in parts]))
        masks, seconds = {}, {}
        for int8 in (False, True):
            start = time.perf_counter()
            masks[int8] = np.asarray(methods.xattention(q, k, threshold=args.threshold, stride=stride,
                                                        block_size=args.block, int8_estimate=int8))
            seconds[int8] = time.perf_counter() - start
        print(f"{q.shape[1]} tokens, S={stride}: CPU reference {seconds[False]:.0f} s (16-bit), "
              f"{seconds[True]:.0f} s (INT8)", flush=True)
        for head in range(args.heads):
            exact, int8 = masks[False][head], masks[True][head]
            row = {"head": head, "stride": stride, "tokens": int(q.shape[1]), "threshold": args.threshold,
                   "block": args.block,
                   "jaccard": float(np.logical_and(exact, int8).sum() / np.logical_or(exact, int8).sum()),
                   "density_16bit": float(exact.mean()), "density_int8": float(int8.mean()),
                   "differing_blocks": int((exact != int8).sum()), "blocks": int(int8.size)}
            rows.append(row)
            print(f"head {head} {q.shape[1]} tokens S={stride}: Jaccard {row['jaccard']:.4f}, density 16-bit {row['density_16bit']:.4f}"
                  f" INT8 {row['density_int8']:.4f}, {row['differing_blocks']} of {row['blocks']} blocks differ",
                  flush=True)
    command = ("python3 bench/cpu/xattention_int8.py --heads {} --grids {} --strides {} --threshold {} --block {}"
               .format(args.heads, " ".join(args.grids), " ".join(map(str, args.strides)), args.threshold,
                       args.block))
    record = result_record.make(result_record.cpu_model(), command, jaccard=rows,
                                worst_jaccard=min(row["jaccard"] for row in rows))
    result_record.write(args.out, record)
    print(f"worst Jaccard {record['worst_jaccard']:.4f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
