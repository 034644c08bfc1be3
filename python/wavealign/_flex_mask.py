"""The FlexAttention BlockMask of a plan's permuted mask (wavealign.flex.block_mask's body), and whether a plan's
FlexAttention mask masks tokens inside blocks. Plans are read through their attributes only, so the Plan can
build its own permuted BlockMask here without an import circle.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any, Callable

from ._util import blocks_for, check_int, invalid, require_torch


def permuted_block_mask(plan: Any, seq_len: int, *, device: Any = None) -> Any:
    """wavealign.flex.block_mask of a plan (see there), without the type check of its argument."""
    torch = require_torch("wavealign.flex.block_mask")
    from torch.nn.attention.flex_attention import BlockMask

    seq_len = check_int(seq_len, "seq_len", 1)
    q_block, kv_block = plan.block_size
    if blocks_for(seq_len, kv_block) != plan.kv_blocks:
        raise invalid("seq_len", f"= {seq_len} gives {blocks_for(seq_len, kv_block)} KV blocks of {kv_block}, "
                                 f"the plan has {plan.kv_blocks}")
    q_blocks = plan.q_blocks
    source = plan.source_block_mask
    tensors: dict[str, Any] = {}
    mask_mod = None
    if source is not None and _token_mask_mod(source) is not None:
        home = torch.as_tensor(source.kv_num_blocks).device
        device = home if device is None else torch.device(device)
        batch, heads = (int(n) for n in source.kv_num_blocks.shape[:2])
        permutation = torch.as_tensor(plan.permutation).to(home, torch.int64).view(batch, heads, q_blocks)
        for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
            value = getattr(source, name, None)
            if value is not None:
                value = _gather_rows(torch, torch.as_tensor(value), permutation).to(device)
            tensors[name] = value
        seq_lengths = getattr(source, "seq_lengths", None)
        q_len = int(seq_lengths[0]) if seq_lengths is not None else q_blocks * q_block
        mask_mod = _permuted_mask_mod(torch, _token_mask_mod(source), permutation.to(device), q_block, q_len)
        kept = _listed_blocks(torch, tensors, plan.kv_blocks)
    else:
        dense = _permuted_dense(torch, plan)
        if device is None:
            device = torch.as_tensor(source.kv_num_blocks).device if source is not None else dense.device
        dense = dense.to(torch.device(device))
        # Every kept block is a full block (no mask_mod evaluation on the compiled path); kept blocks first,
        # ascending; FlexAttention ignores the entries past each row's count.
        tensors["full_kv_num_blocks"] = dense.sum(-1, dtype=torch.int32)[None]
        tensors["full_kv_indices"] = torch.argsort((~dense).to(torch.uint8), dim=-1, stable=True).to(torch.int32)[None]
        tensors["kv_num_blocks"] = torch.zeros_like(tensors["full_kv_num_blocks"])
        tensors["kv_indices"] = torch.zeros_like(tensors["full_kv_indices"])
        kept = dense[None]
    mask_mod = _within_blocks(kept, (q_block, kv_block), mask_mod)
    options = {"BLOCK_SIZE": (q_block, kv_block), "mask_mod": mask_mod, "seq_lengths": (q_blocks * q_block, seq_len),
               "full_kv_num_blocks": tensors.get("full_kv_num_blocks"),
               "full_kv_indices": tensors.get("full_kv_indices")}
    accepted = inspect.signature(BlockMask.from_kv_blocks).parameters
    options = {name: value for name, value in options.items() if name in accepted and value is not None}
    return BlockMask.from_kv_blocks(tensors["kv_num_blocks"], tensors["kv_indices"], **options)


def masks_tokens(plan: Any) -> bool:
    """Whether the plan's FlexAttention mask masks tokens inside blocks: a mask_mod other than noop_mask, and at
    least one partial block (kv_num_blocks; full blocks need no mask_mod). False for dense and CSR plans.

    The count is read once per plan and mask version (for a CUDA BlockMask that read synchronizes once).
    """
    source = plan.source_block_mask
    if source is None or _token_mask_mod(source) is None:
        return False
    counts = source.kv_num_blocks
    version = getattr(counts, "_version", None)
    cached = _masks_tokens.get(plan)
    if cached is None or cached[0] != version:
        cached = (version, bool((counts != 0).any()))
        _masks_tokens[plan] = cached
    return cached[1]


_masks_tokens: weakref.WeakKeyDictionary[Any, tuple[Any, bool]] = weakref.WeakKeyDictionary()


def _token_mask_mod(source: Any) -> Callable | None:
    """The BlockMask's mask_mod unless it keeps every token (None or noop_mask, the default of from_kv_blocks)."""
    mask_mod = getattr(source, "mask_mod", None)
    return None if mask_mod is None or getattr(mask_mod, "__name__", "") == "noop_mask" else mask_mod


def _listed_blocks(torch: Any, tensors: dict[str, Any], kv_blocks: int) -> Any:
    """bool [B, H, MB, NB]: the blocks a BlockMask's (partial and full) index lists name."""
    batch, heads, q_blocks = (int(n) for n in tensors["kv_num_blocks"].shape)
    kept = torch.zeros(batch, heads, q_blocks, kv_blocks + 1, dtype=torch.bool,
                       device=tensors["kv_indices"].device)
    for count_name, index_name in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        count, index = tensors.get(count_name), tensors.get(index_name)
        if count is None:
            continue
        listed = torch.arange(index.shape[-1], device=index.device) < count[..., None]
        kept.scatter_(3, torch.where(listed, index.to(torch.int64), kv_blocks), True)
    return kept[..., :kv_blocks]


def _within_blocks(kept: Any, block: tuple[int, int], mask_mod: Callable | None) -> Callable:
    """mask_mod that keeps a token pair only inside a kept block (kept: bool [B, H, MB, NB]), and there where
    the given mask_mod (if any) keeps it."""
    q_block, kv_block = block
    batched, multi_head = kept.shape[0] > 1, kept.shape[1] > 1

    def within(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        keep = kept[b if batched else 0, h if multi_head else 0, q_idx // q_block, kv_idx // kv_block]
        return keep if mask_mod is None else keep & mask_mod(b, h, q_idx, kv_idx)

    return within


def _permuted_dense(torch: Any, plan: Any) -> Any:
    """bool [H, MB, NB] tensor of plan.permuted_mask() (a CSR mask is expanded on its device)."""
    shape = (plan.heads, plan.q_blocks, plan.kv_blocks)
    source = plan.source_block_mask
    if source is not None:
        # A BlockMask input (its permuted_mask() is this function's result): its partial and full blocks.
        dense = source.to_dense().to(torch.bool)[..., :shape[1], :shape[2]].reshape(shape)
        permutation = torch.as_tensor(plan.permutation).to(dense.device, torch.int64)
        return torch.gather(dense, 1, permutation[..., None].expand(-1, -1, shape[2]))
    permuted = plan.permuted_mask()
    if not isinstance(permuted, tuple):
        return torch.as_tensor(permuted).to(torch.bool).reshape(shape)
    row_ptr, col_idx = (torch.as_tensor(x).to(torch.int64) for x in permuted)
    rows = torch.arange(row_ptr.numel() - 1, device=row_ptr.device)
    row_of = torch.repeat_interleave(rows, row_ptr[1:] - row_ptr[:-1])
    dense = torch.zeros(shape[0] * shape[1], shape[2], dtype=torch.bool, device=row_ptr.device)
    dense[row_of, col_idx] = True
    return dense.reshape(shape)


def _gather_rows(torch: Any, value: Any, permutation: Any) -> Any:
    """Rows of a [B, H, MB] or [B, H, MB, W] FlexAttention tensor in plan order."""
    index = permutation.to(value.device)
    if value.dim() == 4:
        index = index[..., None].expand(-1, -1, -1, value.shape[-1])
    return torch.gather(value, 2, index)


def _permuted_mask_mod(torch: Any, mask_mod: Callable | None, permutation: Any, q_block: int,
                       q_len: int) -> Callable | None:
    """mask_mod over plan-ordered query positions: maps each back to its original position first."""
    if mask_mod is None:
        return None
    batch, heads, _ = permutation.shape

    def permuted(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        source_block = permutation[b if batch > 1 else 0, h if heads > 1 else 0, q_idx // q_block]
        source = torch.clamp(source_block * q_block + q_idx % q_block, max=q_len - 1)
        return mask_mod(b, h, source, kv_idx)

    return permuted
