"""FlashAttention-4 in WaveAlign order: FA4's block-sparse forward over a plan's permuted mask (the plug-in path).

    from wavealign import fa4
    plan = wavealign.plan(block_mask)                      # dense, CSR or FlexAttention without partial blocks
    o = fa4.sparse_attention(q, k, v, plan)                # as wavealign.sparse_attention: [B, H, L, d], O in
                                                           # the original order
    # the same by hand, around your own FA4 call on [B, L, H, d] tensors (FA4's layout):
    from flash_attn.cute import flash_attn_func
    tensors = fa4.block_sparse_tensors(plan, L, device=q.device)   # FA4's BlockSparseTensorsTorch, rows permuted
    o_perm, _ = flash_attn_func(fa4.permute_rows(plan, q), k, v, block_sparse_tensors=tensors)
    o = fa4.unpermute_rows(plan, o_perm, seq_len=L)                # [B, L, H, d] in the original order

Only the query side moves: K and V stay in place, and row p of the permuted mask is row permutation[p] of the
original. Every kept block goes into FA4's *full* block arrays (no mask_mod is evaluated), the partial-block
counts are zero. flash_attn is imported on first use, never when wavealign.fa4 is imported.
"""

from __future__ import annotations

import weakref
from typing import Any

from ._plugin import check_plan, check_qkv, mask_batch_heads, permuted_block_lists
from ._plan import Plan
from ._util import blocks_for, check_int, check_scale, heads_view_shape, invalid, require_torch

# Per plan: the block-sparse tensors made for (seq_len, batch, heads, device). Building them reads the longest
# row's length on the host once; later calls with the same plan reuse them.
_tensors_of_plan: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _flash_attn_cute() -> Any:
    try:
        import flash_attn.cute as cute
        from flash_attn.cute import block_sparsity
    except ImportError as error:
        raise ImportError("wavealign.fa4 needs FlashAttention-4 (pip install flash-attn-4; its CuTe DSL kernels "
                          f"run on sm_90 and newer): import flash_attn.cute failed: {error}") from error
    return cute, block_sparsity


def block_sparse_tensors(plan: Plan, seq_len: int, *, heads: int | None = None, device: Any = None) -> Any:
    """FA4's BlockSparseTensorsTorch of the plan's permuted mask, for flash_attn_func on plan-ordered queries.

    Args:
        plan: from wavealign.plan(); a FlexAttention mask must have no partial blocks under a mask_mod (FA4 would
            run them unmasked: ValueError naming `plan`).
        seq_len: KV length L (tokens of k and v); its KV blocks must be the plan's.
        heads: the attention's heads H. The mask has H heads (shared by the batch: arrays [1, H, MB, ...]) or
            B*H (arrays [B, H, MB, ...]). Default: the BlockMask's (B, H) for a FlexAttention plan, else all
            mask heads with batch 1.
        device: where the tensors go (FA4 needs the device of q); default: the plan's input device (torch
            inputs) or the CPU.

    full_block_cnt int32 [B, H, MB] and full_block_idx int32 [B, H, MB, W] hold row p of head h = original
    query block permutation[h, p]: its kept KV blocks in ascending order, packed left (W = the longest row);
    mask_block_cnt is zero ([B, H, MB]) with a one-wide mask_block_idx; block_size = plan.block_size. The
    query length is MB * q_block, the length of permute_rows(plan, q). The tensors are made once per plan,
    length, heads and device and cached with the plan; making them synchronizes the device (the mask's
    validity, its block count and W are read on the host, and the cached tensors are complete before any stream
    reads them).
    """
    torch = require_torch("wavealign.fa4")
    plan = check_plan(plan, "FlashAttention-4")
    seq_len = check_int(seq_len, "seq_len", 1)
    q_block, kv_block = plan.block_size
    if blocks_for(seq_len, kv_block) != plan.kv_blocks:
        raise invalid("seq_len", f"= {seq_len} gives {blocks_for(seq_len, kv_block)} KV blocks of {kv_block}, "
                                 f"the plan has {plan.kv_blocks}")
    batch, attention_heads = mask_batch_heads(plan, heads)
    if device is None:
        permutation = plan.permutation
        device = permutation.device if isinstance(permutation, torch.Tensor) else "cpu"
    device = torch.device(device)
    cache = _tensors_of_plan.setdefault(plan, {})
    key = (seq_len, batch, attention_heads, device.type, device.index)
    if key not in cache:
        _, block_sparsity = _flash_attn_cute()
        counts, indices = permuted_block_lists(plan, device)
        if device.type == "cuda":
            # Cached tensors may be read on any stream later: finish making them on this one first.
            torch.cuda.current_stream(device).synchronize()
        shape = (batch, attention_heads, plan.q_blocks)
        cache[key] = block_sparsity.BlockSparseTensorsTorch(
            mask_block_cnt=torch.zeros(shape, dtype=torch.int32, device=device),
            mask_block_idx=torch.zeros((*shape, 1), dtype=torch.int32, device=device),
            full_block_cnt=counts.view(shape), full_block_idx=indices.view(*shape, indices.shape[-1]),
            block_size=(q_block, kv_block))
    return cache[key]


def permute_rows(plan: Plan, x: Any) -> Any:
    """x [B, L, H, d] (FA4's layout) -> [B, MB*q_block, H, d] with the query blocks in plan order.

    Plan.permute_rows on the [B, H, L, d] view, transposed back. The result is laid out in memory like x (a
    contiguous x, the projections' usual output, gives a contiguous result); a partial last block is zero-padded,
    as Plan.permute_rows does.
    """
    _check_layout(x, "x")
    return plan.permute_rows(x.transpose(-3, -2)).transpose(-3, -2)


def unpermute_rows(plan: Plan, o: Any, seq_len: int | None = None) -> Any:
    """o [B, MB*q_block, H, d] in plan order -> [B, seq_len, H, d] in the original order (Plan.unpermute_rows on
    the [B, H, L, d] view, transposed back; laid out in memory like o)."""
    _check_layout(o, "o")
    return plan.unpermute_rows(o.transpose(-3, -2), seq_len=seq_len).transpose(-3, -2)


def _check_layout(x: Any, argument: str) -> None:
    torch = require_torch("wavealign.fa4")
    if not isinstance(x, torch.Tensor):
        raise invalid(argument, f"must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise invalid(argument, f"must be [B, L, H, d] (FlashAttention's layout), got shape {list(x.shape)}")


def sparse_attention(q: Any, k: Any, v: Any, plan: Plan, scale: float | None = None,
                     return_lse: bool = False) -> Any:
    """FA4's block-sparse forward in plan order; O (and LSE) come back in the original order.

    The call of wavealign.sparse_attention with FlashAttention-4 as the kernel, so either can serve as the
    other's drop-in.

    Args:
        q, k, v: CUDA tensors [B, H, L, d] or [H, L, d], one dtype (bf16/fp16) and device; the [B, H, L, d]
            views of [B, L, H, d] tensors (FA4's layout, the usual projection output) pass without a copy. The
            mask has H heads (shared by the batch) or B*H. ceil(L / q_block) and ceil(L / kv_block) must be the
            plan's MB and NB; a partial last block is fine.
        plan: from wavealign.plan(); its blocks must be a size FA4 takes (128 x 128 at head_dim 128 on sm_90).
        scale: softmax scale; None = 1/sqrt(d).
        return_lse: also return LSE [B, H, L] (or [H, L]) float32 (natural log), in the original order.

    Runs permute_rows, flash_attn_func with block_sparse_tensors(plan, L) and unpermute_rows on the [B, L, H, d]
    views: the output of a row is FA4's for that row, so O is bit for bit FA4's original-order output on the
    same mask. Empty mask rows give O = 0 and LSE = -inf. An inference path: the permutation ops have no
    backward.
    """
    check_qkv(q, k, v, "wavealign.fa4", "FlashAttention-4")
    squeeze = q.dim() == 3
    if squeeze:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    batch, heads, length, head_dim = (int(n) for n in q.shape)
    plan = check_plan(plan, "FlashAttention-4")
    q_block, kv_block = plan.block_size
    if blocks_for(length, q_block) != plan.q_blocks:
        raise invalid("q", f"has {length} tokens = {blocks_for(length, q_block)} query blocks of {q_block}, "
                           f"the plan has {plan.q_blocks}")
    heads_view_shape((batch, heads), plan.heads, "q")
    scale = check_scale(scale, head_dim)
    cute, _ = _flash_attn_cute()
    tensors = block_sparse_tensors(plan, length, heads=heads, device=q.device)
    q_fa4, k_fa4, v_fa4 = (x.transpose(1, 2) for x in (q, k, v))  # FA4's [B, L, H, d]
    o_perm, lse_perm = cute.flash_attn_func(permute_rows(plan, q_fa4), k_fa4, v_fa4, softmax_scale=scale,
                                            block_sparse_tensors=tensors, return_lse=return_lse)
    o = unpermute_rows(plan, o_perm, seq_len=length).transpose(1, 2)
    lse = plan.unpermute_rows(lse_perm[..., None], seq_len=length)[..., 0] if return_lse else None
    if squeeze:
        o, lse = o.squeeze(0), None if lse is None else lse.squeeze(0)
    return (o, lse) if return_lse else o
