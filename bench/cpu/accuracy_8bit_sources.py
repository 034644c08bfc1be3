"""Where the 8-bit attention's error comes from, and what finer K scales would give: a model of the kernel's
arithmetic in PyTorch on the CPU (INT8 Q per row and K minus its mean per block of keys, the online softmax's
running maximum per 128-key block, P scaled to 448 and rounded to e4m3, V per channel in e4m3), against the
fp64 attention of the same bf16 inputs, on sampled query rows of the synthetic workload's Wan2.1-14B heads at
363,600 tokens (dense). Each variant makes one part exact or changes K's scale granularity (`--kblocks`: keys
per K scale; the kernel's is 128). The model's cosine for the kernel's own rule equals the one measured on the
GPU for the same rows (bench/gpu/accuracy_8bit.py) to 1e-5, so the variants say what a change of the rule
would give before the kernel is changed. It is not the kernel's emulation (reference_attention_8bit, which the
GPU tests compare with): sums here run in float64 where the kernel's order is fixed.

    python3 bench/cpu/accuracy_8bit_sources.py [--heads 0 1 2 3] [--rows 2048] [--kblocks 128 16 8 1]
        [--emulation-blocks 16]

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


def attention(q, k, v, rows, *, int8_qk=True, fp8_p=True, fp8_v=True, kblock=KV_BLOCK):
    """O of query rows `rows` under the modelled arithmetic, and the fp64 reference, both [rows, d]."""
    tokens, d = k.shape
    scale = 1.0 / math.sqrt(d)
    q_rows = q[rows]
    reference = torch.softmax((q_rows.double() @ k.double().T) * scale, -1) @ v.double()
    if int8_qk:
        q_scale = q_rows.abs().amax(1, keepdim=True) / 127
        q8 = torch.clamp(torch.round(q_rows / q_scale), -127, 127)
        smoothed = k - k.mean(0, keepdim=True)
        groups = -(-tokens // kblock)
        padded = torch.nn.functional.pad(smoothed, (0, 0, 0, groups * kblock - tokens)).view(groups, kblock, d)
        k_scale = padded.abs().amax((1, 2)) / 127
        k8 = torch.clamp(torch.round(padded / k_scale[:, None, None]), -127, 127).view(-1, d)[:tokens]
        products = (q8.double() @ k8.double().T).float()
        logits = products * (q_scale * k_scale.repeat_interleave(kblock)[:tokens][None, :]) * (scale * LOG2E)
    else:
        logits = (q_rows.double() @ k.double().T * (scale * LOG2E)).float()
    blocks = -(-tokens // KV_BLOCK)
    per_block = torch.nn.functional.pad(logits, (0, blocks * KV_BLOCK - tokens), value=-math.inf)
    per_block = per_block.view(len(rows), blocks, KV_BLOCK)
    running = torch.cummax(per_block.amax(2), 1).values  # the row maximum after each block
    p = torch.exp2(per_block - running[:, :, None] + math.log2(P_MAX))
    rescale = torch.exp2(running - running[:, -1:])[:, :, None]  # the later blocks' O rescales, folded
    row_sum = (p * rescale).sum((1, 2))
    p_used = (e4m3(p) if fp8_p else p) * rescale
    if fp8_v:
        v_scale = v.abs().amax(0, keepdim=True) / P_MAX
        v_used = e4m3(v / v_scale) * v_scale
    else:
        v_used = v
    out = (p_used.view(len(rows), -1)[:, :tokens].double() @ v_used.double()) / row_sum.double()[:, None]
    return out, reference


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
    reference = torch.softmax((q[rows].double() @ k.double().T) / math.sqrt(d), -1) @ v.double()
    return torch.from_numpy(o[0])[rows].double(), reference, rows


def metrics(out: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    o, r = out.flatten(), reference.flatten()
    return {"cos_sim": float(torch.dot(o, r) / (o.norm() * r.norm())),
            "rel_l1": float((o - r).abs().sum() / r.abs().sum())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, nargs="+", default=[0, 1, 2, 3], help="heads of the 40")
    parser.add_argument("--rows", type=int, default=2048, help="query rows per head, evenly spaced")
    parser.add_argument("--batch", type=int, default=256, help="query rows per pass (memory: batch x 363,600 x 4 B)")
    parser.add_argument("--kblocks", type=int, nargs="+", default=[128, 16, 8, 1])
    parser.add_argument("--emulation-blocks", type=int, default=0,
                        help="query blocks for the build's exact emulation (0: none)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(result_record.ROOT / "bench/results/cpu-accuracy-8bit-sources.json"))
    args = parser.parse_args()
    variants = {"kernel rule": {}, "exact Q.K": {"int8_qk": False}, "exact P and V": {"fp8_p": False, "fp8_v": False}}
    variants.update({f"K scale per {n} keys": {"kblock": n} for n in args.kblocks if n != KV_BLOCK})
    tokens = GRID[0] * GRID[1] * GRID[2]
    records = []
    for head in args.heads:
        q, k, v = (torch.from_numpy(x).to(torch.bfloat16).float()
                   for x in _core.synthetic_head_qkv(*GRID, WAN_HEADS, HEAD_DIM, head, args.seed))
        rows = torch.linspace(0, tokens - 1, args.rows).round().long()
        for name, options in variants.items():
            start = time.perf_counter()
            parts = [attention(q, k, v, rows[i:i + args.batch], **options) for i in range(0, len(rows), args.batch)]
            record = {"head": head, "variant": name, "tokens": tokens, "rows": args.rows,
                      **metrics(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))}
            records.append(record)
            print(f"head {head} {name:22s} cos {record['cos_sim']:.6f} rel_l1 {record['rel_l1']:.5f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
        if args.emulation_blocks:
            blocks = -(-tokens // KV_BLOCK)
            chosen = sorted({round(i * (blocks - 1) / max(1, args.emulation_blocks - 1))
                             for i in range(args.emulation_blocks)})
            start = time.perf_counter()
            out, reference, rows_used = emulation(q, k, v, chosen)
            compared = {"emulation": (out, reference)}
            for n in args.kblocks:
                compared[f"model, K per {n}, same rows"] = attention(q, k, v, rows_used, kblock=n)
            for name, (o, r) in compared.items():
                record = {"head": head, "variant": name, "tokens": tokens, "rows": len(rows_used), **metrics(o, r)}
                records.append(record)
                print(f"head {head} {name:22s} cos {record['cos_sim']:.6f} rel_l1 {record['rel_l1']:.5f} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
    same_rows = ["emulation"] + [f"model, K per {n}, same rows" for n in args.kblocks]
    names = list(variants) + (same_rows if args.emulation_blocks else [])
    worst = {name: min(r["cos_sim"] for r in records if r["variant"] == name) for name in names}
    heads = " ".join(map(str, args.heads))
    command = (f"python3 bench/cpu/accuracy_8bit_sources.py --heads {heads} --rows {args.rows} "
               f"--kblocks {' '.join(map(str, args.kblocks))} --emulation-blocks {args.emulation_blocks}")
    result_record.write(args.out, result_record.make(result_record.cpu_model(), command, variants=records,
                                                     worst_head_cos_sim=worst))
    for name, value in worst.items():
        print(f"worst head: {name:22s} cos {value:.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
