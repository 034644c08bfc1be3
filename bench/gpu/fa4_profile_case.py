#!/usr/bin/env python3
"""FlashAttention-4 on one saved case, for Nsight Compute: its block-sparse forward in the order of a saved
permutation and its dense forward on the same Q, K, V, each launched once inside the profiler range after one
untimed compile-and-warm call of each (run under `ncu --profile-from-start off`; bench/gpu/ncu_side_by_side.sh).

    PYTHONPATH=build/python python3 bench/gpu/fa4_profile_case.py MASK.npy PERM.npy TOKENS [--no-dense]

MASK and PERM come from `wa_bench_attention --save-mask/--save-perm`, so FA4 runs the mask and the row order our
kernel ran. Prints one JSON line per profiled launch, in launch order.
"""
import argparse
import json

import numpy as np
import torch

from wavealign.bench import fa4_call, fa4_or_reason, token_order

BLOCK = 128


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mask")
    parser.add_argument("perm")
    parser.add_argument("tokens", type=int)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--no-dense", action="store_true")
    args = parser.parse_args()
    parts, reason = fa4_or_reason()
    if parts is None:
        raise SystemExit(f"fa4_profile_case: FlashAttention-4 is not importable: {reason}")
    mask, perm = np.load(args.mask), np.load(args.perm)
    heads, q_blocks, _ = mask.shape
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, heads, q_blocks * BLOCK, args.head_dim, device="cuda", dtype=torch.bfloat16,
                           generator=generator) for _ in range(3))
    permuted = np.take_along_axis(mask, perm[:, :, None].astype(np.int64), axis=1)
    sparse = fa4_call(parts, BLOCK, k, v)(permuted, torch.gather(q, 2, token_order(perm, BLOCK, args.head_dim)))
    cases = [("sparse", sparse)]
    if not args.no_dense:
        qd, kd, vd = (x[:, :, :args.tokens].transpose(1, 2).contiguous() for x in (q, k, v))
        cases.append(("dense", lambda: parts[1](qd, kd, vd)[0]))
    for _, call in cases:  # compile (FA4's JIT) and warm outside the profiled range
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _, call in cases:
        call()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    for name, _ in cases:
        print(json.dumps({"impl": "flashattention4", "case": name, "heads": heads, "tokens": args.tokens,
                          "nnz_blocks": int(mask.sum()) if name == "sparse" else heads * q_blocks * mask.shape[2]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
