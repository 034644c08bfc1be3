"""wavealign.sparse_attention(): block-sparse attention in plan order (fused CUDA kernel or CPU reference)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import _core, ops
from ._plan import Plan
from ._util import blocks_for, check_choice, check_scale, host_array, invalid, is_torch_tensor, torch_or_none

KERNELS = ("auto", "sm90", "sm80")


def sparse_attention(q: Any, k: Any, v: Any, plan: Plan, scale: float | None = None, return_lse: bool = False,
                     traversal: str = "ascending", *, head_order: str = "sequential", kernel: str = "auto") -> Any:
    """Block-sparse attention O = softmax(Q K^T * scale) V over the plan's mask, rows run in plan order.

    Args:
        q, k, v: [B, H, L, d] or [H, L, d], one dtype and device. The mask's heads are H (shared by the batch)
            or B*H (one mask per batch entry and head).
        plan: from wavealign.plan(); its blocks must cover L (MB = ceil(L / q_block), NB = ceil(L / kv_block)).
        scale: softmax scale; None = 1/sqrt(d).
        return_lse: also return LSE [B, H, L] (or [H, L]) float32, the natural log of the softmax denominator.
        traversal: "ascending" or "sawtooth" (odd waves walk their KV blocks backwards; CUDA only, the CPU
            reference always ascends: the result differs only by summation order).
        head_order: "sequential" or "concurrent-heads" schedule (see Plan.schedule).
        kernel: CUDA kernel family: "auto", "sm90" (Hopper) or "sm80" (portable).

    CUDA torch tensors (bf16/fp16) run the fused kernel on the current stream, without host synchronization.
    CPU tensors and numpy arrays run the CPU reference in float32; the output has q's dtype.
    Rows of an empty mask row get O = 0 and LSE = -inf.

    Returns:
        O with q's shape (and LSE when return_lse).
    """
    if not isinstance(plan, Plan):
        raise invalid("plan", f"must be a wavealign.Plan, got {type(plan).__name__}")
    check_choice(traversal, "traversal", "traversal")
    check_choice(head_order, "head_order", "head_order")
    if kernel not in KERNELS:
        raise invalid("kernel", f"unknown value {kernel!r} (expected one of: {', '.join(KERNELS)})")

    if is_torch_tensor(q):
        return _torch_call(q, k, v, plan, scale, return_lse, traversal, head_order, kernel)

    arrays = [host_array(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v"))]
    batch, heads, length, head_dim = _check_shapes([a.shape for a in arrays], plan)
    scale = check_scale(scale, head_dim)
    for array, name in zip(arrays, ("q", "k", "v")):
        if not (np.issubdtype(array.dtype, np.floating)):
            raise invalid(name, f"has dtype {array.dtype}, expected a floating-point dtype")
    q4, k4, v4 = (a.reshape(batch, heads, length, head_dim) for a in arrays)
    row_ptr, col_idx, schedule = plan._launch_arrays(batch, heads, head_order)
    offsets = np.arange(batch, dtype=np.int32)[:, None, None] * np.array([heads, 0], np.int32)
    o, lse = reference(q4, k4, v4, row_ptr, col_idx, _per_launch(schedule, batch, heads, plan.heads, offsets),
                       plan.block_size, scale)
    shape = arrays[0].shape
    o = o.reshape(shape).astype(arrays[0].dtype, copy=False)
    return (o, lse.reshape(shape[:-1])) if return_lse else o


def _check_shapes(shapes: list[tuple[int, ...]], plan: Plan) -> tuple[int, int, int, int]:
    """(B, H, L, d) of q, k, v after checking them against each other and the plan."""
    q_shape = tuple(int(n) for n in shapes[0])
    if len(q_shape) not in (3, 4):
        raise invalid("q", f"must be [B, H, L, d] or [H, L, d], got shape {list(q_shape)}")
    for shape, name in zip(shapes[1:], ("k", "v")):
        if tuple(int(n) for n in shape) != q_shape:
            raise invalid(name, f"has shape {list(shape)}, expected q's shape {list(q_shape)}")
    batch, heads, length, head_dim = (1, *q_shape) if len(q_shape) == 3 else q_shape
    if min(batch, heads, length, head_dim) < 1:
        raise invalid("q", f"has an empty dimension: {list(q_shape)}")
    q_block, kv_block = plan.block_size
    if blocks_for(length, q_block) != plan.q_blocks:
        raise invalid("q", f"has {length} tokens = {blocks_for(length, q_block)} query blocks of {q_block}, "
                           f"the plan has {plan.q_blocks}")
    if blocks_for(length, kv_block) != plan.kv_blocks:
        raise invalid("k", f"has {length} tokens = {blocks_for(length, kv_block)} KV blocks of {kv_block}, "
                           f"the plan has {plan.kv_blocks}")
    if plan.heads not in (heads, batch * heads):
        raise invalid("q", f"has {heads} heads and batch {batch}; the plan's mask has {plan.heads} heads "
                           f"(expected H = {heads} or B*H = {batch * heads})")
    return batch, heads, length, head_dim


def _per_launch(schedule: Any, batch: int, heads: int, mask_heads: int, offsets: Any) -> Any:
    """A batch schedule [batch*heads*MB, 2] (heads b*heads + h) as one schedule per launch [Bs, heads*MB, 2]
    with heads numbered within the launch: Bs = 1 for a mask shared by the batch, else one per entry.
    offsets: (b*heads, 0) per entry, [batch, 1, 2], in the schedule's framework."""
    per_entry = schedule.reshape(batch, -1, 2) - offsets
    return per_entry[:1] if mask_heads == heads else per_entry


def _launches(batch: int, heads: int, mask_heads: int, q_blocks: int) -> list[tuple[int, int, int]]:
    """(batch entry, first mask row, schedule index) of each launch: one launch per batch entry."""
    shared = mask_heads == heads
    return [(b, 0 if shared else b * heads * q_blocks, 0 if shared else b) for b in range(batch)]


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, row_ptr: np.ndarray, col_idx: np.ndarray,
              schedules: np.ndarray, block_size: tuple[int, int], scale: float) -> tuple[np.ndarray, np.ndarray]:
    """CPU reference on [B, H, L, d] host arrays: (O float32 [B, H, L, d], LSE float32 [B, H, L]).

    schedules: int32 [Bs, H*MB, 2], one per launch (Bs = 1 for a mask shared by the batch).
    """
    batch, heads, length, head_dim = q.shape
    q_block, kv_block = block_size
    q_blocks = blocks_for(length, q_block)
    mask_heads = (len(row_ptr) - 1) // q_blocks
    q32, k32, v32 = (np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v))
    o = np.empty((batch, heads, length, head_dim), np.float32)
    lse = np.empty((batch, heads, length), np.float32)
    rows = heads * q_blocks
    for b, first_row, schedule in _launches(batch, heads, mask_heads, q_blocks):
        _core.reference_attention(q32[b], k32[b], v32[b], o[b], lse[b], row_ptr[first_row:first_row + rows + 1],
                                  col_idx, q_block, kv_block, scale, schedules[schedule])
    return o, lse


def _torch_call(q: Any, k: Any, v: Any, plan: Plan, scale: float | None, return_lse: bool, traversal: str,
                head_order: str, kernel: str) -> Any:
    torch = torch_or_none()
    ops.register()
    for x, name in ((k, "k"), (v, "v")):
        if not isinstance(x, torch.Tensor):
            raise invalid(name, f"must be a torch.Tensor like q, got {type(x).__name__}")
        if x.device != q.device:
            raise invalid(name, f"is on {x.device}, q is on {q.device}")
        if x.dtype != q.dtype:
            raise invalid(name, f"has dtype {x.dtype}, q has {q.dtype}")
    if not q.dtype.is_floating_point:
        raise invalid("q", f"has dtype {q.dtype}, expected a floating-point dtype")
    batch, heads, length, head_dim = _check_shapes([tuple(q.shape), tuple(k.shape), tuple(v.shape)], plan)
    scale = check_scale(scale, head_dim)
    if q.device.type == "cuda":
        check_cuda_dtype(q.dtype)
    row_ptr, col_idx, schedule, error = plan._launch_tensors(q.device, batch, heads, head_order)
    if error is not None:
        plan.check()  # the kernel does not read the device validation record: read it here (one synchronization)
    offsets = (torch.arange(batch, dtype=torch.int32, device=schedule.device)[:, None, None] *
               torch.tensor([heads, 0], dtype=torch.int32, device=schedule.device))
    schedules = _per_launch(schedule, batch, heads, plan.heads, offsets)
    squeeze = q.dim() == 3
    if squeeze:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    o, lse = torch.ops.wavealign.sparse_attention(q, k, v, row_ptr, col_idx, schedules,
                                                  plan.block_size[0], plan.block_size[1], scale, traversal, kernel)
    if squeeze:
        o, lse = o.squeeze(0), lse.squeeze(0)
    return (o, lse) if return_lse else o


def check_cuda_dtype(dtype: Any) -> str:
    """The kernel's element type name for a torch dtype (bf16 / fp16 only)."""
    torch = torch_or_none()

    names = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
    if dtype not in names:
        raise invalid("q", f"has dtype {dtype}; the CUDA kernel takes torch.bfloat16 or torch.float16")
    return names[dtype]


# ---- the op bodies (registered by wavealign.ops) -------------------------------------------------------------

def _same_layout(a: Any, b: Any) -> bool:
    """Equal strides wherever the size is above 1 (a size-1 dimension is never stepped over)."""
    return all(size == 1 or sa == sb for size, sa, sb in zip(a.shape, a.stride(), b.stride()))


def output_like(q: Any, k: Any, v: Any) -> tuple[Any, Any, bool]:
    """(O, LSE) buffers for q [B, H, L, d], and whether q, k, v must be made contiguous first.

    The kernel reads q, k, v and writes O with one set of strides. When k and v share q's strides and
    empty_like(q) reproduces them (q is dense), O takes them and nothing is copied; otherwise q, k, v and O
    are all contiguous. The fake (meta) implementation calls this too, so both agree on O's strides.
    """
    import torch

    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    if q.stride(-1) == 1 and _same_layout(q, k) and _same_layout(q, v):
        o = torch.empty_like(q)
        if _same_layout(q, o):
            return o, lse, False
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), lse, True


def attention_op_cpu(q: Any, k: Any, v: Any, row_ptr: Any, col_idx: Any, schedules: Any, q_block: int,
                     kv_block: int, scale: float) -> tuple[Any, Any]:
    """CPU torch tensors through the float32 reference; O is cast back to q's dtype."""
    import torch

    arrays = [x.detach().to(torch.float32).contiguous().numpy() for x in (q, k, v)]
    o, lse = reference(*arrays, row_ptr.numpy(), col_idx.numpy(), schedules.numpy(), (q_block, kv_block), scale)
    return torch.from_numpy(o).to(q.dtype), torch.from_numpy(lse)


@functools.lru_cache(maxsize=64)
def _supported(heads: int, tokens: int, head_dim: int, q_block: int, kv_block: int, element: str, kernel: str,
               device: int) -> tuple[bool, str, str]:
    return _core.cuda_query_support(heads, tokens, head_dim, q_block, kv_block, element, kernel, device)


def attention_op_cuda(q: Any, k: Any, v: Any, row_ptr: Any, col_idx: Any, schedules: Any, q_block: int,
                      kv_block: int, scale: float, traversal: str, kernel: str) -> tuple[Any, Any]:
    """The fused kernel, one launch per batch entry, on the current torch stream of q's device."""
    import torch

    if not _core.has_cuda:
        raise RuntimeError("wavealign was built without its CUDA kernels (nvcc was not found when it was "
                           "compiled), so CUDA tensors cannot run the fused kernel; use CPU tensors (reference) "
                           "or the plug-in path (Plan.permute_rows with your own kernel)")
    element = check_cuda_dtype(q.dtype)
    o, lse, copy = output_like(q, k, v)
    if copy:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    batch, heads, length, head_dim = q.shape
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    supported, reason, _ = _supported(heads, length, head_dim, q_block, kv_block, element, kernel, device)
    if not supported:
        raise RuntimeError(f"the wavealign CUDA kernel cannot run this call: {reason}")
    workspace = torch.empty(_core.cuda_workspace_bytes(heads, length, head_dim, q_block, kv_block, element, kernel),
                            dtype=torch.uint8, device=q.device)
    q_blocks = blocks_for(length, q_block)
    mask_heads = (row_ptr.numel() - 1) // q_blocks
    item = q.element_size()
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream().cuda_stream
        for b, first_row, schedule in _launches(batch, heads, mask_heads, q_blocks):
            _core.cuda_sparse_attention(
                q.data_ptr() + b * q.stride(0) * item, k.data_ptr() + b * k.stride(0) * item,
                v.data_ptr() + b * v.stride(0) * item, o.data_ptr() + b * o.stride(0) * item,
                lse.data_ptr() + b * heads * length * 4, row_ptr.data_ptr() + first_row * 8, col_idx.data_ptr(),
                schedules[schedule].data_ptr(), workspace.data_ptr(), stream, heads, length, head_dim, q_block,
                kv_block, element, scale, q.stride(1), q.stride(2), traversal, kernel)
    return o, lse
