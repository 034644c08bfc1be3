"""What the plug-in backends (wavealign.fa4, wavealign.sparge) share: the permuted mask as per-row block lists or
as a dense block map on a torch device, and the checks of q, k and v before another library's kernel sees them."""

from __future__ import annotations

from typing import Any

from . import flex
from ._plan import Plan
from ._util import check_int, invalid, require_torch


def permuted_block_lists(plan: Plan, device: Any, caller: str = "wavealign.fa4") -> tuple[Any, Any]:
    """(counts int32 [H, MB], indices int32 [H, MB, W]) of the permuted mask on `device`: row p of head h lists
    the kept KV blocks of original row permutation[h, p], ascending and packed left; W = max(1, longest row)."""
    torch = require_torch(caller)
    device = torch.device(device)
    # The plug-in kernels read no validation record: an invalid mask raises here. The CSR is the one the fused kernel reads
    # (on a GPU plan's own device without a copy; Plan.csr() would hand back a copy made through the host).
    plan.check()
    row_ptr, col_idx, _, _ = plan._launch_tensors(device, 1, plan.heads, "sequential")
    col_idx = col_idx[:int(row_ptr[-1])]  # a dense or Flex mask's column buffer is capacity-sized
    permutation = torch.as_tensor(plan.permutation).to(device=device, dtype=torch.int64)
    rows = plan.heads * plan.q_blocks
    lengths = row_ptr[1:] - row_ptr[:-1]
    width = max(1, int(lengths.max()))
    row_of_entry = torch.repeat_interleave(torch.arange(rows, device=device), lengths, output_size=col_idx.numel())
    slot_of_entry = torch.arange(col_idx.numel(), device=device) - row_ptr[row_of_entry]
    indices = torch.zeros((rows, width), dtype=torch.int32, device=device)
    indices[row_of_entry, slot_of_entry] = col_idx.to(torch.int32)
    counts = torch.gather(lengths.view(plan.heads, plan.q_blocks), 1, permutation).to(torch.int32)
    indices = torch.gather(indices.view(plan.heads, plan.q_blocks, width), 1,
                           permutation[:, :, None].expand(-1, -1, width))
    return counts.contiguous(), indices.contiguous()


def permuted_dense_blocks(plan: Plan, device: Any, caller: str) -> Any:
    """bool [H, MB, NB] on `device`: row p of head h is original row permutation[h, p] of the mask."""
    torch = require_torch(caller)
    counts, indices = permuted_block_lists(plan, device, caller)
    kept = torch.arange(indices.shape[-1], device=counts.device) < counts[..., None]
    # Slots past a row's count point at a spill column NB that is cut off again.
    columns = torch.where(kept, indices.long(), plan.kv_blocks)
    dense = torch.zeros((plan.heads, plan.q_blocks, plan.kv_blocks + 1), dtype=torch.bool, device=counts.device)
    dense.scatter_(2, columns, True)
    return dense[..., :plan.kv_blocks]


def check_qkv(q: Any, k: Any, v: Any, caller: str, kernel: str) -> None:
    """q, k, v: CUDA tensors of one shape ([B, H, L, d] or [H, L, d]), dtype (bf16/fp16) and device."""
    torch = require_torch(caller)
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(x, torch.Tensor):
            raise invalid(name, f"must be a torch.Tensor, got {type(x).__name__}")
        if x.device.type != "cuda":
            raise invalid(name, f"is on {x.device}: {kernel} runs on CUDA tensors")
        if x.dtype != q.dtype or x.device != q.device:
            raise invalid(name, f"is {x.dtype} on {x.device}, q is {q.dtype} on {q.device}")
    if q.dim() not in (3, 4):
        raise invalid("q", f"must be [B, H, L, d] or [H, L, d], got shape {list(q.shape)}")
    for x, name in ((k, "k"), (v, "v")):
        if x.shape != q.shape:
            raise invalid(name, f"has shape {list(x.shape)}, expected q's shape {list(q.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise invalid("q", f"has dtype {q.dtype}; {kernel} takes torch.bfloat16 or torch.float16")


def check_plan(plan: Any, kernel: str) -> Plan:
    """A Plan whose every kept block the kernel may compute in full: a FlexAttention mask whose partial blocks
    carry a mask_mod is refused, naming `plan` (the kernel would compute those blocks unmasked)."""
    if not isinstance(plan, Plan):
        raise invalid("plan", f"must be a wavealign.Plan, got {type(plan).__name__}")
    if flex.masks_tokens(plan):
        raise invalid("plan", "was built from a FlexAttention BlockMask whose partial blocks carry a mask_mod "
                              f"(token-level masking inside blocks); {kernel} gets every kept block in full, so "
                              "those blocks would be computed unmasked. Build the BlockMask from full blocks "
                              "only, or run FlexAttention in plan order with wavealign.flex.block_mask(plan, "
                              "seq_len), which keeps the mask_mod")
    return plan


def mask_batch_heads(plan: Plan, heads: int | None) -> tuple[int, int]:
    """(B, H) of a plug-in kernel's per-(batch, head) mask arrays: H = the attention's heads; B = 1 for a mask
    shared by the batch, else mask heads / H (one mask per batch entry and head). A one-head plan gives (1, 1):
    one mask for every head and batch entry. heads None: the BlockMask's (B, H) for a FlexAttention plan, else
    all mask heads with B = 1."""
    if heads is None:
        source = plan.source_block_mask
        return (1, plan.heads) if source is None else tuple(int(n) for n in source.kv_num_blocks.shape[:2])
    heads = check_int(heads, "heads", 1)
    if plan.heads == 1:
        return 1, 1
    if plan.heads % heads:
        raise invalid("heads", f"= {heads} does not divide the plan's {plan.heads} mask heads "
                               "(the mask has H heads, or B*H: one per batch entry and head)")
    return plan.heads // heads, heads
