"""Mask ingest: what came in (format, framework, device) and a checked view of its arrays for the C++ ingest.

The three formats (dense, CSR pair, FlexAttention BlockMask) are recognized here and their arrays handed to
the C++ view builders (`_core.dense_view`, `csr_view`, `flex_view`), which check dtypes, ranks and shapes for
host and device arrays alike. The values are checked by the one ingest of wavealign/ingest.h: on the host by
`_core.ingest` (the CPU plan), on the device by the GPU planner (docs/gpu-plan.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _core, methods
from ._util import block_pair, blocks_for, check_int, host_array, invalid, is_torch_tensor

FLEX_ARRAYS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")


@dataclass(frozen=True)
class Source:
    """What the mask came in as, so that outputs can be given back in the same framework and format."""

    format: str                      # "dense", "csr" or "flex"
    framework: str                   # "numpy" or "torch"
    device: Any = None               # torch.device of the input (torch only)
    dense_ndim: int = 3              # dense: 2 for a one-head [MB, NB] mask
    dtype: Any = None                # dense: the mask's dtype; csr: (row_ptr dtype, col_idx dtype)
    flex: Any = None                 # flex: the BlockMask object itself
    flex_batch_heads: tuple[int, int] = (1, 1)  # flex: (B, H) of its [B, H, MB, ...] tensors
    seq_lengths: tuple[int, int] | None = None  # flex: (Q_LEN, KV_LEN)

    def default_tokens(self) -> int:
        """PlanConfig::tokens when `tokens` is not given: a FlexAttention mask's query length, else 0 (the C++
        default, q_blocks x kv_block)."""
        if self.format == "flex" and self.seq_lengths is not None:
            return int(self.seq_lengths[0])
        return 0


@dataclass
class Ingested:
    """A mask ready for a planner: its checked view, where it came from and its block size.

    view: `_core.MaskArrays` over host arrays (the CPU plan) or over device tensors (the GPU plan; the view
    keeps its arrays alive); owned: the device tensors of a GPU plan's own copy of a dense or CSR mask (dense:
    bool [H, MB, NB]; csr: row_ptr int64 and col_idx in its input dtype), None otherwise (a Flex mask is read
    in place: the plan keeps the CSR the planner writes from it). inputs_record: for the GPU planner, the
    device record of a mask from a GPU mask method (nonzero first entry: its q or k held NaN or inf), which
    the plan adopts (wavealign.methods.pending_record).
    """

    view: Any
    source: Source
    block_size: tuple[int, int]
    owned: Any = None
    inputs_record: Any = None


def is_flex(block_mask: Any) -> bool:
    return hasattr(block_mask, "kv_num_blocks") and hasattr(block_mask, "kv_indices")


def is_csr_pair(block_mask: Any) -> bool:
    """A (row_ptr, col_idx) pair: a tuple or list of two arrays (numpy, torch or DLPack). A list of lists is not
    one: it is a dense mask written out in Python (np.asarray reads it)."""
    return (isinstance(block_mask, (tuple, list)) and len(block_mask) == 2 and
            all(hasattr(part, "shape") or hasattr(part, "__dlpack__") for part in block_mask))


def on_cuda(block_mask: Any) -> bool:
    """Whether the mask (dense tensor, CSR pair or BlockMask) lives on a CUDA device."""
    if is_flex(block_mask):
        tensor = block_mask.kv_num_blocks
    elif is_csr_pair(block_mask):
        tensor = block_mask[0]
    else:
        tensor = block_mask
    return is_torch_tensor(tensor) and tensor.device.type == "cuda"


def _refuse_meta(value: Any, argument: str) -> None:
    """A tensor without values (the meta device, fake tensors under tracing) cannot be planned."""
    if is_torch_tensor(value) and value.device.type == "meta":
        raise invalid(argument, "is on the meta device, which holds no values to plan; pass the mask on the CPU "
                                "or a CUDA device")


def ingest(block_mask: Any, heads: int | None, kv_blocks: int | None, block_size: tuple[int, int], *,
           on_device: bool) -> Ingested:
    """The checked view of a mask: on the host (on_device False: a CUDA mask is copied to the host), or over
    CUDA tensors for the GPU planner (on_device True; their values are not read on the host)."""
    if block_mask is None:
        raise invalid("block_mask", "is None")
    if is_flex(block_mask):
        _refuse_meta(block_mask.kv_num_blocks, "kv_num_blocks")
        _refuse_shape_arguments(heads, None, "a FlexAttention BlockMask (its B x H are the heads)")
        return _flex(block_mask, kv_blocks, on_device)
    if is_csr_pair(block_mask):
        _refuse_meta(block_mask[0], "row_ptr")
        return _csr(block_mask, heads, kv_blocks, block_size, on_device)
    if isinstance(block_mask, (tuple, list)) and block_mask and not isinstance(block_mask[0], (tuple, list)):
        raise invalid("block_mask", f"a CSR mask is a (row_ptr, col_idx) pair, got {len(block_mask)} items "
                                    f"(a {type(block_mask[0]).__name__} first; a dense mask written as nested "
                                    "lists is read as one)")
    _refuse_meta(block_mask, "block_mask")
    _refuse_shape_arguments(heads, kv_blocks, "a dense mask (its shape gives them)")
    return _dense(block_mask, block_size, on_device)


def _refuse_shape_arguments(heads: Any, kv_blocks: Any, mask_kind: str) -> None:
    """heads and kv_blocks describe a CSR mask; for the others the mask carries them, so a value given anyway
    would be ignored: refused instead."""
    for value, name in ((heads, "heads"), (kv_blocks, "kv_blocks")):
        if value is not None:
            raise invalid(name, f"is for a CSR mask; {mask_kind} takes none, got {value!r}")


def _framework(value: Any) -> tuple[str, Any]:
    if is_torch_tensor(value):
        return "torch", value.device
    return "numpy", None


def _dense(block_mask: Any, block_size: tuple[int, int], on_device: bool) -> Ingested:
    framework, device = _framework(block_mask)
    record = methods.pending_record(block_mask)
    if not on_device:
        if record is not None:
            methods.check(block_mask)  # the host copy below waits for the generator all the same
        host = host_array(block_mask, "block_mask")
        view = _core.dense_view(host)
        dtype = block_mask.dtype if framework == "torch" else host.dtype
        return Ingested(view, Source("dense", framework, device, host.ndim, dtype), block_size)
    mask = block_mask.detach()
    _core.dense_view(mask)  # dtype, rank and shape of the caller's tensor
    # A bool copy: the plan owns the mask it was built from (later in-place writes to the caller's tensor do
    # not change it), and uint8 values other than 0/1 become 0/1.
    owned = (mask if mask.dim() == 3 else mask.unsqueeze(0)).ne(0)
    source = Source("dense", "torch", device, mask.dim(), mask.dtype)
    return Ingested(_core.dense_view(owned), source, block_size, owned, record)


def _csr_parts(block_mask: Any, heads: int | None, kv_blocks: int | None) -> tuple[Any, Any, int, int]:
    """(row_ptr, col_idx, heads, kv_blocks) of a CSR pair, with the pair's shape arguments checked."""
    if len(block_mask) != 2:
        raise invalid("block_mask", f"a CSR mask is a (row_ptr, col_idx) pair, got {len(block_mask)} items")
    if kv_blocks is None:
        raise invalid("kv_blocks", "is required with a CSR mask (row_ptr, col_idx)")
    kv_blocks = check_int(kv_blocks, "kv_blocks", 1)
    heads = 1 if heads is None else check_int(heads, "heads", 1)
    row_ptr, col_idx = block_mask
    return row_ptr, col_idx, heads, kv_blocks


def _csr(block_mask: Any, heads: int | None, kv_blocks: int | None, block_size: tuple[int, int],
         on_device: bool) -> Ingested:
    row_ptr, col_idx, heads, kv_blocks = _csr_parts(block_mask, heads, kv_blocks)
    framework, device = _framework(row_ptr)
    if not on_device:
        row_host, col_host = host_array(row_ptr, "row_ptr"), host_array(col_idx, "col_idx")
        view = _core.csr_view(row_host, col_host, heads, kv_blocks)
        dtypes = (row_ptr.dtype, col_idx.dtype) if framework == "torch" else (row_host.dtype, col_host.dtype)
        return Ingested(view, Source("csr", framework, device, dtype=dtypes), block_size)
    import torch

    if not is_torch_tensor(col_idx):
        raise invalid("col_idx", f"must be a torch.Tensor on {device} like row_ptr, got {type(col_idx).__name__}")
    _core.csr_view(row_ptr.detach(), col_idx.detach(), heads, kv_blocks)  # dtypes, ranks, devices, length
    # The plan's own copy, validated on the device and read by the kernel: int64 row pointers, the columns in
    # their own dtype (an int64 entry outside int32 must be seen as it is, not wrapped by a cast).
    owned = (row_ptr.detach().to(torch.int64, copy=True),
             col_idx.detach().clone(memory_format=torch.contiguous_format))
    source = Source("csr", "torch", device, dtype=(row_ptr.dtype, col_idx.dtype))
    return Ingested(_core.csr_view(*owned, heads, kv_blocks), source, block_size, owned)


def flex_arrays(block_mask: Any) -> dict[str, Any]:
    """kv_num_blocks [B, H, MB], kv_indices [B, H, MB, W] and the optional full-block pair of a BlockMask."""
    arrays = {name: getattr(block_mask, name, None) for name in FLEX_ARRAYS}
    for name in ("kv_num_blocks", "full_kv_num_blocks"):
        value = arrays[name]
        if value is not None and len(value.shape) != 3:
            raise invalid(name, f"must be [B, H, q_blocks], got shape {list(value.shape)}")
    for name in ("kv_indices", "full_kv_indices"):
        value = arrays[name]
        if value is not None and len(value.shape) != 4:
            raise invalid(name, f"must be [B, H, q_blocks, width], got shape {list(value.shape)}")
    if (arrays["full_kv_num_blocks"] is None) != (arrays["full_kv_indices"] is None):
        raise invalid("full_kv_indices", "full_kv_num_blocks and full_kv_indices come together")
    return arrays


def _flex_geometry(block_mask: Any, arrays: dict[str, Any],
                   kv_blocks: int | None) -> tuple[tuple[int, int], tuple[int, int], int]:
    """(block size, (Q_LEN, KV_LEN), KV blocks) of a BlockMask: its BLOCK_SIZE and seq_lengths when present."""
    q_blocks = int(arrays["kv_num_blocks"].shape[-1])
    raw_block = getattr(block_mask, "BLOCK_SIZE", 128)
    blocks = block_pair(tuple(raw_block) if isinstance(raw_block, (tuple, list)) else raw_block)
    seq_lengths = getattr(block_mask, "seq_lengths", None)
    if seq_lengths is None:
        seq_lengths = (q_blocks * blocks[0], int(arrays["kv_indices"].shape[-1]) * blocks[1])
    seq_lengths = (int(seq_lengths[0]), int(seq_lengths[1]))
    if kv_blocks is None:
        kv_blocks = blocks_for(seq_lengths[1], blocks[1])
    return blocks, seq_lengths, check_int(kv_blocks, "kv_blocks", 1)


def _flex(block_mask: Any, kv_blocks: int | None, on_device: bool) -> Ingested:
    arrays = flex_arrays(block_mask)
    counts = arrays["kv_num_blocks"]
    batch, heads = int(counts.shape[0]), int(counts.shape[1])
    blocks, seq_lengths, kv_blocks = _flex_geometry(block_mask, arrays, kv_blocks)
    folded = {}
    for name, value in arrays.items():
        if value is None:
            folded[name] = None
            continue
        if on_device:
            if not is_torch_tensor(value):
                raise invalid(name, f"must be a torch.Tensor like kv_num_blocks, got {type(value).__name__}")
            value = value.detach()
        else:
            value = host_array(value, name)
        # The batch folds into heads: [B, H, ...] -> [B*H, ...] (a view where the strides allow).
        folded[name] = value.reshape(batch * heads, *value.shape[2:])
    view = _core.flex_view(folded["kv_num_blocks"], folded["kv_indices"], kv_blocks, folded["full_kv_num_blocks"],
                           folded["full_kv_indices"])
    framework, device = _framework(counts)
    source = Source("flex", framework, device, flex=block_mask, flex_batch_heads=(batch, heads),
                    seq_lengths=seq_lengths)
    return Ingested(view, source, blocks)
