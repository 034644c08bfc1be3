"""Where the 8-bit attention's error comes from, and what finer K scales would give: a model of the kernel's
arithmetic in PyTorch on the CPU (INT8 Q per row and K minus its mean per block of keys, the online softmax's
running maximum per 128-key block, P scaled to 448 and rounded to e4m3, V per channel in e4m3), against the
fp64 attention of the same bf16 inputs, on sampled query rows of the synthetic workload's Wan2.1-14B heads or of
Gaussian q, k, v at 363,600 tokens (dense). Each variant makes one part exact (Q.K, Q, K, P, V), changes K's
scale granularity (`--kblocks`: keys per K scale; the kernel's is 128) or its smoothing (each block's own mean)
or adds the codes of K's residual, or multiplies P and V as integers (P as u8 with 255 at the
running maximum, V as s8 per channel: the other 8-bit operand pair Hopper's tensor cores take). The model's
cosine for the kernel's own rule equals the one measured on the GPU for the same synthetic rows
(bench/gpu/accuracy_8bit.py) to 1e-5, so the variants say what a change of the rule would give before the kernel
is changed. It is not the kernel's emulation (reference_attention_8bit, which the GPU tests compare with): sums
here run in float64 where the kernel's order is fixed.

    python3 bench/cpu/accuracy_8bit_sources.py [--inputs wan gaussian] [--heads 0 1 2 3] [--rows 2048]
        [--kblocks 128 16 8 1] [--emulation-blocks 16] [--variants NAME ...] [--out FILE]

--emulation-blocks N adds the row "emulation": the kernel's exact emulation as this build has it
(reference_attention_8bit through wavealign._core, the host quantizer's codes) on N query blocks of 128 rows,
evenly spaced, with the model at each --kblocks granularity on the same rows beside it.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

import wavealign  # noqa: E402,F401
from wavealign import _core  # noqa: E402

GRID = (101, 45, 80)  # 363,600 tokens: Wan2.1-14B 720p at 401 frames
WAN_HEADS, HEAD_DIM, KV_BLOCK = 40, 128, 128
LOG2E = 1.4426950408889634
P_MAX = 448.0  # e4m3's largest value: each block's P is scaled so that the row's running maximum maps to it


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e4m3fn).to(torch.float32)


def reference_attention(q, k, v, rows):
    """The fp64 attention of query rows `rows`, [rows, d]."""
    return torch.softmax((q[rows].double() @ k.double().T) / math.sqrt(k.shape[1]), -1) @ v.double()


def int8_blocks(x: torch.Tensor, kblock: int) -> torch.Tensor:
    """x [tokens, d] in INT8 codes with one scale per `kblock` rows (max |x| / 127), as the values they stand for."""
    tokens, d = x.shape
    groups = -(-tokens // kblock)
    padded = torch.nn.functional.pad(x, (0, 0, 0, groups * kblock - tokens)).view(groups, kblock, d)
    scale = padded.abs().amax((1, 2), keepdim=True) / 127
    codes = torch.clamp(torch.round(padded / torch.where(scale > 0, scale, 1)), -127, 127)
    return (codes * scale).view(-1, d)[:tokens]


def attention(q, k, v, rows, *, int8_qk=True, fp8_p=True, fp8_v=True, integer_pv=False, kblock=KV_BLOCK,
              exact_q=False, exact_k=False, k_block_mean=False, k_residual=False):
    """O of query rows `rows` under the modelled arithmetic, [rows, d]. integer_pv: P as u8 (255 at the running
    maximum) and V as s8 per channel, the integer alternative to e4m3 on Hopper's tensor cores. The K side's
    alternatives: exact_q / exact_k leave one operand of Q.K unquantized; k_block_mean subtracts each 128-key
    block's own mean instead of the sequence's (the logits then need q . mean per row and block, added exactly
    here); k_residual adds the INT8 codes of what K's codes leave over, per block with their own scale (a second
    INT8 product, ~15 bits of K)."""
    tokens, d = k.shape
    scale = 1.0 / math.sqrt(d)
    q_rows = q[rows]
    if int8_qk:
        q_scale = q_rows.abs().amax(1, keepdim=True) / 127
        q_used = q_rows if exact_q else torch.clamp(torch.round(q_rows / q_scale), -127, 127) * q_scale
        smoothed = k - k.mean(0, keepdim=True)
        correction = None
        if k_block_mean:
            groups = -(-tokens // KV_BLOCK)
            padded = torch.nn.functional.pad(smoothed, (0, 0, 0, groups * KV_BLOCK - tokens)).view(groups, KV_BLOCK, d)
            counts = torch.clamp(tokens - KV_BLOCK * torch.arange(groups), max=KV_BLOCK).to(torch.float32)
            means = (padded.sum(1) / counts[:, None]).repeat_interleave(KV_BLOCK, 0)[:tokens]
            smoothed = smoothed - means
            correction = q_rows.double() @ means.double().T
        k_used = smoothed if exact_k else int8_blocks(smoothed, kblock)
        if k_residual and not exact_k:
            k_used = k_used + int8_blocks(smoothed - k_used, kblock)
        products = q_used.double() @ k_used.double().T
        if correction is not None:
            products = products + correction
        logits = (products * (scale * LOG2E)).float()
    else:
        logits = (q_rows.double() @ k.double().T * (scale * LOG2E)).float()
    blocks = -(-tokens // KV_BLOCK)
    per_block = torch.nn.functional.pad(logits, (0, blocks * KV_BLOCK - tokens), value=-math.inf)
    per_block = per_block.view(len(rows), blocks, KV_BLOCK)
    running = torch.cummax(per_block.amax(2), 1).values  # the row maximum after each block
    p_max = 255.0 if integer_pv else P_MAX
    p = torch.exp2(per_block - running[:, :, None] + math.log2(p_max))
    rescale = torch.exp2(running - running[:, -1:])[:, :, None]  # the later blocks' O rescales, folded
    row_sum = (p * rescale).sum((1, 2))
    if integer_pv:
        p_used = torch.round(p) * rescale
        v_scale = v.abs().amax(0, keepdim=True) / 127
        v_used = torch.round(v / v_scale) * v_scale
    else:
        p_used = (e4m3(p) if fp8_p else p) * rescale
        v_scale = v.abs().amax(0, keepdim=True) / P_MAX
        v_used = e4m3(v / v_scale) * v_scale if fp8_v else v
    return (p_used.view(len(rows), -1)[:, :tokens].double() @ v_used.double()) / row_sum.double()[:, None]


def emulation(q, k, v, q_blocks: list[int]):
    """O of the rows of `q_blocks` by the build's emulation of the 8-bit kernel, and the fp64 reference."""
    tokens, d = k.shape
    blocks = -(-tokens // KV_BLOCK)
    counts = [blocks if b in set(q_blocks) else 0 for b in range(blocks)]
    row_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    col_idx = np.tile(np.arange(blocks, dtype=np.int32), len(q_blocks))
    o = np.zeros((1, tokens, d), np.float32)
    lse = np.zeros((1, tokens), np.float32)
    _core.reference_attention_8bit(q.numpy()[None], k.numpy()[None], v.numpy()[None], o, lse, row_ptr, col_idx,
                                   KV_BLOCK, KV_BLOCK, 0.0, None)
    rows = torch.cat([torch.arange(b * KV_BLOCK, min(tokens, (b + 1) * KV_BLOCK)) for b in q_blocks])
    return torch.from_numpy(o[0])[rows].double(), reference_attention(q, k, v, rows), rows


def metrics(out: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    o, r = out.flatten(), reference.flatten()
    return {"cos_sim": float(torch.dot(o, r) / (o.norm() * r.norm())),
            "rel_l1": float((o - r).abs().sum() / r.abs().sum())}


def head_inputs(source: str, grid: tuple[int, int, int], head: int,
                seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [tokens, d] of one head in bf16 values: the synthetic Wan2.1-14B head on the latent grid, or
    Gaussian with as many tokens."""
    if source == "wan":
        qkv = (torch.from_numpy(x) for x in _core.synthetic_head_qkv(*grid, WAN_HEADS, HEAD_DIM, head, seed))
    else:
        generator = torch.Generator().manual_seed(1000 * seed + head)
        qkv = (torch.randn(math.prod(grid), HEAD_DIM, generator=generator) for _ in range(3))
    return tuple(x.to(torch.bfloat16).float() for x in qkv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", nargs="+", choices=("wan", "gaussian"), default=["wan"],
                        help="the synthetic Wan heads, or Gaussian q, k, v")
    parser.add_argument("--grid", type=int, nargs=3, default=list(GRID), metavar=("T", "H", "W"),
                        help="latent frames, height and width (tokens = T x H x W)")
    parser.add_argument("--heads", type=int, nargs="+", default=[0, 1, 2, 3], help="heads of the 40")
    parser.add_argument("--rows", type=int, default=2048, help="query rows per head, evenly spaced")
    parser.add_argument("--batch", type=int, default=256, help="query rows per pass (memory: batch x 363,600 x 4 B)")
    parser.add_argument("--kblocks", type=int, nargs="+", default=[128, 16, 8, 1])
    parser.add_argument("--emulation-blocks", type=int, default=0,
                        help="query blocks for the build's exact emulation (0: none)")
    parser.add_argument("--variants", nargs="+", default=None, metavar="NAME",
                        help="run only these variants (their names as printed; default: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(result_record.ROOT / "bench/results/cpu-accuracy-8bit-sources.json"))
    args = parser.parse_args()
    variants = {"kernel rule": {}, "exact Q.K": {"int8_qk": False}, "exact Q": {"exact_q": True},
                "exact K": {"exact_k": True}, "K minus its block's mean": {"k_block_mean": True},
                "K plus its residual's codes": {"k_residual": True},
                "exact P and V": {"fp8_p": False, "fp8_v": False},
                "exact P": {"fp8_p": False}, "exact V": {"fp8_v": False}, "P u8 and V s8": {"integer_pv": True}}
    variants.update({f"K scale per {n} keys": {"kblock": n} for n in args.kblocks if n != KV_BLOCK})
    if args.variants is not None:
        unknown = [name for name in args.variants if name not in variants]
        if unknown:
            parser.error(f"--variants: {', '.join(map(repr, unknown))} not among {', '.join(map(repr, variants))}")
        variants = {name: variants[name] for name in args.variants}
    tokens = math.prod(args.grid)
    records = []

    def record(source, head, name, rows, out, reference, start):
        records.append({"input": source, "head": head, "variant": name, "tokens": tokens, "rows": rows,
                        **metrics(out, reference)})
        print(f"{source} head {head} {name:26s} cos {records[-1]['cos_sim']:.6f} "
              f"rel_l1 {records[-1]['rel_l1']:.5f} ({time.perf_counter() - start:.0f} s)", flush=True)

    for source, head in ((source, head) for source in args.inputs for head in args.heads):
        q, k, v = head_inputs(source, tuple(args.grid), head, args.seed)
        rows = torch.linspace(0, tokens - 1, args.rows).round().long()
        batches = [rows[i:i + args.batch] for i in range(0, len(rows), args.batch)]
        start = time.perf_counter()
        reference = torch.cat([reference_attention(q, k, v, batch) for batch in batches])
        for name, options in variants.items():
            start = time.perf_counter()
            out = torch.cat([attention(q, k, v, batch, **options) for batch in batches])
            record(source, head, name, args.rows, out, reference, start)
        if args.emulation_blocks:
            blocks = -(-tokens // KV_BLOCK)
            chosen = sorted({round(i * (blocks - 1) / max(1, args.emulation_blocks - 1))
                             for i in range(args.emulation_blocks)})
            start = time.perf_counter()
            out, same_reference, rows_used = emulation(q, k, v, chosen)
            record(source, head, "emulation", len(rows_used), out, same_reference, start)
            for n in args.kblocks:
                record(source, head, f"model, K per {n}, same rows", len(rows_used),
                       attention(q, k, v, rows_used, kblock=n), same_reference, start)
    same_rows = ["emulation"] + [f"model, K per {n}, same rows" for n in args.kblocks]
    names = list(variants) + (same_rows if args.emulation_blocks else [])
    worst = {source: {name: min(r["cos_sim"] for r in records if r["variant"] == name and r["input"] == source)
                      for name in names} for source in args.inputs}
    command = (f"python3 bench/cpu/accuracy_8bit_sources.py --inputs {' '.join(args.inputs)} "
               f"--grid {' '.join(map(str, args.grid))} "
               f"--heads {' '.join(map(str, args.heads))} --rows {args.rows} "
               f"--kblocks {' '.join(map(str, args.kblocks))} --emulation-blocks {args.emulation_blocks}"
               + ("" if args.variants is None else " --variants " + " ".join(f"'{name}'" for name in args.variants)))
    result_record.write(args.out, result_record.make(result_record.cpu_model(), command, variants=records,
                                                     worst_head_cos_sim=worst))
    for source, by_name in worst.items():
        for name, value in by_name.items():
            print(f"worst head, {source}: {name:26s} cos {value:.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
