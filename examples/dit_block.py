"""Swap wavealign.nn.SparseAttention into a toy DiT block.

The block (adaLN modulation, self-attention, MLP) first runs with dense SDPA restricted to the mask, then with
wavealign's block-sparse attention in WaveAlign row order; the two outputs agree within the dtype's tolerance.
The mask method is a small stand-in for XAttention/SpargeAttn: pooled query/key block scores, top blocks per row.
It is computed at the first denoising step and reused for the next ones (mask_key), so the plan is built once.

    python examples/dit_block.py                 # CUDA (bf16, fused kernel) when available, else CPU reference
    python examples/dit_block.py --device cpu --tokens 1024 --heads 4 --head-dim 64 --block 64
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as functional

import wavealign
import wavealign.nn


def pooled_topk_mask(q: torch.Tensor, k: torch.Tensor, block: int, density: float) -> torch.Tensor:
    """bool [B*H, MB, NB]: per row, the KV blocks with the highest pooled score (plus the diagonal).

    q, k: [B, H, L, d] with L a multiple of block.
    """
    batch, heads, length, dim = q.shape
    blocks = length // block
    q_pool = q.float().view(batch, heads, blocks, block, dim).mean(3)
    k_pool = k.float().view(batch, heads, blocks, block, dim).mean(3)
    scores = q_pool @ k_pool.transpose(-1, -2)
    keep = max(1, round(density * blocks))
    mask = torch.zeros_like(scores, dtype=torch.bool)
    mask.scatter_(-1, scores.topk(keep, dim=-1).indices, True)
    diagonal = torch.arange(blocks, device=q.device)
    mask[..., diagonal, diagonal] = True
    return mask.view(batch * heads, blocks, blocks)


class MaskedSDPA(torch.nn.Module):
    """The dense baseline: SDPA with the block mask expanded to tokens."""

    def __init__(self, block: int) -> None:
        super().__init__()
        self.block = block

    def forward(self, q, k, v, block_mask, mask_key=None):
        batch, heads, length, _ = q.shape
        tokens = block_mask.repeat_interleave(self.block, 1).repeat_interleave(self.block, 2)
        return functional.scaled_dot_product_attention(q, k, v, attn_mask=tokens.view(batch, heads, length, length))


class DiTBlock(torch.nn.Module):
    """adaLN-modulated self-attention and MLP over [B, L, dim] tokens; `attention` is swappable."""

    def __init__(self, dim: int, heads: int, attention: torch.nn.Module) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.norm2 = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv_proj = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(approximate="tanh"),
                                       torch.nn.Linear(4 * dim, dim))
        self.modulation = torch.nn.Linear(dim, 6 * dim)
        self.attention = attention

    def qkv(self, x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [B, H, L, d]: views of the projection's [B, L, H, d] output, as DiT code makes them."""
        shift, scale = self.modulation(c)[:, None].chunk(6, dim=-1)[:2]
        batch, length, dim = x.shape
        h = self.norm1(x) * (1 + scale) + shift
        q, k, v = self.qkv_proj(h).view(batch, length, 3, self.heads, dim // self.heads).unbind(2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, c: torch.Tensor, block_mask: torch.Tensor, mask_key=None) -> torch.Tensor:
        _, _, gate1, shift2, scale2, gate2 = self.modulation(c)[:, None].chunk(6, dim=-1)
        o = self.attention(*self.qkv(x, c), block_mask, mask_key=mask_key)
        x = x + gate1 * self.proj(o.transpose(1, 2).reshape(x.shape))
        return x + gate2 * self.mlp(self.norm2(x) * (1 + scale2) + shift2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=None, help="sequence length (a multiple of --block)")
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--head-dim", type=int, default=None)
    parser.add_argument("--block", type=int, default=None, help="mask block edge in tokens")
    parser.add_argument("--density", type=float, default=0.25, help="kept KV blocks per row")
    parser.add_argument("--steps", type=int, default=3, help="denoising steps sharing one mask")
    parser.add_argument("--skip", default="never", help="wavealign skip policy: never, auto or always")
    args = parser.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    tokens = args.tokens or (8192 if cuda else 1024)
    heads = args.heads or (8 if cuda else 4)
    head_dim = args.head_dim or (128 if cuda else 64)
    block = args.block or (128 if cuda else 64)
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)

    block_module = DiTBlock(heads * head_dim, heads, MaskedSDPA(block)).to(device, dtype)
    x = torch.randn(1, tokens, heads * head_dim, device=device, dtype=dtype)
    c = torch.randn(1, heads * head_dim, device=device, dtype=dtype)
    with torch.no_grad():
        mask = pooled_topk_mask(*block_module.qkv(x, c)[:2], block, args.density)
        dense = block_module(x, c, mask)

        sparse_attention = wavealign.nn.SparseAttention(block_size=block, skip=args.skip)
        block_module.attention = sparse_attention
        for step in range(args.steps):
            start = time.perf_counter()
            sparse = block_module(x, c, mask, mask_key=("block0", "mask0"))
            if cuda:
                torch.cuda.synchronize()
            print(f"step {step}: {1e3 * (time.perf_counter() - start):.1f} ms "
                  f"({'plan + ' if step == 0 else ''}attention in WaveAlign order)")

    plan = sparse_attention.plan_for(None, mask_key=("block0", "mask0"))
    error = (sparse.float() - dense.float()).abs().max().item()
    print(f"device {device}, {dtype}, L={tokens}, {heads} heads x {head_dim}, {block}x{block} blocks, "
          f"mask density {mask.float().mean().item():.3f}")
    plan_ms = plan.stats["total_plan_ms"]
    # The GPU plan runs asynchronously on the stream and is timed with the attention step above.
    timing = f"plan time {plan_ms:.2f} ms" if plan_ms == plan_ms else "planned on the GPU (timed with step 0)"
    print(f"plan: {plan}; {timing}")
    print(f"head 0: skipped={plan.skipped[0]} ({plan.reason[0]}); first rows in plan order "
          f"{plan.permutation[0, :8].tolist()}")
    print(f"max |DiT block (wavealign) - DiT block (masked SDPA)| = {error:.3g}")
    tolerance = 5e-2 if cuda else 1e-4
    if error > tolerance:
        raise SystemExit(f"outputs differ by {error:.3g} > {tolerance}")


if __name__ == "__main__":
    main()
