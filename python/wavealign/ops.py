"""torch.library custom ops of wavealign and their bodies, with fake (meta) implementations for torch.compile.

    torch.ops.wavealign.sparse_attention(q, k, v, row_ptr, col_idx, schedule, mask_error, q_block, kv_block,
                                         scale, traversal, kernel) -> (O, LSE)
    torch.ops.wavealign.permute_rows(x, permutation, block) -> x in plan order
    torch.ops.wavealign.unpermute_rows(x, inverse, block, seq_len) -> x in the original order

They are registered the first time wavealign meets a torch tensor (or on `register()`), so importing
wavealign never imports torch. The Python entry points (wavealign.sparse_attention, Plan.permute_rows,
Plan.unpermute_rows) call them with the plan's tensors; a compiled module sees one opaque node per call.

Every op checks what it is given. Shapes, dtypes and devices are checked on the host. Values: a CPU
permutation, schedule or CSR is checked directly; on CUDA, a tensor that a Plan produced (registered with
`trust`, and not written in place since) is used as it is, and any other is checked on the device with one
host synchronization per call. The ops have no backward: an input that requires grad is refused.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import numpy as np

from . import _core
from ._rows import check_seq_len
from ._util import INT32_MAX, blocks_for, check_choice, check_int, heads_view_shape, invalid, require_torch

_registered = False
_lock = threading.Lock()  # two threads meeting their first tensor at once register the ops once

# ---- tensors a Plan produced: trusted while alive and not written in place ------------------------------------

_trusted: dict[int, tuple[Any, int]] = {}


def trust(*tensors: Any) -> None:
    """Marks a plan's permutation, schedule or CSR tensors as valid, so the ops skip their device check.

    The mark holds while the tensor lives and its version counter is unchanged: an in-place write (through
    any view) revokes it.
    """
    for tensor in tensors:
        key = id(tensor)
        _trusted[key] = (weakref.ref(tensor, lambda _, key=key: _trusted.pop(key, None)), tensor._version)


def is_trusted(tensor: Any) -> bool:
    entry = _trusted.get(id(tensor))
    return entry is not None and entry[0]() is tensor and entry[1] == tensor._version


def _needs_value_check(tensor: Any) -> bool:
    """CPU tensors are always checked (cheap); a CUDA tensor unless a Plan produced it."""
    return tensor.device.type == "cpu" or not is_trusted(tensor)


def _raise_failed(torch: Any, checks: list[tuple[str, Any, str]]) -> None:
    """checks: (argument, 0-dim bool tensor, message). Reads all flags in one transfer (one host sync on CUDA)
    and raises for the first that is False."""
    if not checks:
        return
    flags = torch.stack([(flag[0] == 0) if argument == _MASK_RECORD else flag.reshape(())
                         for argument, flag, _ in checks]).tolist()
    for (argument, flag, message), ok in zip(checks, flags):
        if ok:
            continue
        if argument == _MASK_RECORD:
            raise ValueError(_core.mask_error_message(flag.cpu().view(torch.uint8).numpy()))
        raise invalid(argument, message)


# ---- host checks ------------------------------------------------------------------------------------------

def _check_tensor(torch: Any, value: Any, argument: str, dtype: Any, ndim: int, device: Any) -> None:
    if not isinstance(value, torch.Tensor):
        raise invalid(argument, f"must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != dtype:
        raise invalid(argument, f"has dtype {value.dtype}, expected {dtype}")
    if value.dim() != ndim:
        raise invalid(argument, f"must have {ndim} dimension(s), got shape {list(value.shape)}")
    if value.device != device:
        raise invalid(argument, f"is on {value.device}, expected {device} (the device of the data)")


def _check_block(block: Any, argument: str) -> int:
    return check_int(block, argument, 1, INT32_MAX)


def refuse_grad(torch: Any, tensors: tuple[tuple[Any, str], ...], entry_point: str) -> None:
    """The ops have no backward: refuse inputs that would record one (grad mode on and requires_grad)."""
    if torch.is_grad_enabled():
        _refuse_requires_grad(torch, tensors, entry_point)


def _refuse_requires_grad(torch: Any, tensors: tuple[tuple[Any, str], ...], entry_point: str) -> None:
    for tensor, argument in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
            raise invalid(argument, f"requires grad, but {entry_point} has no backward (an inference path): call it "
                                    "under torch.no_grad() or torch.inference_mode(), or pass detached tensors")


# ---- value checks (no sync; _raise_failed reads them) -------------------------------------------------------

def _permutation_checks(torch: Any, permutation: Any, argument: str) -> list[tuple[str, Any, str]]:
    """Each head (row) a bijection of 0..MB-1."""
    heads, q_blocks = permutation.shape
    if not _needs_value_check(permutation) or permutation.numel() == 0:
        return []
    expected = torch.arange(q_blocks, dtype=permutation.dtype, device=permutation.device)
    ok = (permutation.sort(dim=1).values == expected).all()
    return [(argument, ok, f"is not a permutation of 0..{q_blocks - 1} in every one of its {heads} heads "
                           "(an entry repeats or is out of range)")]


def _schedule_checks(torch: Any, schedule: Any, entries: int, q_blocks: int) -> list[tuple[str, Any, str]]:
    """Each (head, q_block) of entries x q_blocks exactly once."""
    if not _needs_value_check(schedule):
        return []
    heads, blocks = schedule[:, 0], schedule[:, 1]
    in_range = ((heads >= 0) & (heads < entries) & (blocks >= 0) & (blocks < q_blocks)).all()
    keys = heads.to(torch.int64) * q_blocks + blocks
    once = (keys.sort().values == torch.arange(keys.numel(), device=keys.device)).all()
    return [("schedule", in_range, f"has an item outside {entries} heads x {q_blocks} query blocks"),
            ("schedule", once, "repeats a (head, q_block) item, so another is missing")]


def _check_csr(torch: Any, row_ptr: Any, col_idx: Any, mask_heads: int, kv_blocks: int) -> list[tuple[str, Any, str]]:
    """The mask's rules are the ingest's (wavealign/ingest.h): a CPU CSR is ingested on the host (its ValueError
    raised here); a CUDA CSR a Plan did not produce is validated on the device by the same rules, and its record
    joins the flags that _raise_failed reads (the message is decoded from it only when it is set)."""
    if not (_needs_value_check(row_ptr) or _needs_value_check(col_idx)):
        return []
    view = _core.csr_view(row_ptr.detach(), col_idx.detach(), mask_heads, kv_blocks)
    if row_ptr.device.type == "cpu":
        _core.ingest(view)
        return []
    record = torch.empty(10, dtype=torch.int32, device=row_ptr.device)
    scratch = torch.empty(max(1, _core.mask_validation_bytes(view)), dtype=torch.uint8, device=row_ptr.device)
    with torch.cuda.device(row_ptr.device):
        _core.validate_mask(view, record.data_ptr(), scratch.data_ptr(), scratch.numel(),
                            torch.cuda.current_stream().cuda_stream)
    return [(_MASK_RECORD, record, "")]


_MASK_RECORD = "<mask record>"  # a check whose flag is a validation record: its message comes from the record


# ---- sparse_attention -------------------------------------------------------------------------------------------

def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, row_ptr: np.ndarray, col_idx: np.ndarray,
              schedule: np.ndarray | None, block_size: tuple[int, int], scale: float,
              precision: str = "native") -> tuple[np.ndarray, np.ndarray]:
    """CPU reference on [B, H, L, d] host arrays: (O float32 [B, H, L, d], LSE float32 [B, H, L]).

    row_ptr covers mask_heads*MB rows (mask_heads = H, B*H or 1); schedule: int32 [B*H*MB, 2] (head = b*H + h)
    or None. precision "native": the float32 reference; "int8": the 8-bit kernel's emulation (the host quantizer,
    then integer Q K^T and the FP8 roundings of P and V). The C++ references check the CSR and the schedule.
    """
    q32, k32, v32 = (np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v))
    o = np.empty(q32.shape, np.float32)
    lse = np.empty(q32.shape[:-1], np.float32)
    run = _core.reference_attention_8bit if precision == "int8" else _core.reference_attention
    run(q32, k32, v32, o, lse, row_ptr, col_idx, block_size[0], block_size[1], scale,
        None if schedule is None else np.ascontiguousarray(schedule, dtype=np.int32))
    return o, lse


def cuda_element(dtype: Any) -> str:
    """The kernel's element type name for a torch dtype (bf16 / fp16 only)."""
    import torch

    names = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
    if dtype not in names:
        raise invalid("q", f"has dtype {dtype}; the CUDA kernel takes torch.bfloat16 or torch.float16")
    return names[dtype]


def _layout_of(x: Any) -> tuple[tuple[int, ...], int]:
    """(strides, byte offset) of a [B, H, L, d] tensor, as the C++ layout check takes them. Symbolic sizes of a
    traced call are read as the ints they stand for (a guard on this call's layout, as the check's branches
    would be): the check is one C++ function for the real and the fake kernel."""
    return tuple(int(n) for n in x.stride()), int(x.storage_offset()) * x.element_size()


@functools.lru_cache(maxsize=256)
def _layout_answer(shape: tuple[int, ...], q_block: int, kv_block: int, mask_heads: int, scale: float,
                   layouts: tuple) -> tuple[bool, bool, str, str]:
    return _core.attention_layout(*shape, q_block, kv_block, mask_heads, scale, layouts)


def output_like(q: Any, k: Any, v: Any, q_block: int, kv_block: int, mask_heads: int,
                scale: float) -> tuple[Any, Any, bool]:
    """(O, LSE) buffers for q [B, H, L, d], and whether q, k, v must be made contiguous first.

    The kernel reads q, k, v and writes O with one head and token stride and a batch stride per tensor; the C++
    check of a call (cuda::check_arguments, through `_core.attention_layout`) says whether these tensors and
    O = empty_like(q) can be used where they are, or must be contiguous (then q, k, v and O all are). The fake
    (meta) implementation and the CPU body call this too, so every implementation agrees on O's strides.
    """
    import torch

    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    o = torch.empty_like(q)
    shape = tuple(int(n) for n in q.shape)
    layouts = tuple(_layout_of(x) for x in (q, k, v, o))
    ok, needs_contiguous, argument, reason = _layout_answer(shape, int(q_block), int(kv_block), int(mask_heads),
                                                            float(scale), layouts)
    if ok:
        return o, lse, False
    if not needs_contiguous:
        raise invalid(argument, reason)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), lse, True


def _check_attention_inputs(torch: Any, q: Any, k: Any, v: Any, row_ptr: Any, col_idx: Any, schedule: Any,
                            mask_error: Any, q_block: Any, kv_block: Any) -> tuple[int, int, int]:
    """Host checks of a sparse_attention op call, then the value checks of whatever a Plan did not produce.
    Returns (mask_heads, q_blocks, kv_blocks)."""
    if q.dim() != 4:
        raise invalid("q", f"must be [B, H, L, d], got shape {list(q.shape)}")
    for x, name in ((k, "k"), (v, "v")):
        if tuple(x.shape) != tuple(q.shape) or x.dtype != q.dtype or x.device != q.device:
            raise invalid(name, f"must match q ({list(q.shape)}, {q.dtype}, {q.device}), got "
                                f"{list(x.shape)}, {x.dtype}, {x.device}")
    batch, heads, length, _ = (int(n) for n in q.shape)
    if min(q.shape) < 1:
        raise invalid("q", f"has an empty dimension: {list(q.shape)}")
    q_blocks = blocks_for(length, _check_block(q_block, "q_block"))
    kv_blocks = blocks_for(length, _check_block(kv_block, "kv_block"))
    _check_tensor(torch, row_ptr, "row_ptr", torch.int64, 1, q.device)
    _check_tensor(torch, col_idx, "col_idx", torch.int32, 1, q.device)
    _check_tensor(torch, schedule, "schedule", torch.int32, 2, q.device)
    rows = row_ptr.numel() - 1
    if rows % q_blocks or not _core.mask_heads_fit(rows // q_blocks, batch, heads):
        raise invalid("row_ptr", f"has {rows + 1} entries, expected mask_heads*q_blocks+1 with mask_heads = H = "
                                 f"{heads}, B*H = {batch * heads} or 1 and q_blocks = {q_blocks}")
    entries = batch * heads
    if tuple(schedule.shape) != (entries * q_blocks, 2):
        raise invalid("schedule", f"has shape {list(schedule.shape)}, expected [B*H*q_blocks, 2] = "
                                  f"[{entries * q_blocks}, 2]")
    if mask_error is not None:
        _check_tensor(torch, mask_error, "mask_error", torch.int32, 1, q.device)
        if mask_error.numel() < 1:
            raise invalid("mask_error", "is empty (a validation record holds one int32)")
    for tensor, name in ((row_ptr, "row_ptr"), (col_idx, "col_idx"), (schedule, "schedule")):
        if not tensor.is_contiguous():
            raise invalid(name, "must be contiguous")
    mask_heads = rows // q_blocks
    _raise_failed(torch, _check_csr(torch, row_ptr, col_idx, mask_heads, kv_blocks) +
                  _schedule_checks(torch, schedule, entries, q_blocks))
    return mask_heads, q_blocks, kv_blocks


def attention_cpu(q: Any, k: Any, v: Any, row_ptr: Any, col_idx: Any, schedule: Any, mask_error: Any,
                  q_block: int, kv_block: int, scale: float, precision: str) -> tuple[Any, Any]:
    """CPU torch tensors through the float32 reference (or, for precision "int8", the 8-bit kernel's emulation);
    O has q's dtype. A nonzero mask_error gives NaN, as the kernel does."""
    import torch

    mask_heads, _, _ = _check_attention_inputs(torch, q, k, v, row_ptr, col_idx, schedule, mask_error, q_block,
                                               kv_block)
    o, lse, _ = output_like(q, k, v, q_block, kv_block, mask_heads, scale)
    if mask_error is not None and int(mask_error[0]) != 0:
        return o.fill_(float("nan")), lse.fill_(float("nan"))
    arrays = [x.detach().to(torch.float32).contiguous().numpy() for x in (q, k, v)]
    o32, lse32 = reference(*arrays, row_ptr.numpy(), col_idx.numpy(), schedule.numpy(), (q_block, kv_block), scale,
                           precision)
    o.copy_(torch.from_numpy(o32))
    lse.copy_(torch.from_numpy(lse32))
    return o, lse


@functools.lru_cache(maxsize=64)
def _supported(heads: int, tokens: int, head_dim: int, q_block: int, kv_block: int, element: str, kernel: str,
               device: int, precision: str) -> tuple[bool, str, str]:
    return _core.cuda_query_support(heads, tokens, head_dim, q_block, kv_block, element, kernel, device, precision)


@functools.lru_cache(maxsize=64)
def _workspace_bytes(heads: int, tokens: int, head_dim: int, q_block: int, kv_block: int, element: str,
                     kernel: str, precision: str, batch: int) -> int:
    return _core.cuda_workspace_bytes(heads, tokens, head_dim, q_block, kv_block, element, kernel, precision, batch)


def attention_cuda(q: Any, k: Any, v: Any, row_ptr: Any, col_idx: Any, schedule: Any, mask_error: Any,
                   q_block: int, kv_block: int, scale: float, traversal: str, kernel: str,
                   precision: str) -> tuple[Any, Any]:
    """The fused kernel: the whole batch in one launch, on the current torch stream of q's device."""
    import torch

    if not _core.has_cuda:
        raise RuntimeError("wavealign was built without its CUDA kernels (nvcc was not found when it was "
                           "compiled), so CUDA tensors cannot run the fused kernel; use CPU tensors (reference) "
                           "or the plug-in path (Plan.permute_rows with your own kernel)")
    element = cuda_element(q.dtype)
    mask_heads, _, _ = _check_attention_inputs(torch, q, k, v, row_ptr, col_idx, schedule, mask_error, q_block,
                                               kv_block)
    o, lse, copy = output_like(q, k, v, q_block, kv_block, mask_heads, scale)
    if copy:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    batch, heads, length, head_dim = q.shape
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    supported, reason, _ = _supported(heads, length, head_dim, q_block, kv_block, element, kernel, device, precision)
    if not supported:
        raise RuntimeError(f"the wavealign CUDA kernel cannot run this call: {reason}")
    workspace = torch.empty(_workspace_bytes(heads, length, head_dim, q_block, kv_block, element, kernel, precision,
                                             batch), dtype=torch.uint8, device=q.device)
    # A stride of a size-1 dimension is never stepped over: 0 lets the kernel take its default.
    batch_strides = tuple(x.stride(0) if batch > 1 else 0 for x in (q, k, v, o))
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream().cuda_stream
        _core.cuda_sparse_attention(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), row_ptr.data_ptr(),
            col_idx.data_ptr(), schedule.data_ptr(), 0 if mask_error is None else mask_error.data_ptr(),
            workspace.data_ptr(), stream, batch, heads, mask_heads, length, head_dim, q_block, kv_block, element,
            scale, q.stride(1) if heads > 1 else 0, q.stride(2) if length > 1 else 0, batch_strides, traversal,
            kernel, precision)
    return o, lse


# ---- permute_rows / unpermute_rows ---------------------------------------------------------------------------

def _token_index(torch: Any, block_index: Any, block: int, length: int) -> Any:
    """[heads, q_blocks] block order -> [heads, length] int64 token order."""
    heads, q_blocks = block_index.shape
    offsets = torch.arange(block, dtype=torch.int64, device=block_index.device)
    tokens = block_index.to(torch.int64)[:, :, None] * block + offsets
    return tokens.reshape(heads, q_blocks * block)[:, :length]


def _check_rows_op(torch: Any, x: Any, index: Any, block: Any, index_name: str) -> int:
    """Host checks shared by permute_rows and unpermute_rows; returns block as an int."""
    block = _check_block(block, "block")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise invalid("x", f"must be a [..., L, d] torch.Tensor, got {getattr(x, 'shape', type(x).__name__)}")
    _check_tensor(torch, index, index_name, torch.int32, 2, x.device)
    heads_view_shape(tuple(x.shape[:-2]), index.shape[0], "x")
    return block


def _memory_order(x: Any) -> list[int]:
    """x's dimensions from outermost to innermost in memory (strides descending, ties in index order)."""
    return sorted(range(x.dim()), key=lambda i: (-x.stride(i), i))


def _rows_in_memory(torch: Any, x: Any, tokens: Any) -> Any:
    """For tokens [..., n] (broadcast over x's leading dimensions): the d-value row of x's memory that holds
    x[..., tokens[..., t], :], as an int64 tensor [*lead, n]. x is dense with its last dimension innermost."""
    d = x.shape[-1]
    rows = tokens.expand(*x.shape[:-2], tokens.shape[-1]) * (x.stride(-2) // d)
    for dim, size in enumerate(x.shape[:-2]):
        if size > 1:
            shape = [1] * (x.dim() - 1)
            shape[dim] = size
            rows = rows + torch.arange(size, device=x.device).view(shape) * (x.stride(dim) // d)
    return rows


def _gather_token_rows(torch: Any, x: Any, tokens: Any) -> Any:
    """x [..., L, d] -> [..., n, d] with out[..., t, :] = x[..., tokens[..., t], :]: one index_select of d-value
    rows, the result laid out in memory like x (so the [B, H, L, d] view of a [B, L, H, d] tensor gives the
    [B, H, n, d] view of a contiguous [B, n, H, d] one; see _empty_in_layout, the fake of the ops)."""
    order = _memory_order(x)
    if order[-1] != x.dim() - 1 or not x.permute(*order).is_contiguous():
        x = x.contiguous()  # overlapping, gapped or d-strided memory: gather from a dense copy
        order = list(range(x.dim()))
    d, length = x.shape[-1], tokens.shape[-1]
    source = x.permute(*order).reshape(-1, d)
    rows = _rows_in_memory(torch, x, tokens)  # [*lead, n], dims in x's logical order
    gathered = source.index_select(0, rows.permute(*order[:-1]).reshape(-1))
    shape = (*x.shape[:-2], length, d)
    return gathered.view([shape[i] for i in order]).permute(*_inverse_order(order))


def _inverse_order(order: list[int]) -> list[int]:
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return inverse


def _empty_in_layout(x: Any, length: int) -> Any:
    """An empty [..., length, d] tensor laid out in memory as _gather_token_rows lays out its result for x."""
    order = _memory_order(x)
    if order[-1] != x.dim() - 1 or not x.permute(*order).is_contiguous():
        order = list(range(x.dim()))
    shape = (*x.shape[:-2], length, x.shape[-1])
    return x.new_empty([shape[i] for i in order]).permute(*_inverse_order(order))


def permute_rows(x: Any, permutation: Any, block: Any) -> Any:
    """x [..., L, d] -> [..., MB*block, d]: query block p of each head is block permutation[h, p] of x; the
    tokens past L of a partial last block are zero. The result is laid out in memory like x."""
    import torch

    block = _check_rows_op(torch, x, permutation, block, "permutation")
    heads, q_blocks = permutation.shape
    padded = q_blocks * block
    length = x.shape[-2]
    _core.check_query_blocks(length, block, q_blocks, "x")
    _raise_failed(torch, _permutation_checks(torch, permutation, "permutation"))
    view = heads_view_shape(tuple(x.shape[:-2]), heads, "x")
    tokens = _token_index(torch, permutation, block, padded).reshape(*view, padded)
    out = _gather_token_rows(torch, x, tokens.clamp(max=length - 1))
    if length != padded:
        # The original last block's tokens past L, wherever the plan put that block: zero them in place
        # (no padded copy of x).
        last = (permutation == q_blocks - 1).to(torch.int64).argmax(dim=-1, keepdim=True)  # [heads, 1]
        tail = torch.arange(length - (q_blocks - 1) * block, block, device=x.device)
        pad = (last * block + tail).reshape(*view, block - (length - (q_blocks - 1) * block))
        rows = _rows_in_memory(torch, out, pad)
        out.permute(*_memory_order(out)).reshape(-1, out.shape[-1]).index_fill_(0, rows.reshape(-1), 0)
    return out


def unpermute_rows(x: Any, inverse: Any, block: Any, seq_len: Any) -> Any:
    """Inverse of permute_rows: x [..., MB*block, d] in plan order -> [..., seq_len, d] in the original order,
    laid out in memory like x."""
    import torch

    block = _check_rows_op(torch, x, inverse, block, "inverse")
    heads, q_blocks = inverse.shape
    if x.shape[-2] != q_blocks * block:
        raise invalid("x", f"has {x.shape[-2]} tokens, expected q_blocks*block = {q_blocks * block}")
    length = check_seq_len(seq_len, q_blocks, block)
    _raise_failed(torch, _permutation_checks(torch, inverse, "inverse"))
    view = heads_view_shape(tuple(x.shape[:-2]), heads, "x")
    return _gather_token_rows(torch, x, _token_index(torch, inverse, block, length).reshape(*view, length))


# ---- registration ---------------------------------------------------------------------------------------------

def register() -> None:
    """Registers the ops with torch (once; later calls return at once)."""
    if _registered:
        return
    with _lock:
        _register()


def _register() -> None:
    global _registered
    if _registered:
        return
    torch = require_torch("wavealign's torch ops")

    @torch.library.custom_op("wavealign::sparse_attention", mutates_args=(),
                             schema="(Tensor q, Tensor k, Tensor v, Tensor row_ptr, Tensor col_idx, "
                                    "Tensor schedule, Tensor? mask_error, int q_block, int kv_block, float scale, "
                                    "str traversal, str kernel, str precision=\"native\") -> (Tensor, Tensor)")
    def sparse_attention(q, k, v, row_ptr, col_idx, schedule, mask_error, q_block, kv_block, scale, traversal,
                         kernel, precision="native"):
        check_choice(traversal, "traversal", "traversal")
        check_choice(kernel, "kernel", "kernel")
        check_choice(precision, "precision", "precision")
        if q.device.type == "cuda":
            return attention_cuda(q, k, v, row_ptr, col_idx, schedule, mask_error, q_block, kv_block, scale,
                                  traversal, kernel, precision)
        if q.device.type != "cpu":
            raise invalid("q", f"is on {q.device}, which is not supported (cpu or cuda)")
        return attention_cpu(q, k, v, row_ptr, col_idx, schedule, mask_error, q_block, kv_block, scale, precision)

    @sparse_attention.register_fake
    def _(q, k, v, row_ptr, col_idx, schedule, mask_error, q_block, kv_block, scale, traversal, kernel,
          precision="native"):
        q_blocks = blocks_for(int(q.shape[2]), q_block)
        o, lse, _ = output_like(q, k, v, q_block, kv_block, max(1, int(row_ptr.numel() - 1) // int(q_blocks)), scale)
        return o, lse

    @torch.library.custom_op("wavealign::permute_rows", mutates_args=(),
                             schema="(Tensor x, Tensor permutation, int block) -> Tensor")
    def permute(x, permutation, block):
        return permute_rows(x, permutation, block)

    @permute.register_fake
    def _(x, permutation, block):
        return _empty_in_layout(x, permutation.shape[-1] * block)

    @torch.library.custom_op("wavealign::unpermute_rows", mutates_args=(),
                             schema="(Tensor x, Tensor inverse, int block, int seq_len) -> Tensor")
    def unpermute(x, inverse, block, seq_len):
        return unpermute_rows(x, inverse, block, seq_len)

    @unpermute.register_fake
    def _(x, inverse, block, seq_len):
        return _empty_in_layout(x, seq_len)

    # No backward: a call that would record one (an input requires grad, grad mode on) is refused as it returns,
    # before any graph is built. The Python entry points refuse it before the call.
    for op, names, entry_point in ((sparse_attention, ("q", "k", "v"), "wavealign.sparse_attention"),
                                   (permute, ("x",), "wavealign.Plan.permute_rows"),
                                   (unpermute, ("x",), "wavealign.Plan.unpermute_rows")):
        op.register_autograd(_no_backward, setup_context=functools.partial(_refuse_recording, torch, names,
                                                                           entry_point))
    _registered = True


def _refuse_recording(torch: Any, names: tuple[str, ...], entry_point: str, ctx: Any, inputs: tuple[Any, ...],
                      output: Any) -> None:
    """setup_context of the ops: called only when the call would record a backward, so it always raises."""
    _refuse_requires_grad(torch, tuple(zip(inputs, names)), entry_point)
    raise RuntimeError(f"{entry_point} has no backward")


def _no_backward(ctx: Any, *grads: Any) -> None:
    raise RuntimeError("wavealign's ops have no backward")
