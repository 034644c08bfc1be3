"""SpargeAttn's 8-bit block-sparse kernel in WaveAlign order (the plug-in path, as wavealign.fa4 is for FA4).

    from wavealign import sparge
    plan = wavealign.plan(block_mask)                      # 128 x 128 blocks (dense, CSR or FlexAttention)
    o = sparge.sparse_attention(q, k, v, plan)             # [B, H, L, d] in the original order
    # the same by hand, around your own SpargeAttn call on [B, H, L, d] tensors:
    from spas_sage_attn import block_sparse_sage2_attn_cuda
    mask_id = sparge.mask_id(plan, L, heads=H, device=q.device)     # int32 [B, H, rows, columns], plan order
    o_perm = block_sparse_sage2_attn_cuda(plan.permute_rows(q), k, v, mask_id=mask_id, tensor_layout="HND")
    o = plan.unpermute_rows(o_perm, seq_len=L)

SpargeAttn (thu-ml/SpargeAttn) quantizes Q per block of query rows and K per block of keys, and its mask has one
entry per (query-row block, key block) of those sizes: on sm_90 64 query rows x 128 keys (`mask_id` is
[B, H, ceil(L/64), ceil(L/128)]), on sm_80/86/87/89 128 x 64. A plan's blocks must be whole multiples of them;
each plan block then covers whole SpargeAttn blocks, and mask_id repeats its bit over them.

Only the query side moves: K and V stay in place, Q blocks go into plan order (Plan.permute_rows: a partial last
block is zero-padded, so the permuted length is MB * q_block). Q's quantization groups are whole rows of one plan
block, K's mean and scales do not depend on the query order, and each query block's kept key blocks are visited
in ascending order in both orders, so every output row is the one SpargeAttn computes in the original order:
unpermuted, the output is bit for bit the original-order output (tested on the GPU). spas_sage_attn is imported
on first use, never when wavealign.sparge is imported.
"""

from __future__ import annotations

import weakref
from typing import Any

from ._plan import Plan
from ._plugin import check_plan, check_qkv, mask_batch_heads, permuted_dense_blocks
from ._util import blocks_for, check_int, check_scale, heads_view_shape, invalid, require_torch

CALLER = "wavealign.sparge"
# (query rows, keys) per SpargeAttn mask entry by compute capability: its sm_90 kernel quantizes Q per 64 rows
# and K per 128 keys (spas_sage_attn.core.block_sparse_sage2_attn_cuda), the sm_80/sm_89 kernels 128 and 64.
SM90_BLOCK = (64, 128)
SM80_BLOCK = (128, 64)

# Per plan: the mask_id tensors made for (seq_len, batch, heads, block, device).
_mask_ids_of_plan: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _spas_sage_attn() -> Any:
    try:
        import spas_sage_attn
    except ImportError as error:
        raise ImportError("wavealign.sparge needs SpargeAttn (spas_sage_attn, built from thu-ml/SpargeAttn; its "
                          f"8-bit kernels run on sm_80 and newer): import spas_sage_attn failed: {error}") from error
    return spas_sage_attn


def block_of_device(device: Any) -> tuple[int, int]:
    """SpargeAttn's (query rows, keys) per mask entry on a CUDA device: SM90_BLOCK on sm_90, else SM80_BLOCK."""
    torch = require_torch(CALLER)
    return SM90_BLOCK if torch.cuda.get_device_capability(torch.device(device)) == (9, 0) else SM80_BLOCK


def _check_block(plan: Plan, block: Any) -> tuple[int, int]:
    if not (isinstance(block, tuple) and len(block) == 2):
        raise invalid("block", f"must be a (query rows, keys) tuple, got {block!r}")
    rows, keys = (check_int(n, "block", 1) for n in block)
    q_block, kv_block = plan.block_size
    if q_block % rows or kv_block % keys:
        raise invalid("plan", f"has {q_block} x {kv_block} blocks; SpargeAttn's mask entries here are {rows} x "
                              f"{keys}, and each plan block must cover whole entries (plan with block_size "
                              f"multiples of {rows} x {keys}, e.g. 128)")
    return rows, keys


def mask_id(plan: Plan, seq_len: int, *, heads: int | None = None, device: Any = None,
            block: tuple[int, int] | None = None) -> Any:
    """SpargeAttn's `mask_id` of the plan's permuted mask: int32 [B, H, MB*q_block/rows, ceil(seq_len/keys)].

    Args:
        plan: from wavealign.plan(); its blocks must be multiples of `block`; a FlexAttention mask must have no
            partial blocks under a mask_mod (SpargeAttn would run them unmasked: ValueError naming `plan`).
        seq_len: KV length L (tokens of k and v); its KV blocks must be the plan's.
        heads: the attention's heads H. The mask has H heads (shared by the batch: B = 1), B*H heads (one per
            batch entry and head), or 1 (repeated over H). Default: the BlockMask's (B, H) for a FlexAttention
            plan, else all mask heads with B = 1.
        device: where the tensor goes (SpargeAttn needs q's device); default: the plan's input device (torch
            inputs) or the CPU.
        block: (query rows, keys) per entry; default block_of_device(device) on CUDA, SM90_BLOCK on the CPU.

    Entry (b, h, r, c) is 1 when the plan's permuted row of query rows r*rows.. (row p = original query block
    permutation[h, p]) keeps the key block holding keys c*keys..; the rows cover the permuted (padded) query
    length MB * q_block, the length of plan.permute_rows(q). Made once per plan, length, heads, block and device
    and cached with the plan; making it synchronizes the device (cached tensors are complete before any stream
    reads them).
    """
    torch = require_torch(CALLER)
    plan = check_plan(plan, "SpargeAttn")
    seq_len = check_int(seq_len, "seq_len", 1)
    q_block, kv_block = plan.block_size
    if blocks_for(seq_len, kv_block) != plan.kv_blocks:
        raise invalid("seq_len", f"= {seq_len} gives {blocks_for(seq_len, kv_block)} KV blocks of {kv_block}, "
                                 f"the plan has {plan.kv_blocks}")
    if device is None:
        permutation = plan.permutation
        device = permutation.device if isinstance(permutation, torch.Tensor) else "cpu"
    device = torch.device(device)
    if block is None:
        block = block_of_device(device) if device.type == "cuda" else SM90_BLOCK
    rows, keys = _check_block(plan, block)
    batch, attention_heads = mask_batch_heads(plan, heads)
    if plan.heads == 1 and heads is not None:
        attention_heads = heads  # SpargeAttn reads a mask per head: the one mask is repeated over them
    cache = _mask_ids_of_plan.setdefault(plan, {})
    key = (seq_len, batch, attention_heads, rows, keys, device.type, device.index)
    if key not in cache:
        dense = permuted_dense_blocks(plan, device, CALLER)          # [mask heads, MB, NB]
        entries = dense.repeat_interleave(q_block // rows, dim=1).repeat_interleave(kv_block // keys, dim=2)
        entries = entries[:, :, :blocks_for(seq_len, keys)]          # a partial last KV block: fewer key entries
        if plan.heads == 1:
            entries = entries.expand(attention_heads, -1, -1)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        cache[key] = entries.reshape(batch, attention_heads, *entries.shape[1:]).to(torch.int32).contiguous()
    return cache[key]


def sparse_attention(q: Any, k: Any, v: Any, plan: Plan, scale: float | None = None, *,
                     pvthreshd: float = 50, smooth_k: bool = True) -> Any:
    """SpargeAttn's block-sparse 8-bit attention in plan order; O comes back in the original order.

    Args:
        q, k, v: CUDA tensors [B, H, L, d] or [H, L, d], one dtype (bf16/fp16), d = 64 or 128. The mask has H
            heads (shared by the batch), B*H or 1. ceil(L / q_block) and ceil(L / kv_block) must be the plan's
            MB and NB; a partial last block is fine.
        plan: from wavealign.plan(); blocks multiples of SpargeAttn's (64 x 128 on sm_90, 128 x 64 before).
        scale: softmax scale; None = 1/sqrt(d).
        pvthreshd, smooth_k: block_sparse_sage2_attn_cuda's own arguments, passed through (its defaults).

    Runs plan.permute_rows(q), block_sparse_sage2_attn_cuda(..., mask_id=mask_id(plan, L)) and
    plan.unpermute_rows: each output row is SpargeAttn's for that row, so O is bit for bit SpargeAttn's
    original-order output on the same mask. An inference path: the permutation ops have no backward.
    """
    check_qkv(q, k, v, CALLER, "SpargeAttn")
    plan = check_plan(plan, "SpargeAttn")
    squeeze = q.dim() == 3
    if squeeze:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    batch, heads, length, head_dim = (int(n) for n in q.shape)
    if head_dim not in (64, 128):
        raise invalid("q", f"has head_dim {head_dim}; SpargeAttn's kernels take 64 or 128")
    q_block = plan.block_size[0]
    if blocks_for(length, q_block) != plan.q_blocks:
        raise invalid("q", f"has {length} tokens = {blocks_for(length, q_block)} query blocks of {q_block}, "
                           f"the plan has {plan.q_blocks}")
    if plan.heads != 1:
        heads_view_shape((batch, heads), plan.heads, "q")
    scale = check_scale(scale, head_dim)
    entries = mask_id(plan, length, heads=heads, device=q.device)
    if entries.shape[0] not in (1, batch):
        raise invalid("q", f"has batch {batch}; the plan's {plan.heads} mask heads are {entries.shape[0]} x "
                           f"{heads} (batch x heads)")
    entries = entries.expand(batch, *entries.shape[1:]).contiguous()
    o_perm = _spas_sage_attn().block_sparse_sage2_attn_cuda(
        plan.permute_rows(q).contiguous(), k.contiguous(), v.contiguous(), mask_id=entries, scale=scale,
        smooth_k=smooth_k, pvthreshd=pvthreshd, tensor_layout="HND")
    o = plan.unpermute_rows(o_perm, seq_len=length)
    return o.squeeze(0) if squeeze else o
