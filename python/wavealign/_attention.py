"""wavealign.sparse_attention(): block-sparse attention in plan order (fused CUDA kernel or CPU reference).

The front checks the call against the plan and hands the plan's launch tensors to the op
(torch.ops.wavealign.sparse_attention, whose bodies live in wavealign.ops); numpy inputs go to the CPU
reference directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core, _flex_mask, ops
from ._plan import Plan
from ._util import check_choice, check_flag, check_scale, host_array, invalid, is_torch_tensor, torch_or_none


def sparse_attention(q: Any, k: Any, v: Any, plan: Plan, scale: float | None = None, return_lse: bool = False,
                     traversal: str = "ascending", *, head_order: str = "sequential", kernel: str = "auto",
                     precision: str = "native") -> Any:
    """Block-sparse attention O = softmax(Q K^T * scale) V over the plan's mask, rows run in plan order.

    Args:
        q, k, v: [B, H, L, d] or [H, L, d], one dtype and device. The mask's heads are H (shared by the batch),
            B*H (one mask per batch entry and head) or 1 (one mask shared by every head).
        plan: from wavealign.plan(); its blocks must cover L (MB = ceil(L / q_block), NB = ceil(L / kv_block)).
            A plan of a FlexAttention BlockMask whose partial blocks carry a mask_mod is refused (the kernel
            computes whole blocks): run those with FlexAttention through the plug-in path.
        scale: softmax scale; None = 1/sqrt(d).
        return_lse: also return LSE [B, H, L] (or [H, L]) float32, the natural log of the softmax denominator.
        traversal: "ascending" or "sawtooth" (odd waves walk their KV blocks backwards; CUDA only, the CPU
            reference always ascends: the result differs only by summation order).
        head_order: "sequential" or "concurrent-heads" schedule (see Plan.schedule).
        kernel: CUDA kernel family: "auto", "sm90" (Hopper) or "sm80" (portable).
        precision: "native" (the inputs' bf16/fp16 on the tensor cores) or "int8": q and k quantized to INT8
            (q per row, k per 128-key block after subtracting its mean over the sequence), P and v to FP8 e4m3,
            every block's P V added into O in fp32 (docs/kernel-8bit.md); the quantization runs in the call.
            On CUDA the 8-bit Hopper kernel (sm_90, head_dim 128, 128 x 128 blocks); on the CPU the kernel's
            exact emulation (integer Q K^T, the same FP8 roundings) in place of the float32 reference.

    CUDA torch tensors (bf16/fp16) run the fused kernel on the current stream, the whole batch in one launch,
    without host synchronization. CPU tensors and numpy arrays run the CPU reference in float32; the output
    has q's dtype. Rows of an empty mask row get O = 0 and LSE = -inf. There is no backward: inputs that
    require grad (with grad mode on) are refused.

    Returns:
        O with q's shape (and LSE when return_lse).
    """
    if not isinstance(plan, Plan):
        raise invalid("plan", f"must be a wavealign.Plan, got {type(plan).__name__}")
    check_choice(traversal, "traversal", "traversal")
    check_choice(head_order, "head_order", "head_order")
    check_choice(kernel, "kernel", "kernel")
    check_choice(precision, "precision", "precision")
    return_lse = check_flag(return_lse, "return_lse")
    if _flex_mask.masks_tokens(plan):
        raise invalid("plan", "was built from a FlexAttention BlockMask whose partial blocks carry a mask_mod "
                              "(token-level masking inside blocks), which this kernel does not apply: it would "
                              "compute those blocks in full. Run FlexAttention in plan order instead "
                              "(flex_attention(plan.permute_rows(q), k, v, block_mask=wavealign.flex.block_mask("
                              "plan, L)), then plan.unpermute_rows), or build the plan from a mask of whole "
                              "blocks only (no mask_mod, or its full_kv_num_blocks / full_kv_indices)")

    if is_torch_tensor(q):
        return _torch_call(q, k, v, plan, scale, return_lse, traversal, head_order, kernel, precision)

    arrays = [host_array(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v"))]
    batch, heads, length, head_dim = _check_shapes([a.shape for a in arrays], plan)
    scale = check_scale(scale, head_dim)
    if not np.issubdtype(arrays[0].dtype, np.floating):
        raise invalid("q", f"has dtype {arrays[0].dtype}, expected a floating-point dtype")
    for array, name in zip(arrays[1:], ("k", "v")):
        if array.dtype != arrays[0].dtype:
            raise invalid(name, f"has dtype {array.dtype}, q has {arrays[0].dtype}")
    q4, k4, v4 = (a.reshape(batch, heads, length, head_dim) for a in arrays)
    row_ptr, col_idx, schedule = plan._launch_arrays(batch, heads, head_order)
    o, lse = ops.reference(q4, k4, v4, row_ptr, col_idx, schedule, plan.block_size, scale, precision)
    shape = arrays[0].shape
    o = o.reshape(shape).astype(arrays[0].dtype, copy=False)
    return (o, lse.reshape(shape[:-1])) if return_lse else o


def _check_shapes(shapes: list[tuple[int, ...]], plan: Plan) -> tuple[int, int, int, int]:
    """(B, H, L, d) of q, k, v after checking them against each other and the plan (wavealign::
    check_call_against_plan). While torch.compile traces the call the plan check is left to the op, which
    refuses tensors that do not match the plan's CSR and schedule when it runs: a call into the extension here
    would break the graph."""
    q_shape = tuple(int(n) for n in shapes[0])
    if len(q_shape) not in (3, 4):
        raise invalid("q", f"must be [B, H, L, d] or [H, L, d], got shape {list(q_shape)}")
    for shape, name in zip(shapes[1:], ("k", "v")):
        if tuple(int(n) for n in shape) != q_shape:
            raise invalid(name, f"has shape {list(shape)}, expected q's shape {list(q_shape)}")
    batch, heads, length, head_dim = (1, *q_shape) if len(q_shape) == 3 else q_shape
    if min(batch, heads, length, head_dim) < 1:
        raise invalid("q", f"has an empty dimension: {list(q_shape)}")
    torch = torch_or_none()
    if torch is None or not torch.compiler.is_compiling():
        _core.check_call(batch, heads, length, head_dim, *plan.block_size, plan.heads, plan.q_blocks, plan.kv_blocks)
    return batch, heads, length, head_dim


def _torch_call(q: Any, k: Any, v: Any, plan: Plan, scale: float | None, return_lse: bool, traversal: str,
                head_order: str, kernel: str, precision: str) -> Any:
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
    ops.refuse_grad(torch, ((q, "q"), (k, "k"), (v, "v")), "wavealign.sparse_attention")
    batch, heads, length, head_dim = _check_shapes([tuple(q.shape), tuple(k.shape), tuple(v.shape)], plan)
    scale = check_scale(scale, head_dim)
    if q.device.type == "cuda":
        ops.cuda_element(q.dtype)
    row_ptr, col_idx, schedule, error = plan._launch_tensors(q.device, batch, heads, head_order)
    squeeze = q.dim() == 3
    if squeeze:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    o, lse = torch.ops.wavealign.sparse_attention(q, k, v, row_ptr, col_idx, schedule, error, plan.block_size[0],
                                                  plan.block_size[1], scale, traversal, kernel, precision)
    if squeeze:
        o, lse = o.squeeze(0), lse.squeeze(0)
    return (o, lse) if return_lse else o
