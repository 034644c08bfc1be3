"""FlexAttention in WaveAlign order: a BlockMask over the plan-ordered query blocks.

    plan = wavealign.plan(mask)                        # dense, CSR or a FlexAttention BlockMask
    q_perm = plan.permute_rows(q)                      # [B, H, MB*q_block, d]
    o_perm = flex_attention(q_perm, k, v, block_mask=wavealign.flex.block_mask(plan, L))
    o = plan.unpermute_rows(o_perm, seq_len=L)         # equal to flex_attention in the original order

Only the query side moves: K and V stay in place, and row p of the new mask is row permutation[p] of the old.
The mask_mod of a FlexAttention mask is kept, so this is also the path for masks with partial blocks, which
wavealign.sparse_attention refuses (its kernel computes whole blocks).
"""

from __future__ import annotations

from typing import Any

from . import _flex_mask
from ._plan import Plan
from ._util import invalid

__all__ = ["block_mask", "masks_tokens"]


def block_mask(plan: Plan, seq_len: int, *, device: Any = None) -> Any:
    """torch.nn.attention.flex_attention.BlockMask of the plan's permuted mask.

    Args:
        plan: from wavealign.plan().
        seq_len: KV length L (tokens of k and v); its KV blocks must be the plan's.
        device: where the mask's tensors go; default: the plan's input device (torch inputs) or the CPU.

    The query length of the mask is MB*q_block, the length of plan.permute_rows(q). For a plan built from a
    FlexAttention BlockMask, partial and full blocks stay apart and mask_mod sees original query positions
    (token q of block p is token q of block permutation[p]; padding tokens are clamped into the sequence), so
    token-level masking inside partial blocks is kept. A plan from a dense or CSR mask (or a BlockMask without
    a mask_mod) gives every kept block in the full arrays, with its heads as FlexAttention's head dimension
    and batch 1.

    The mask_mod of the result also keeps only the plan's blocks. Compiled flex_attention never evaluates it
    on full blocks (so it costs nothing there), but eager flex_attention (the CPU path) ignores the block lists
    and evaluates mask_mod over the whole score matrix: without it, a mask of full blocks would run as dense
    attention there.
    """
    if not isinstance(plan, Plan):
        raise invalid("plan", f"must be a wavealign.Plan, got {type(plan).__name__}")
    return _flex_mask.permuted_block_mask(plan, seq_len, device=device)


masks_tokens = _flex_mask.masks_tokens
