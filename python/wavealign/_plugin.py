"""What the plug-in backends (wavealign.fa4, wavealign.sparge) share: the permuted mask as per-row block lists or
as a dense block map on a torch device, and the checks of q, k and v before another library's kernel sees them."""

from __future__ import annotations

from typing import Any

from ._plan import Plan
from ._util import invalid, require_torch


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
