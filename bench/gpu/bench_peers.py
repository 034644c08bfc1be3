#!/usr/bin/env python3
"""Peers of the block-sparse kernel on the same mask, in the same run: PyTorch FlexAttention (torch.compile'd,
default and tuned kernel options) in the original and the WaveAlign row order, FlashAttention-4's block-sparse
forward in the original, S2 and WaveAlign row order, SpargeAttn's 8-bit block-sparse kernel (wavealign.sparge's
mask layout; its call quantizes Q, K and V itself) in the original and WaveAlign order, our fused kernel in bf16
and 8-bit (`wavealign-bf16`, `wavealign-int8`: the plug-in path, q in plan order and a plan of the permuted mask;
the 8-bit call includes its quantization), and dense SDPA, FA4, SageAttention2 and our two kernels.

The mask and the permutations come from `wa_bench_attention --save-mask/--save-perm`, so both benchmarks run
the identical workload. FlexAttention and FA4 get every kept block as a *full* block (no mask_mod evaluation),
their fastest path. In a permuted order, Q blocks and mask rows are permuted beforehand (the plug-in path);
the timed region is the attention call alone. The timing, the clock sampling and the FA4 and FlexAttention
calls are wavealign.bench's (the module behind `wavealign bench`; the package staged in BUILD/python must be on
PYTHONPATH); FA4's block-sparse tensors are wavealign.fa4's. Prints one JSON object per measurement, one per
plug-in check (each permuted order's output, unpermuted, against the original order's), and
{"skipped": impl, "reason": ...} when an implementation cannot run here (FA4 without flash_attn.cute, SpargeAttn
or SageAttention2 not built: bench/gpu/peers_8bit.sh builds them on the benchmark host).

All cases run in one process, so each torch.compile'd kernel variant is compiled once per sequence length, and
FA4's JIT (~20 s per shape) once per shape.

--warmup-ms MS keeps running untimed warm-up calls after the warm-up count until their kernel time reaches MS
milliseconds in total: the H200 runs at its 700 W software power cap, which engages within ~100 ms of a kernel
starting and takes the SM clock from 1980 MHz to ~1490-1650 MHz, so without it a short case is timed partly at
boost clocks (one case of our kernel read 597 and 689 TF/s in two sessions). Each timing line also carries the
mean SM clock, board power and power-capped share of its timed calls (NVML; null without it) and warmup_ms.

Usage: bench_peers.py --case MASK.npy:PERM.npy:TOKENS:KIND[:sdpa][:s2=S2PERM.npy] [--case ...]
                      [--impls flexattention,sdpa,flashattention4,spargeattn,sageattention2,wavealign]
                      [--head-dim 128] [--iters 5] [--cold-l2]
                      [--warmup-ms 0]
(PERM is the WaveAlign permutation; with s2=, FA4 also runs in that S2 order; sdpa adds the dense rows.)
"""
import argparse
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

import wavealign
from wavealign.bench import (ClockSampler, fa4_call, fa4_or_reason, flex_call, implementations, milliseconds,
                             print_json, sparge_call, sparge_or_reason, time_in_orders, time_ms)

BLOCK = 128
TUNED = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}
IMPLS = ("flexattention", "sdpa", "flashattention4", "spargeattn", "sageattention2", "wavealign")
PRECISIONS = {"wavealign-bf16": "native", "wavealign-int8": "int8"}


def wavealign_call(precision: str, block: int, k, v):
    """make(permuted mask, plan-ordered q) -> our fused kernel on a plan of the permuted mask in its own order."""
    def make(permuted_mask, q_order):
        plan = wavealign.plan(permuted_mask, order="original", skip="never", block_size=block)
        return lambda: wavealign.sparse_attention(q_order, k, v, plan, precision=precision)

    return make


def sage_or_reason():
    try:
        from sageattention import sageattn
    except Exception as error:  # any import failure of the optional library only skips its rows
        return None, f"sageattention is not importable ({error!r}): SageAttention2 is built from its source"
    return sageattn, None


def dense_row(impl, fn, heads, tokens, q_blocks, kv_blocks, common, args, sampler):
    """Times a dense attention call on the unpadded tokens and prints its row."""
    ms, clocks = time_ms(fn, max(2, args.iters // 2), args.cold_l2, sampler, warmup=1, warmup_ms=args.warmup_ms)
    flops = 4.0 * heads * tokens * tokens * args.head_dim
    print_json({"impl": impl, "order": "dense", "ms": ms, "tflops": flops / ms / 1e9,
                **{**common, "mode": "dense", "density": 1.0, "mask": "dense",
                   "nnz_blocks": heads * q_blocks * kv_blocks}, **clocks})


def run_case(mask_path, perm_path, tokens, kind, sdpa, s2_path, args, compiled, sampler, peers):
    mask = np.load(mask_path)
    perm = np.load(perm_path)
    heads, q_blocks, kv_blocks = mask.shape
    padded = q_blocks * BLOCK  # flex needs whole blocks; the padding rows/keys are part of the last block anyway
    nnz = int(mask.sum())
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, heads, padded, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    common = {"tokens": tokens, "heads": heads, "head_dim": args.head_dim, "block": BLOCK,
              "density": nnz / (heads * q_blocks * kv_blocks), "nnz_blocks": nnz, "mask": kind,
              "l2": "cold" if args.cold_l2 else "warm", "mode": "sparse"}
    original = np.tile(np.arange(q_blocks, dtype=np.int32), (heads, 1))
    if "flexattention" in args.impls:
        for impl, options in (("flexattention", None), ("flexattention-tuned", TUNED)):
            time_in_orders(impl, flex_call(compiled, BLOCK, k, v, options), mask,
                           {"original": original, "wavealign": perm}, q, BLOCK, common, args, sampler)
    if sdpa and "sdpa" in args.impls:
        qs, ks, vs = q[:, :, :tokens], k[:, :, :tokens], v[:, :, :tokens]
        dense_row("sdpa", lambda: F.scaled_dot_product_attention(qs, ks, vs), heads, tokens, q_blocks, kv_blocks,
                  common, args, sampler)
    if "wavealign" in args.impls:
        for impl, precision in PRECISIONS.items():
            time_in_orders(impl, wavealign_call(precision, BLOCK, k, v), mask,
                           {"original": original, "wavealign": perm}, q, BLOCK, common, args, sampler)
            if sdpa:
                full = wavealign.plan(np.ones((1, q_blocks, kv_blocks), dtype=bool), order="original", skip="never")
                qs, ks, vs = q[:, :, :tokens], k[:, :, :tokens], v[:, :, :tokens]
                dense_row(impl, lambda: wavealign.sparse_attention(qs, ks, vs, full, precision=precision), heads,
                          tokens, q_blocks, kv_blocks, common, args, sampler)
    if peers.get("spargeattn") is not None:
        time_in_orders("spargeattn", sparge_call(peers["spargeattn"], BLOCK, k, v), mask,
                       {"original": original, "wavealign": perm}, q, BLOCK, common, args, sampler)
    if sdpa and peers.get("sageattention2") is not None:
        sageattn = peers["sageattention2"]
        qs, ks, vs = q[:, :, :tokens], k[:, :, :tokens], v[:, :, :tokens]
        dense_row("sageattention2", lambda: sageattn(qs, ks, vs, tensor_layout="HND"), heads, tokens, q_blocks,
                  kv_blocks, common, args, sampler)
    fa4 = peers.get("flashattention4")
    if fa4 is not None:
        perms = {"original": original, **({"s2": np.load(s2_path)} if s2_path else {}), "wavealign": perm}
        time_in_orders("flashattention4", fa4_call(fa4, BLOCK, k, v), mask, perms, q, BLOCK, common, args, sampler)
        if sdpa:
            flash_attn_func = fa4[1]
            qd, kd, vd = (x[:, :, :tokens].transpose(1, 2).contiguous() for x in (q, k, v))
            dense_row("flashattention4", lambda: flash_attn_func(qd, kd, vd), heads, tokens, q_blocks, kv_blocks,
                      common, args, sampler)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", required=True,
                        help="MASK.npy:PERM.npy:TOKENS:KIND[:sdpa][:s2=S2PERM.npy]")
    parser.add_argument("--impls", type=implementations(IMPLS), default=IMPLS,
                        help=f"comma-separated subset of {','.join(IMPLS)} (default: all)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--cold-l2", action="store_true")
    parser.add_argument("--warmup-ms", type=milliseconds, default=0.0,
                        help="warm-up kernel time before each timing, past the power cap's boost transient")
    args = parser.parse_args()
    compiled = torch.compile(flex_attention, dynamic=False)
    sampler = ClockSampler()
    peers = {}
    for impl, probe in (("flashattention4", fa4_or_reason), ("spargeattn", sparge_or_reason),
                        ("sageattention2", sage_or_reason)):
        if impl in args.impls:
            peers[impl], reason = probe()
            if peers[impl] is None:
                print(f"bench_peers: {impl} rows skipped: {reason}", file=sys.stderr, flush=True)
                print_json({"skipped": impl, "reason": reason})
    for case in args.case:
        mask_path, perm_path, tokens, kind, *options = case.split(":")
        s2_path = next((option[len("s2="):] for option in options if option.startswith("s2=")), None)
        try:
            run_case(mask_path, perm_path, int(tokens), kind, "sdpa" in options, s2_path, args, compiled, sampler,
                     peers)
        except Exception as error:  # one failing case must not lose the others' numbers
            print(json.dumps({"case": case, "error": repr(error)}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
