"""FlexAttention in WaveAlign order: a BlockMask over the plan-ordered query blocks.

    plan = wavealign.plan(mask)                        # dense, CSR or a FlexAttention BlockMask
    q_perm = plan.permute_rows(q)                      # [B, H, MB*q_block, d]
    o_perm = flex_attention(q_perm, k, v, block_mask=wavealign.flex.block_mask(plan, L))
    o = plan.unpermute_rows(o_perm, seq_len=L)         # equal to flex_attention in the original order

Only the query side moves: K and V stay in place, and row p of the new mask is row permutation[p] of the old.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from ._plan import Plan
from ._util import blocks_for, check_int, invalid, require_torch


def block_mask(plan: Plan, seq_len: int, *, device: Any = None) -> Any:
    """torch.nn.attention.flex_attention.BlockMask of the plan's permuted mask.

    Args:
        plan: from wavealign.plan().
        seq_len: KV length L (tokens of k and v); its KV blocks must be the plan's.
        device: where the mask's tensors go; default: the plan's input device (torch inputs) or the CPU.

    The query length of the mask is MB*q_block, the length of plan.permute_rows(q). For a plan built from a
    FlexAttention BlockMask, partial and full blocks stay apart and mask_mod sees original query positions
    (token q of block p is token q of block permutation[p]; padding tokens are clamped into the sequence).
    A plan from a dense or CSR mask gives every kept block in full (no mask_mod), with its heads as
    FlexAttention's head dimension and batch 1.
    """
    torch = require_torch("wavealign.flex.block_mask")
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(plan, Plan):
        raise invalid("plan", f"must be a wavealign.Plan, got {type(plan).__name__}")
    seq_len = check_int(seq_len, "seq_len", 1)
    q_block, kv_block = plan.block_size
    if blocks_for(seq_len, kv_block) != plan.kv_blocks:
        raise invalid("seq_len", f"= {seq_len} gives {blocks_for(seq_len, kv_block)} KV blocks of {kv_block}, "
                                 f"the plan has {plan.kv_blocks}")
    source = plan._source
    if device is None:
        device = source.device if source.framework == "torch" else torch.device("cpu")
    device = torch.device(device)
    q_blocks = plan.q_blocks
    tensors: dict[str, Any] = {}
    mask_mod = None
    if source.format == "flex":
        batch, heads = source.flex_batch_heads
        permutation = torch.as_tensor(plan.permutation).to(torch.int64).view(batch, heads, q_blocks)
        for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
            value = getattr(source.flex, name, None)
            tensors[name] = None if value is None else _gather_rows(torch, value, permutation).to(device)
        mask_mod = _permuted_mask_mod(torch, getattr(source.flex, "mask_mod", None), permutation.to(device),
                                      q_block, source.seq_lengths[0])
    else:
        counts, indices = plan._permuted_flex_arrays()
        tensors["kv_num_blocks"] = torch.from_numpy(counts).view(1, plan.heads, q_blocks).to(device)
        tensors["kv_indices"] = torch.from_numpy(indices).view(1, plan.heads, q_blocks, plan.kv_blocks).to(device)
    options = {"BLOCK_SIZE": (q_block, kv_block), "mask_mod": mask_mod, "seq_lengths": (q_blocks * q_block, seq_len),
               "full_kv_num_blocks": tensors.get("full_kv_num_blocks"),
               "full_kv_indices": tensors.get("full_kv_indices")}
    accepted = inspect.signature(BlockMask.from_kv_blocks).parameters
    options = {name: value for name, value in options.items() if name in accepted and value is not None}
    return BlockMask.from_kv_blocks(tensors["kv_num_blocks"], tensors["kv_indices"], **options)


def _gather_rows(torch: Any, value: Any, permutation: Any) -> Any:
    """Rows of a [B, H, MB] or [B, H, MB, W] FlexAttention tensor in plan order."""
    index = permutation.to(value.device)
    if value.dim() == 4:
        index = index[..., None].expand(-1, -1, -1, value.shape[-1])
    return torch.gather(value, 2, index)


def _permuted_mask_mod(torch: Any, mask_mod: Callable | None, permutation: Any, q_block: int,
                       q_len: int) -> Callable | None:
    """mask_mod over plan-ordered query positions: maps each back to its original position first."""
    if mask_mod is None or getattr(mask_mod, "__name__", "") == "noop_mask":
        return None
    batch, heads, _ = permutation.shape

    def permuted(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        source_block = permutation[b if batch > 1 else 0, h if heads > 1 else 0, q_idx // q_block]
        source = torch.clamp(source_block * q_block + q_idx % q_block, max=q_len - 1)
        return mask_mod(b, h, source, kv_idx)

    return permuted
