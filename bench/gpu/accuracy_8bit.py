"""Accuracy of the 8-bit attention against an fp64 reference, per head: cosine similarity, relative L1 and max
abs error of O on (a) Gaussian q, k, v, (b) the same with 8 K channels offset by 20 sigma, (c) the synthetic
workload's Wan2.1-14B heads, at 32,768 and 363,600 tokens, for our 8-bit kernel and our bf16 kernel (and
SageAttention2's dense 8-bit kernel where `sageattention` imports, SpargeAttn's block-sparse 8-bit kernel on the
full mask through wavealign.sparge where `spas_sage_attn` imports). Dense attention: every method sees the same
full mask. The reference is exact for a sample of query rows (evenly spaced, `--rows` per head) in float64 on
the GPU, from the same bf16 inputs the kernels read.

    python3 bench/gpu/accuracy_8bit.py --out accuracy.json [--heads 4] [--rows 4096]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import torch

import wavealign
from wavealign import _core

# Token grids (latent frames, height, width) of the two lengths: 363,600 is Wan2.1-14B 720p at 401 frames;
# 32,768 is 8 frames of 64 x 64 tokens.
GRIDS = {32768: (8, 64, 64), 363600: (101, 45, 80)}
WAN_HEADS, HEAD_DIM = 40, 128


def inputs(kind: str, tokens: int, heads: int, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v bf16 [1, heads, tokens, 128] on the GPU."""
    if kind == "synthetic":
        grid = GRIDS[tokens]
        parts = [_core.synthetic_head_qkv(*grid, WAN_HEADS, HEAD_DIM, head, seed) for head in range(heads)]
        return tuple(torch.from_numpy(np.stack([p[i] for p in parts]))[None].to("cuda", torch.bfloat16)
                     for i in range(3))
    generator = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, heads, tokens, HEAD_DIM, device="cuda", generator=generator) for _ in range(3))
    if kind == "outliers":
        channels = torch.randperm(HEAD_DIM, generator=generator, device="cuda")[:8]
        k[..., channels] += 20.0
    return tuple(x.to(torch.bfloat16) for x in (q, k, v))


def reference_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """fp64 softmax(q k^T / sqrt(d)) v of the query rows `rows`, [heads, len(rows), d]."""
    heads = q.shape[1]
    out = torch.empty(heads, len(rows), HEAD_DIM, dtype=torch.float64, device="cuda")
    scale = 1.0 / math.sqrt(HEAD_DIM)
    for h in range(heads):
        keys, values = k[0, h].double(), v[0, h].double()
        for start in range(0, len(rows), 256):
            chunk = rows[start:start + 256]
            scores = (q[0, h, chunk].double() @ keys.T) * scale
            out[h, start:start + 256] = torch.softmax(scores, dim=-1) @ values
    return out


def metrics(o: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    o, ref = o.double().flatten(), ref.flatten()
    return {"cos_sim": float(torch.dot(o, ref) / (o.norm() * ref.norm())),
            "rel_l1": float((o - ref).abs().sum() / ref.abs().sum()), "max_abs": float((o - ref).abs().max())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4096, help="query rows per head with an exact reference")
    parser.add_argument("--tokens", type=int, nargs="+", default=sorted(GRIDS))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    try:
        from sageattention import sageattn
    except ImportError as error:
        sageattn = None
        print(f"accuracy_8bit: SageAttention2 not measured: {error}", file=sys.stderr)
    try:
        import spas_sage_attn  # noqa: F401
        from wavealign import sparge
    except ImportError as error:
        sparge = None
        print(f"accuracy_8bit: SpargeAttn not measured: {error}", file=sys.stderr)
    records = []
    for tokens in args.tokens:
        blocks = -(-tokens // 128)
        dense_plan = wavealign.plan(np.ones((1, blocks, blocks), dtype=bool), order="original", skip="never")
        rows = torch.linspace(0, tokens - 1, args.rows, device="cuda").round().long()
        for kind in ("gaussian", "outliers", "synthetic"):
            q, k, v = inputs(kind, tokens, args.heads, args.seed)
            ref = reference_rows(q, k, v, rows)
            outputs = {"wavealign-int8": wavealign.sparse_attention(q, k, v, dense_plan, precision="int8"),
                       "wavealign-bf16": wavealign.sparse_attention(q, k, v, dense_plan)}
            if sageattn is not None:
                outputs["sageattention2"] = sageattn(q, k, v, tensor_layout="HND")
            if sparge is not None:
                outputs["spargeattn"] = sparge.sparse_attention(q, k, v, dense_plan)
            for impl, o in outputs.items():
                for head in range(args.heads):
                    record = {"input": kind, "tokens": tokens, "impl": impl, "head": head, "reference_rows": args.rows,
                              **metrics(o[0, head, rows], ref[head])}
                    records.append(record)
                    print(json.dumps(record), flush=True)
            del q, k, v, ref, outputs
            torch.cuda.empty_cache()
    with open(args.out, "w") as out:
        json.dump(records, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
