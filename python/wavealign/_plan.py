"""wavealign.plan(): the WaveAlign row order of a block mask, and the Plan object that carries it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import _core, _gpu_plan, _profile, _rows, ops
from ._util import (INT64_MAX, UINT64_MAX, block_pair, blocks_for, check_choice, check_int, heads_view_shape,
                    host_array, invalid, is_torch_tensor, torch_or_none)


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


class _DeviceState:
    """The plan's tensors on one torch device: what the kernel and the plug-in ops read.

    permutation, inverse: int32 [H, MB]; row_ptr int64 [H*MB + 1] and col_idx int32 [nnz]: the mask's CSR,
    made by `csr` on first use (a GPU-built plan derives it from its device mask, which synchronizes once);
    schedules: (batch, heads, head_order) -> int32 [Bs, heads*MB, 2], one per launch of B*H entries renumbered
    from 0, and ("launch", batch, heads, head_order) -> int32 [batch*heads*MB, 2], the one launch of the batch.
    """

    def __init__(self, device: Any, permutation: Any, inverse: Any, csr: Callable[[], tuple[Any, Any]]) -> None:
        self.device = device
        self.permutation = permutation
        self.inverse = inverse
        self.schedules: dict[tuple[Any, ...], Any] = {}
        self._make_csr = csr
        self._csr: tuple[Any, Any] | None = None
        ops.trust(permutation, inverse)

    def _pair(self) -> tuple[Any, Any]:
        if self._csr is None:
            self._csr = self._make_csr()
            ops.trust(*self._csr)
        return self._csr

    @property
    def row_ptr(self) -> Any:
        return self._pair()[0]

    @property
    def col_idx(self) -> Any:
        return self._pair()[1]


class Plan:
    """Per-head WaveAlign row order of a block mask, built once and reused for every call with that mask.

    Attributes (H = mask heads, MB = query blocks, NB = KV blocks):
        permutation: int32 [H, MB]; position p of head h runs original query block permutation[h, p].
        inverse: int32 [H, MB]; inverse[h, permutation[h, p]] == p.
        skipped: per head, True when the adaptive skip kept the original order.
        reason: per head, why (with the numbers that decided).
        stats: per-head mask statistics and plan timings (see docs/python.md).
        block_size: (q_block, kv_block) tokens per mask block.
        planner: "cpu" or "gpu", where the plan was built.

    Arrays are numpy for numpy (or other DLPack) masks and torch tensors on the mask's device for torch masks.
    A plan built on the GPU keeps its arrays on the device; skipped, reason and stats are copied to the host on
    first access, which synchronizes the device.
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
        self.planner: str = "gpu" if isinstance(handle, _gpu_plan.DeviceHandle) else "cpu"
        self._skipped: list[bool] | None = None
        self._reason: list[str] | None = None
        self._stats: dict[str, Any] | None = None
        self._permutation_cache: np.ndarray | None = None
        self._inverse_cache: np.ndarray | None = None
        self._csr_host: tuple[np.ndarray, np.ndarray] | None = None
        self._states: dict[tuple[str, int | None], _DeviceState] = {}
        if self.planner == "gpu":
            # The planner's outputs are the state of the mask's device; its schedule is the default call's.
            state = _DeviceState(source.device, handle.device_permutation, handle.device_inverse, self._device_csr)
            state.schedules[(1, self.heads, "sequential")] = handle.device_schedule.view(1, -1, 2)
            self._states[(source.device.type, source.device.index)] = state
        else:
            self._skipped = handle.skipped()
            self._reason = handle.reasons()
            self._stats = handle.stats()
            self._permutation_cache = handle.permutations()
            self._inverse_cache = handle.inverses()
            if source.framework == "torch":
                # The tensors of the default call are made now, so a compiled caller finds them ready.
                self._launch_tensors(source.device, 1, self.heads, "sequential")

    def __repr__(self) -> str:
        # A GPU-built plan's skip flags are on the device until read: repr does not synchronize for them.
        skipped = "" if self._skipped is None else f", skipped={sum(self._skipped)}/{self.heads}"
        return (f"wavealign.Plan(heads={self.heads}, q_blocks={self.q_blocks}, kv_blocks={self.kv_blocks}, "
                f"block_size={self.block_size}, order={self.order!r}, wave_size={self.wave_size}, "
                f"planner={self.planner!r}{skipped})")

    # ---- per-head decisions and statistics (host values; a GPU plan copies them on first access) -----------

    @property
    def skipped(self) -> list[bool]:
        """Per head, True when the adaptive skip kept the original order."""
        if self._skipped is None:
            self._skipped = self._handle.skipped()
        return self._skipped

    @property
    def reason(self) -> list[str]:
        """Per head, why the head was (not) reordered, with the numbers that decided."""
        if self._reason is None:
            self._reason = self._handle.reasons()
        return self._reason

    @property
    def stats(self) -> dict[str, Any]:
        """Per-head mask statistics and plan timings (a GPU plan has no per-head timings: NaN)."""
        if self._stats is None:
            self._stats = self._handle.stats()
        return self._stats

    @property
    def source_block_mask(self) -> Any:
        """The FlexAttention BlockMask the plan was built from (its mask_mod included), or None for a dense or
        CSR mask."""
        return self._source.flex if self._source.format == "flex" else None

    @property
    def _permutation_host(self) -> np.ndarray:
        if self._permutation_cache is None:
            self._permutation_cache = self._handle.permutations()
        return self._permutation_cache

    @property
    def _inverse_host(self) -> np.ndarray:
        if self._inverse_cache is None:
            self._inverse_cache = self._handle.inverses()
        return self._inverse_cache

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
        if self.planner == "gpu":
            state = self._state(self._source.device)
            return self._batch_schedule(state, 1, self.heads, head_order)[0]
        return self._to_caller(self._handle.schedule(head_order))

    def csr(self) -> tuple[Any, Any]:
        """The original mask as (row_ptr int64 [H*MB+1], col_idx int32 [nnz]), columns ascending per row."""
        if self.planner == "gpu":
            state = self._state(self._source.device)
            return state.row_ptr, state.col_idx
        row_ptr, col_idx = self._host_csr()
        return self._to_caller(row_ptr), self._to_caller(col_idx)

    def _host_csr(self) -> tuple[np.ndarray, np.ndarray]:
        if self._csr_host is None:
            self._csr_host = self._handle.mask.csr()
        return self._csr_host

    def _device_csr(self) -> tuple[Any, Any]:
        """CSR of a GPU plan's device mask on its device, in the host CSR's order (rows, then columns
        ascending). Its size is data-dependent, so this synchronizes once."""
        import torch

        return _csr_of_rows(torch, self._handle.device_mask.view(self.heads * self.q_blocks, self.kv_blocks))

    # ---- device state for the kernel and the torch ops --------------------------------------------------

    def _state(self, device: Any) -> _DeviceState:
        """The plan's tensors on a torch device, copied there once and cached."""
        key = (device.type, device.index)
        state = self._states.get(key)
        if state is None:
            import torch

            if self.planner == "gpu":
                # Another device than the planner's: copies of the planner's state.
                home = self._state(self._source.device)
                state = _DeviceState(device, home.permutation.to(device), home.inverse.to(device),
                                     lambda: (home.row_ptr.to(device), home.col_idx.to(device)))
            else:
                def host_csr() -> tuple[Any, Any]:
                    row_ptr, col_idx = self._host_csr()
                    return torch.from_numpy(row_ptr).to(device), torch.from_numpy(col_idx).to(device)

                state = _DeviceState(device, torch.from_numpy(self._permutation_host).to(device),
                                     torch.from_numpy(self._inverse_host).to(device), host_csr)
                state._pair()  # a CPU plan's CSR is copied with the state, outside any compiled call
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

            if self.planner == "gpu":
                schedule = _device_batch_schedule(torch, state.permutation, batch, heads, head_order)
            else:
                host = self._batch_schedule_host(batch, heads, head_order)
                schedule = torch.from_numpy(host).to(state.device)
            state.schedules[key] = schedule
        return schedule

    def _launch_arrays(self, batch: int, heads: int, head_order: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host (row_ptr int64 [mask_heads*MB+1], col_idx int32 [nnz], schedule int32 [batch*heads*MB, 2]) of
        one call over the batch: the per-launch schedules one after another, heads renumbered b*heads + h."""
        row_ptr, col_idx = self._host_csr()
        per_launch = self._batch_schedule_host(batch, heads, head_order)
        offsets = np.stack([np.arange(batch, dtype=np.int32) * heads, np.zeros(batch, np.int32)], axis=-1)
        return row_ptr, col_idx, np.ascontiguousarray((per_launch + offsets[:, None, :]).reshape(-1, 2))

    def _launch_tensors(self, device: Any, batch: int, heads: int, head_order: str) -> tuple[Any, Any, Any, Any]:
        """The tensors of _launch_arrays on a torch device (a GPU plan builds them there), cached and trusted by
        the ops, plus the plan's device validation record (None: this plan's mask was validated on the host)."""
        state = self._state(device)
        key = ("launch", batch, heads, head_order)
        schedule = state.schedules.get(key)
        if schedule is None:
            import torch

            per_launch = self._batch_schedule(state, batch, heads, head_order)
            first = torch.arange(batch, dtype=torch.int32, device=state.device) * heads
            offsets = torch.stack([first, torch.zeros_like(first)], dim=-1)
            schedule = (per_launch + offsets[:, None, :]).reshape(-1, 2).contiguous()
            state.schedules[key] = schedule
            ops.trust(schedule)
        return state.row_ptr, state.col_idx, schedule, None

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
            ops.refuse_grad(torch_or_none(), ((x, "x"),), "wavealign.Plan.permute_rows")
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
            ops.refuse_grad(torch_or_none(), ((o, "o"),), "wavealign.Plan.unpermute_rows")
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
        if source.format == "flex":
            from . import flex

            return flex.block_mask(self, source.seq_lengths[1], device=source.device)
        if self.planner == "gpu":
            return self._device_permuted_mask()
        permuted = self._handle.permuted_mask()
        if source.format == "csr":
            row_ptr, col_idx = permuted.csr()
            row_dtype, col_dtype = source.dtype
            return self._to_caller_as(row_ptr, row_dtype), self._to_caller_as(col_idx, col_dtype)
        dense = permuted.dense()
        return self._to_caller_as(dense[0] if source.dense_ndim == 2 else dense, source.dtype)

    def _device_permuted_mask(self) -> Any:
        """permuted_mask() of a GPU-built plan, on its device (a CSR result synchronizes once)."""
        import torch

        source = self._source
        index = self.permutation.to(torch.int64)[:, :, None]
        permuted = torch.take_along_dim(self._handle.device_mask, index, dim=1)
        if source.format == "csr":
            row_ptr, col_idx = _csr_of_rows(torch, permuted.view(self.heads * self.q_blocks, self.kv_blocks))
            row_dtype, col_dtype = source.dtype
            return row_ptr.to(row_dtype), col_idx.to(col_dtype)
        return (permuted[0] if source.dense_ndim == 2 else permuted).to(source.dtype)

    def _to_caller_as(self, array: np.ndarray, dtype: Any) -> Any:
        """`array` in the caller's framework and dtype (a numpy or a torch dtype, as the input had)."""
        if self._source.framework == "torch":
            return self._to_caller(array).to(dtype)
        return array.astype(dtype, copy=False)


def _csr_of_rows(torch: Any, rows: Any) -> tuple[Any, Any]:
    """(row_ptr int64 [R+1], col_idx int32 [nnz]) of a bool [R, NB] device tensor, columns ascending per row.

    nnz is data-dependent, so this synchronizes the device once.
    """
    row_ptr = torch.zeros(rows.shape[0] + 1, dtype=torch.int64, device=rows.device)
    row_ptr[1:] = torch.cumsum(rows.sum(dim=1), dim=0)
    return row_ptr, rows.nonzero()[:, 1].to(torch.int32)


def _device_batch_schedule(torch: Any, permutation: Any, batch: int, heads: int, head_order: str) -> Any:
    """int32 [Bs, heads*MB, 2] from a device permutation [mask heads, MB]: Plan._batch_schedule_host's layout,
    built on the device (fixed shapes, no host synchronization)."""
    mask_heads, q_blocks = permutation.shape
    groups = 1 if mask_heads == heads else batch
    local = torch.arange(heads, dtype=torch.int32, device=permutation.device)
    local = local[None, :, None].expand(groups, heads, q_blocks)
    items = torch.stack([local, permutation.view(groups, heads, q_blocks)], dim=-1)
    if head_order != "sequential":
        items = items.transpose(1, 2)
    return items.reshape(groups, heads * q_blocks, 2).contiguous()


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
         threads: int = 0, planner: str = "auto", profile: Any = None, tokens: int | None = None) -> Plan:
    """Plans the WaveAlign row order of a block mask: on the mask's GPU for CUDA masks, else on the CPU.

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
        threads: worker threads over heads of the CPU plan (0 = all cores); the plan does not depend on it.
        planner: "auto" (the GPU plan for a CUDA mask when the package has its CUDA code, else the CPU plan),
            "cpu" (always the CPU plan) or "gpu" (the GPU plan; a CUDA mask is required).
        profile: a calibrated skip profile (docs/skip-profile.md): a path (str or os.PathLike) to its JSON file,
            its JSON text, or a dict of it; None = no profile. With skip="auto", heads the statistics let through
            are reordered only when the profile's kernel gain x plan_reuse exceeds its plan cost (their reason
            names the profile's device); with another skip policy it is checked but has no effect. Parsed
            profiles are cached (a file by path, modification time and size).
        tokens: the sequence length the profile is read at; None = the BlockMask's seq_lengths[0] for a
            FlexAttention mask, else q_blocks x kv_block.

    The GPU plan runs on the current stream of the mask's device without host synchronization (creating the
    planner of a new device, shape and config synchronizes once); skip="auto" then decides from the mask
    statistics only, or with a profile from the statistics and then the profile's gain and plan cost, both
    on the device. The CPU plan of a CUDA mask copies it to the host (a device synchronization) and puts the
    plan's tensors on that device. See docs/python.md.
    """
    order = check_choice(order, "order", "order")
    skip = check_choice(skip, "skip", "skip")
    gpu = check_choice(gpu, "gpu", "gpu")
    wave = 0 if wave_size is None else check_int(wave_size, "wave_size", 1)
    iterations = check_int(iterations, "iterations", 1)
    seed = check_int(seed, "seed", 0, UINT64_MAX)
    threads = check_int(threads, "threads", 0)
    head_dim = check_int(head_dim, "head_dim", 1)
    if isinstance(plan_reuse, bool) or not isinstance(plan_reuse, (int, float)) or not plan_reuse > 0:
        raise invalid("plan_reuse", f"must be a number > 0, got {plan_reuse!r}")
    blocks = block_pair(block_size)
    if planner not in PLANNERS:
        raise invalid("planner", f"unknown value {planner!r} (expected one of: {', '.join(PLANNERS)})")
    parsed = _profile.resolve(profile)
    tokens = None if tokens is None else check_int(tokens, "tokens", 0, INT64_MAX)

    if planner != "cpu" and _on_cuda(block_mask):
        if planner == "gpu" or _gpu_plan.available():
            options = {"order": order, "gpu": gpu, "wave_size": wave, "iterations": iterations, "seed": seed,
                       "skip": skip, "head_dim": head_dim, "element_bytes": 2, "kv_block": blocks[1],
                       "plan_reuse": float(plan_reuse), "profile": parsed, "tokens": tokens}
            handle, source, blocks = _device_plan(block_mask, heads, kv_blocks, blocks, options)
            ops.register()
            return Plan(handle, source, blocks)
    elif planner == "gpu":
        raise invalid("planner", "'gpu' needs a mask on a CUDA device (a torch tensor, a CSR pair of them or a "
                                 "FlexAttention BlockMask on CUDA)")

    if hasattr(block_mask, "kv_num_blocks") and hasattr(block_mask, "kv_indices"):
        mask, source, blocks = _flex_mask(block_mask, kv_blocks)
    elif isinstance(block_mask, (tuple, list)):
        mask, source = _csr_mask(block_mask, heads, kv_blocks)
    else:
        mask, source = _dense_mask(block_mask)

    if tokens is None:
        tokens = _default_tokens(source)
    handle = _core.make_plan(mask, order, gpu, wave, iterations, seed, skip, threads, head_dim, 2, blocks[1],
                             float(plan_reuse), None if parsed is None else parsed.core, tokens)
    if source.framework == "torch":
        ops.register()
    return Plan(handle, source, blocks)


PLANNERS = ("auto", "cpu", "gpu")


def _default_tokens(source: _Source) -> int:
    """PlanConfig::tokens when `tokens` is not given: a FlexAttention mask's query length, else 0 (the C++
    default, q_blocks x kv_block)."""
    if source.format == "flex" and source.seq_lengths is not None:
        return int(source.seq_lengths[0])
    return 0


def _on_cuda(block_mask: Any) -> bool:
    """Whether the mask (dense tensor, CSR pair or BlockMask) lives on a CUDA device."""
    if hasattr(block_mask, "kv_num_blocks") and hasattr(block_mask, "kv_indices"):
        tensor = block_mask.kv_num_blocks
    elif isinstance(block_mask, (tuple, list)):
        tensor = block_mask[0] if block_mask else None
    else:
        tensor = block_mask
    return is_torch_tensor(tensor) and tensor.device.type == "cuda"


def _device_plan(block_mask: Any, heads: int | None, kv_blocks: int | None, blocks: tuple[int, int],
                 options: dict[str, Any]) -> tuple[Any, _Source, tuple[int, int]]:
    """The GPU plan of a CUDA mask: (device handle, source, block size). Only shapes and dtypes are checked on
    the host; the values are never read there."""
    import torch

    if hasattr(block_mask, "kv_num_blocks") and hasattr(block_mask, "kv_indices"):
        arrays = _flex_arrays(block_mask)
        counts = arrays["kv_num_blocks"]
        batch, flex_heads, q_blocks = (int(n) for n in counts.shape)
        blocks, seq_lengths, kv_blocks = _flex_geometry(block_mask, arrays, kv_blocks)
        pairs = []
        for count_name, index_name in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
            count, indices = arrays[count_name], arrays[index_name]
            if (count is None) != (indices is None):
                raise invalid("full_kv_indices", "full_kv_num_blocks and full_kv_indices come together")
            if count is None:
                continue
            for value, name in ((count, count_name), (indices, index_name)):
                _check_device_tensor(value, name, counts.device, (torch.int32,))
            if tuple(count.shape) != tuple(counts.shape) or tuple(indices.shape[:3]) != tuple(counts.shape):
                raise invalid(index_name, f"has shape {list(indices.shape)}, expected [{batch}, {flex_heads}, "
                                          f"{q_blocks}, width] with {count_name} {list(count.shape)}")
            pairs.append((count.reshape(batch * flex_heads, q_blocks),
                          indices.reshape(batch * flex_heads, q_blocks, indices.shape[-1])))
        _check_plan_shape(batch * flex_heads, q_blocks, kv_blocks)
        dense = _gpu_plan.dense_from_flex(torch, pairs, kv_blocks)
        if options["tokens"] is None:
            options = {**options, "tokens": seq_lengths[0]}
        handle = _gpu_plan.plan_on_device(torch, counts.device, batch * flex_heads, q_blocks, kv_blocks, options,
                                          dense=dense)
        source = _Source("flex", "torch", counts.device, flex=block_mask, flex_batch_heads=(batch, flex_heads),
                         seq_lengths=seq_lengths)
        return handle, source, blocks
    if isinstance(block_mask, (tuple, list)):
        row_ptr, col_idx, heads, kv_blocks = _csr_parts(block_mask, heads, kv_blocks)
        _check_device_tensor(row_ptr, "row_ptr", row_ptr.device, (torch.int64, torch.int32), ndim=1)
        _check_device_tensor(col_idx, "col_idx", row_ptr.device, (torch.int32, torch.int64), ndim=1)
        rows = row_ptr.numel() - 1
        if rows <= 0 or rows % heads:
            raise invalid("row_ptr", f"has {row_ptr.numel()} entries, expected heads*q_blocks+1 "
                                     f"with heads = {heads}")
        _check_plan_shape(heads, rows // heads, kv_blocks)
        csr = (row_ptr.to(torch.int64).contiguous(), col_idx.to(torch.int32).contiguous())
        handle = _gpu_plan.plan_on_device(torch, row_ptr.device, heads, rows // heads, kv_blocks, options, csr=csr)
        return handle, _Source("csr", "torch", row_ptr.device, dtype=(row_ptr.dtype, col_idx.dtype)), blocks
    _check_device_tensor(block_mask, "block_mask", block_mask.device, (torch.bool, torch.uint8))
    if block_mask.dim() not in (2, 3):
        raise invalid("block_mask", f"must be [H, MB, NB] or [MB, NB], got shape {list(block_mask.shape)}")
    mask3 = block_mask if block_mask.dim() == 3 else block_mask.unsqueeze(0)
    _check_plan_shape(*(int(n) for n in mask3.shape))
    # A bool copy: the plan owns the mask it was built from (later in-place writes to the caller's tensor do
    # not change it), and uint8 values other than 0/1 become 0/1.
    dense = mask3.detach().ne(0)
    handle = _gpu_plan.plan_on_device(torch, block_mask.device, *(int(n) for n in mask3.shape), options,
                                      dense=dense)
    return handle, _Source("dense", "torch", block_mask.device, block_mask.dim(), block_mask.dtype), blocks


def _check_device_tensor(value: Any, name: str, device: Any, dtypes: tuple[Any, ...],
                         ndim: int | None = None) -> None:
    """A torch tensor on `device` with one of `dtypes` (and `ndim` dimensions when given)."""
    if not is_torch_tensor(value):
        raise invalid(name, f"must be a torch.Tensor on {device} like the rest of the mask, "
                            f"got {type(value).__name__}")
    if value.device != device:
        raise invalid(name, f"is on {value.device}, the mask is on {device}")
    if value.dtype not in dtypes:
        raise invalid(name, f"has dtype {value.dtype}, expected {' or '.join(str(d) for d in dtypes)}")
    if ndim is not None and value.dim() != ndim:
        raise invalid(name, f"must have {ndim} dimension(s), got shape {list(value.shape)}")


def _check_plan_shape(heads: int, q_blocks: int, kv_blocks: int) -> None:
    if min(heads, q_blocks, kv_blocks) < 1:
        raise invalid("block_mask", f"has an empty dimension: [{heads}, {q_blocks}, {kv_blocks}]")


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


def _csr_mask(block_mask: Any, heads: int | None, kv_blocks: int | None) -> tuple[Any, _Source]:
    row_ptr, col_idx, heads, kv_blocks = _csr_parts(block_mask, heads, kv_blocks)
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


def _flex_mask(block_mask: Any, kv_blocks: int | None) -> tuple[Any, _Source, tuple[int, int]]:
    arrays = _flex_arrays(block_mask)
    counts = arrays["kv_num_blocks"]
    batch, heads, q_blocks = (int(n) for n in counts.shape)
    blocks, seq_lengths, kv_blocks = _flex_geometry(block_mask, arrays, kv_blocks)
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
