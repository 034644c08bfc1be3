#!/usr/bin/env python3
"""Peers of the block-sparse kernel on the same mask, in the same run: PyTorch FlexAttention (torch.compile'd,
default and tuned kernel options) in the original and the WaveAlign row order, and dense SDPA.

The mask and the WaveAlign permutation come from `wa_bench_attention --save-mask/--save-perm`, so both
benchmarks run the identical workload. FlexAttention gets every kept block as a *full* block (no mask_mod
evaluation), its fastest path. In WaveAlign order, Q blocks and mask rows are permuted beforehand (the plug-in
path); the timed region is the attention call alone. Prints one JSON object per measurement.

All cases run in one process, so each torch.compile'd kernel variant is compiled once per sequence length.

Usage: bench_peers.py --case MASK.npy:PERM.npy:TOKENS:KIND[:sdpa] [--case ...] [--head-dim 128] [--iters 5]
                      [--cold-l2]
"""
import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

BLOCK = 128
TUNED = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}


def time_ms(fn, iters, cold_l2, warmup=2):
    """Median of `iters` CUDA-event timings after `warmup` runs; optionally flushes L2 (2x its size) first."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")
    times = []
    for i in range(warmup + iters):
        if cold_l2:
            flush.fill_(i & 0xFF)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(stop))
    return float(np.median(times))


def block_mask_of(mask, heads, q_blocks, padded):
    """A FlexAttention BlockMask whose kept blocks are all 'full' blocks. mask: bool [H, MB, NB] (numpy)."""
    counts = torch.from_numpy(mask.sum(axis=2).astype(np.int32)).cuda()
    order = np.argsort(~mask, axis=2, kind="stable").astype(np.int32)  # kept block indices first, ascending
    indices = torch.from_numpy(order).cuda()
    zeros = torch.zeros_like(counts)
    return BlockMask.from_kv_blocks(zeros[None], indices[None], counts[None], indices[None], BLOCK_SIZE=BLOCK,
                                    seq_lengths=(padded, padded))


def run_case(mask_path, perm_path, tokens, kind, sdpa, args, compiled):
    mask = np.load(mask_path)
    perm = np.load(perm_path)
    heads, q_blocks, kv_blocks = mask.shape
    padded = q_blocks * BLOCK  # flex needs whole blocks; the padding rows/keys are part of the last block anyway
    nnz = int(mask.sum())
    flops = 4.0 * BLOCK * BLOCK * args.head_dim * nnz
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, heads, padded, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))

    permuted_mask = np.take_along_axis(mask, perm[:, :, None].astype(np.int64), axis=1)
    token_perm = (torch.from_numpy(perm.astype(np.int64)).cuda()[:, :, None] * BLOCK
                  + torch.arange(BLOCK, device="cuda")).reshape(heads, padded)
    index = token_perm[None, :, :, None].expand(1, heads, padded, args.head_dim)
    q_permuted = torch.gather(q, 2, index)
    masks = {"original": block_mask_of(mask, heads, q_blocks, padded),
             "wavealign": block_mask_of(permuted_mask, heads, q_blocks, padded)}
    queries = {"original": q, "wavealign": q_permuted}
    common = {"tokens": tokens, "heads": heads, "head_dim": args.head_dim, "block": BLOCK,
              "density": nnz / (heads * q_blocks * kv_blocks), "nnz_blocks": nnz, "mask": kind,
              "l2": "cold" if args.cold_l2 else "warm", "mode": "sparse"}
    outputs = {}
    for impl, options in (("flexattention", None), ("flexattention-tuned", TUNED)):
        for order in ("original", "wavealign"):
            fn = lambda: compiled(queries[order], k, v, block_mask=masks[order], kernel_options=options)
            outputs[order] = fn()
            ms = time_ms(fn, args.iters, args.cold_l2)
            print(json.dumps({"impl": impl, "order": order, "ms": ms, "tflops": flops / ms / 1e9, **common}), flush=True)

    # The plug-in path on this run: WaveAlign order, un-permuted, equals the original order (bf16 rounding).
    restored = torch.empty_like(outputs["wavealign"]).scatter_(2, index, outputs["wavealign"])
    difference = (restored.float() - outputs["original"].float()).abs().max().item()
    print(json.dumps({"check": "flex wavealign order unpermuted vs original", "mask": kind, "tokens": tokens,
                      "max_abs_difference": difference}), flush=True)

    if sdpa:
        qs, ks, vs = q[:, :, :tokens], k[:, :, :tokens], v[:, :, :tokens]
        ms = time_ms(lambda: F.scaled_dot_product_attention(qs, ks, vs), max(2, args.iters // 2), args.cold_l2,
                     warmup=1)
        dense_flops = 4.0 * heads * tokens * tokens * args.head_dim
        print(json.dumps({"impl": "sdpa", "order": "dense", "ms": ms, "tflops": dense_flops / ms / 1e9,
                          **{**common, "mode": "dense", "density": 1.0, "mask": "dense",
                             "nnz_blocks": heads * q_blocks * kv_blocks}}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", required=True, help="MASK.npy:PERM.npy:TOKENS:KIND[:sdpa]")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--cold-l2", action="store_true")
    args = parser.parse_args()
    compiled = torch.compile(flex_attention, dynamic=False)
    for case in args.case:
        parts = case.split(":")
        try:
            run_case(parts[0], parts[1], int(parts[2]), parts[3], len(parts) > 4 and parts[4] == "sdpa", args, compiled)
        except Exception as error:  # one failing case must not lose the others' numbers
            print(json.dumps({"case": case, "error": repr(error)}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
