"""wavealign.plan(): the WaveAlign row order of a block mask, and the Plan object that carries it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _core, _rows, ops
from ._util import (block_pair, blocks_for, check_choice, check_int, heads_view_shape, host_array, invalid,
                    is_torch_tensor, torch_or_none)


@dataclass
class _Source:
    """What the mask came in as, so that outputs can be given back in the same framework and format."""

    format: str                      # "dense", "csr" or "flex"
    framework: str                   # "numpy" or "torch"
    device: Any = None               # torch.device of the input (torch only)
    dense_ndim: int = 3              # dense: 2 for a one-head [MB, NB] mask
    dtype: Any = None                # dense: the mask's dtype; csr: (row_ptr dtype, col_idx dtype)
    flex: Any = None                 # flex: the BlockMask object itself
    flex_batch_heads: tuple[int, int] = (1, 1)  # flex: (B, H) of its [B, H, MB, ...] tensors
    seq_lengths: tuple[int, int] | None = None  # flex: (Q_LEN, KV_LEN)


@dataclass
class _DeviceState:
    """The plan's tensors on one torch device: what the kernel and the plug-in ops read."""

    permutation: Any                 # int32 [H, MB]
    inverse: Any                     # int32 [H, MB]
    row_ptr: Any                     # int64 [H*MB + 1]
    col_idx: Any                     # int32 [nnz]
    schedules: dict = field(default_factory=dict)  # (batch, heads, head_order) -> int32 [Bs, heads*MB, 2]


class Plan:
    """Per-head WaveAlign row order of a block mask, built once and reused for every call with that mask.

    Attributes (H = mask heads, MB = query blocks, NB = KV blocks):
        permutation: int32 [H, MB]; position p of head h runs original query block permutation[h, p].
        inverse: int32 [H, MB]; inverse[h, permutation[h, p]] == p.
        skipped: per head, True when the adaptive skip kept the original order.
        reason: per head, why (with the numbers that decided).
        stats: per-head mask statistics and plan timings (see docs/python.md).
        block_size: (q_block, kv_block) tokens per mask block.

    Arrays are numpy for numpy (or other DLPack) masks and torch tensors on the mask's device for torch masks.
    """

    def __init__(self, handle: Any, source: _Source, block_size: tuple[int, int]) -> None:
        self._handle = handle
        self._source = source
        self.block_size = block_size
        self.heads: int = handle.heads
        self.q_blocks: int = handle.q_blocks
        self.kv_blocks: int = handle.kv_blocks
        self.wave_size: int = handle.wave_size
        self.order: str = handle.order
        self.skipped: list[bool] = handle.skipped()
        self.reason: list[str] = handle.reasons()
        self.stats: dict[str, Any] = handle.stats()
        self._permutation_host: np.ndarray = handle.permutations()
        self._inverse_host: np.ndarray = handle.inverses()
        self._csr_host: tuple[np.ndarray, np.ndarray] | None = None
        self._states: dict[tuple[str, int | None], _DeviceState] = {}
        if source.framework == "torch":
            # The tensors of the default call are made now, so a compiled caller finds them ready.
            self._batch_schedule(self._state(source.device), 1, self.heads, "sequential")

    def __repr__(self) -> str:
        return (f"wavealign.Plan(heads={self.heads}, q_blocks={self.q_blocks}, kv_blocks={self.kv_blocks}, "
                f"block_size={self.block_size}, order={self.order!r}, wave_size={self.wave_size}, "
                f"skipped={sum(self.skipped)}/{self.heads})")

    # ---- arrays in the caller's framework ---------------------------------------------------------------

    def _to_caller(self, array: np.ndarray) -> Any:
        if self._source.framework == "torch":
            import torch

            return torch.from_numpy(array).to(self._source.device)
        return array

    @property
    def permutation(self) -> Any:
        """int32 [H, MB]: position p of head h runs original query block permutation[h, p]."""
        if self._source.framework == "torch":
            return self._state(self._source.device).permutation
        return self._permutation_host

    @property
    def inverse(self) -> Any:
        """int32 [H, MB]: the inverse permutation per head (inverse[h, permutation[h, p]] == p)."""
        if self._source.framework == "torch":
            return self._state(self._source.device).inverse
        return self._inverse_host

    def schedule(self, head_order: str = "sequential") -> Any:
        """int32 [H*MB, 2] (head, original query block) items in the order the kernel runs them.

        head_order: "sequential" (head by head) or "concurrent-heads" (position p of every head, then p+1).
        """
        check_choice(head_order, "head_order", "head_order")
        return self._to_caller(self._handle.schedule(head_order))

    def csr(self) -> tuple[Any, Any]:
        """The original mask as (row_ptr int64 [H*MB+1], col_idx int32 [nnz]), columns ascending per row."""
        row_ptr, col_idx = self._host_csr()
        return self._to_caller(row_ptr), self._to_caller(col_idx)

    def _host_csr(self) -> tuple[np.ndarray, np.ndarray]:
        if self._csr_host is None:
            self._csr_host = self._handle.mask.csr()
        return self._csr_host

    # ---- device state for the kernel and the torch ops --------------------------------------------------

    def _state(self, device: Any) -> _DeviceState:
        """The plan's tensors on a torch device, copied there once and cached."""
        key = (device.type, device.index)
        state = self._states.get(key)
        if state is None:
            import torch

            row_ptr, col_idx = self._host_csr()
            state = _DeviceState(
                permutation=torch.from_numpy(self._permutation_host).to(device),
                inverse=torch.from_numpy(self._inverse_host).to(device),
                row_ptr=torch.from_numpy(row_ptr).to(device),
                col_idx=torch.from_numpy(col_idx).to(device))
            self._states[key] = state
        return state

    def _batch_schedule_host(self, batch: int, heads: int, head_order: str) -> np.ndarray:
        """int32 [Bs, heads*MB, 2]: the schedule of each launch, heads numbered within the launch.

        An H-head mask serves every batch entry with one schedule (Bs = 1); a B*H-head mask gives batch entry
        b the items of heads b*H .. b*H+H-1 in plan order, renumbered from 0 (Bs = B).
        """
        items = self._handle.schedule(head_order)
        if self.heads == heads:
            return items[None]
        offsets = np.array([heads, 0], np.int32)
        return np.ascontiguousarray(np.stack([items[items[:, 0] // heads == b] - b * offsets for b in range(batch)]))

    def _batch_schedule(self, state: _DeviceState, batch: int, heads: int, head_order: str) -> Any:
        """_batch_schedule_host on the state's device, cached."""
        key = (1 if self.heads == heads else batch, heads, head_order)
        schedule = state.schedules.get(key)
        if schedule is None:
            import torch

            host = self._batch_schedule_host(batch, heads, head_order)
            schedule = torch.from_numpy(host).to(state.row_ptr.device)
            state.schedules[key] = schedule
        return schedule

    # ---- plug-in path: run any kernel in plan order ------------------------------------------------------

    def permute_rows(self, x: Any) -> Any:
        """Gathers the query blocks of x [..., L, d] into plan order: [..., MB*q_block, d].

        The leading dimensions end in the mask's heads ([..., H, L, d]; a B*H-head mask also takes [B, H, L, d]).
        A partial last block (L not a multiple of q_block) is padded with zero tokens first, so the result
        always has MB*q_block tokens; unpermute_rows(o, seq_len=L) drops them again.
        """
        block = self.block_size[0]
        if is_torch_tensor(x):
            ops.register()
            self._check_permute_input(tuple(x.shape), "x")
            return torch_or_none().ops.wavealign.permute_rows(x, self._state(x.device).permutation, block)
        return _rows.permute_numpy(host_array(x, "x"), self._permutation_host, block, "x")

    def unpermute_rows(self, o: Any, seq_len: int | None = None) -> Any:
        """Inverse of permute_rows: o [..., MB*q_block, d] in plan order -> [..., seq_len, d] in the original
        order (seq_len None keeps all MB*q_block tokens)."""
        block = self.block_size[0]
        length = _rows.check_seq_len(seq_len, self.q_blocks, block)
        if is_torch_tensor(o):
            ops.register()
            if len(o.shape) < 2 or o.shape[-2] != self.q_blocks * block:
                raise invalid("o", f"must be [..., {self.q_blocks * block}, d] (q_blocks*block tokens), "
                                   f"got shape {list(o.shape)}")
            return torch_or_none().ops.wavealign.unpermute_rows(o, self._state(o.device).inverse, block, length)
        return _rows.unpermute_numpy(host_array(o, "o"), self._inverse_host, block, length, "o")

    def _check_permute_input(self, shape: tuple[int, ...], argument: str) -> None:
        block = self.block_size[0]
        if len(shape) < 2:
            raise invalid(argument, f"must be [..., L, d], got shape {list(shape)}")
        if blocks_for(shape[-2], block) != self.q_blocks:
            raise invalid(argument, f"has {shape[-2]} tokens = {blocks_for(shape[-2], block)} query blocks of "
                                    f"{block}, the plan has {self.q_blocks}")
        heads_view_shape(shape[:-2], self.heads, argument)

    def permuted_mask(self) -> Any:
        """The mask with each head's rows in plan order, in the input's format and framework.

        dense -> bool/uint8 [H, MB, NB] (or [MB, NB]); CSR -> (row_ptr, col_idx) with the input's dtypes;
        FlexAttention BlockMask -> a BlockMask over the permuted query blocks (see wavealign.flex.block_mask).
        """
        source = self._source
        permuted = self._handle.permuted_mask()
        if source.format == "flex":
            from . import flex

            return flex.block_mask(self, source.seq_lengths[1], device=source.device)
        if source.format == "csr":
            row_ptr, col_idx = permuted.csr()
            row_dtype, col_dtype = source.dtype
            return self._to_caller_as(row_ptr, row_dtype), self._to_caller_as(col_idx, col_dtype)
        dense = permuted.dense()
        return self._to_caller_as(dense[0] if source.dense_ndim == 2 else dense, source.dtype)

    def _to_caller_as(self, array: np.ndarray, dtype: Any) -> Any:
        """`array` in the caller's framework and dtype (a numpy or a torch dtype, as the input had)."""
        if self._source.framework == "torch":
            return self._to_caller(array).to(dtype)
        return array.astype(dtype, copy=False)


def _flex_arrays(block_mask: Any) -> dict[str, Any]:
    """kv_num_blocks [B, H, MB], kv_indices [B, H, MB, W] and the optional full-block pair of a BlockMask."""
    arrays = {"kv_num_blocks": block_mask.kv_num_blocks, "kv_indices": block_mask.kv_indices,
              "full_kv_num_blocks": getattr(block_mask, "full_kv_num_blocks", None),
              "full_kv_indices": getattr(block_mask, "full_kv_indices", None)}
    for name in ("kv_num_blocks", "full_kv_num_blocks"):
        value = arrays[name]
        if value is not None and len(value.shape) != 3:
            raise invalid(name, f"must be [B, H, q_blocks], got shape {list(value.shape)}")
    for name in ("kv_indices", "full_kv_indices"):
        value = arrays[name]
        if value is not None and len(value.shape) != 4:
            raise invalid(name, f"must be [B, H, q_blocks, width], got shape {list(value.shape)}")
    return arrays


def plan(block_mask: Any, wave_size: int | None = None, order: str = "wavealign", iterations: int = 10,
         seed: int = 0, skip: str = "auto", gpu: str = "h200", *, block_size: int | tuple[int, int] = 128,
         heads: int | None = None, kv_blocks: int | None = None, head_dim: int = 128, plan_reuse: float = 1.0,
         threads: int = 0) -> Plan:
    """Plans the WaveAlign row order of a block mask (heads in parallel on the CPU).

    Args:
        block_mask: one of
            - bool/uint8 [H, MB, NB] or [MB, NB] (numpy, torch CPU/CUDA, any DLPack producer);
            - a CSR pair (row_ptr int64/int32 [H*MB+1], col_idx int32 [nnz]) with `kv_blocks` (and `heads`);
            - a FlexAttention BlockMask (kv_num_blocks / kv_indices, plus full_kv_* when present; B folds
              into heads; its BLOCK_SIZE overrides `block_size`).
        wave_size: rows per wave W; None = the slots of `gpu` (SMs x CTAs per SM).
        order: "wavealign" (Stage 1 + 2), "s1", "s2", "original" or "shuffled".
        iterations: subspace iterations of Stage 1.
        seed: start block of the subspace iteration and seed of "shuffled".
        skip: "auto" (keep the original order where reordering cannot pay), "never" or "always".
        gpu: preset of the wave size and the skip model: "h200", "h100" or "a40".
        block_size: tokens per mask block, int or (q_block, kv_block); used by the plug-in path and the kernel.
        heads: CSR input: heads of the mask (default 1).
        kv_blocks: CSR input: KV blocks per row (required); FlexAttention input: overrides the count derived
            from seq_lengths.
        head_dim, plan_reuse: skip model: head dimension, and how many attention calls reuse this plan.
        threads: worker threads over heads (0 = all cores); the plan does not depend on it.

    A mask on a CUDA device is copied to the host and planned there (a device synchronization); the plan's
    tensors are then put on that device.
    """
    order = check_choice(order, "order", "order")
    skip = check_choice(skip, "skip", "skip")
    gpu = check_choice(gpu, "gpu", "gpu")
    wave = 0 if wave_size is None else check_int(wave_size, "wave_size", 1)
    iterations = check_int(iterations, "iterations", 1)
    seed = check_int(seed, "seed", 0)
    threads = check_int(threads, "threads", 0)
    head_dim = check_int(head_dim, "head_dim", 1)
    if isinstance(plan_reuse, bool) or not isinstance(plan_reuse, (int, float)) or not plan_reuse > 0:
        raise invalid("plan_reuse", f"must be a number > 0, got {plan_reuse!r}")
    blocks = block_pair(block_size)

    if hasattr(block_mask, "kv_num_blocks") and hasattr(block_mask, "kv_indices"):
        mask, source, blocks = _flex_mask(block_mask, kv_blocks)
    elif isinstance(block_mask, (tuple, list)):
        mask, source = _csr_mask(block_mask, heads, kv_blocks)
    else:
        mask, source = _dense_mask(block_mask)

    handle = _core.make_plan(mask, order, gpu, wave, iterations, seed, skip, threads, head_dim, 2, blocks[1],
                             float(plan_reuse))
    if source.framework == "torch":
        ops.register()
    return Plan(handle, source, blocks)


def _framework(value: Any) -> tuple[str, Any]:
    if is_torch_tensor(value):
        return "torch", value.device
    return "numpy", None


def _dense_mask(block_mask: Any) -> tuple[Any, _Source]:
    framework, device = _framework(block_mask)
    if block_mask is None:
        raise invalid("block_mask", "is None")
    host = host_array(block_mask, "block_mask")
    if host.dtype not in (np.bool_, np.uint8):
        raise invalid("block_mask", f"has dtype {host.dtype}, expected bool or uint8")
    if host.ndim not in (2, 3):
        raise invalid("block_mask", f"must be [H, MB, NB] or [MB, NB], got shape {list(host.shape)}")
    dtype = block_mask.dtype if framework == "torch" else host.dtype
    return _core.mask_from_dense(host), _Source("dense", framework, device, host.ndim, dtype)


def _csr_mask(block_mask: Any, heads: int | None, kv_blocks: int | None) -> tuple[Any, _Source]:
    if len(block_mask) != 2:
        raise invalid("block_mask", f"a CSR mask is a (row_ptr, col_idx) pair, got {len(block_mask)} items")
    if kv_blocks is None:
        raise invalid("kv_blocks", "is required with a CSR mask (row_ptr, col_idx)")
    kv_blocks = check_int(kv_blocks, "kv_blocks", 1)
    heads = 1 if heads is None else check_int(heads, "heads", 1)
    row_ptr, col_idx = block_mask
    framework, device = _framework(row_ptr)
    row_host = host_array(row_ptr, "row_ptr")
    col_host = host_array(col_idx, "col_idx")
    if row_host.dtype not in (np.int32, np.int64):
        raise invalid("row_ptr", f"has dtype {row_host.dtype}, expected int64 or int32")
    if col_host.dtype not in (np.int32, np.int64):
        raise invalid("col_idx", f"has dtype {col_host.dtype}, expected int32")
    dtypes = (row_ptr.dtype, col_idx.dtype) if framework == "torch" else (row_host.dtype, col_host.dtype)
    return _core.mask_from_csr(row_host, col_host, heads, kv_blocks), _Source("csr", framework, device,
                                                                               dtype=dtypes)


def _flex_mask(block_mask: Any, kv_blocks: int | None) -> tuple[Any, _Source, tuple[int, int]]:
    arrays = _flex_arrays(block_mask)
    counts = arrays["kv_num_blocks"]
    batch, heads, q_blocks = (int(n) for n in counts.shape)
    raw_block = getattr(block_mask, "BLOCK_SIZE", 128)
    blocks = block_pair(tuple(raw_block) if isinstance(raw_block, (tuple, list)) else raw_block)
    seq_lengths = getattr(block_mask, "seq_lengths", None)
    if seq_lengths is None:
        seq_lengths = (q_blocks * blocks[0], int(arrays["kv_indices"].shape[-1]) * blocks[1])
    seq_lengths = (int(seq_lengths[0]), int(seq_lengths[1]))
    if kv_blocks is None:
        kv_blocks = blocks_for(seq_lengths[1], blocks[1])
    kv_blocks = check_int(kv_blocks, "kv_blocks", 1)
    host = {}
    for name, value in arrays.items():
        if value is None:
            host[name] = None
            continue
        array = host_array(value, name)
        if array.dtype != np.int32:
            raise invalid(name, f"has dtype {array.dtype}, expected int32")
        host[name] = array.reshape(batch * heads, *array.shape[2:])
    if (host["full_kv_num_blocks"] is None) != (host["full_kv_indices"] is None):
        raise invalid("full_kv_indices", "full_kv_num_blocks and full_kv_indices come together")
    mask = _core.mask_from_flex(host["kv_num_blocks"], host["kv_indices"], kv_blocks,
                                host["full_kv_num_blocks"], host["full_kv_indices"])
    framework, device = _framework(counts)
    source = _Source("flex", framework, device, flex=block_mask, flex_batch_heads=(batch, heads),
                     seq_lengths=seq_lengths)
    return mask, source, blocks
