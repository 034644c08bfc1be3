"""wavealign.plan(): the WaveAlign row order of a block mask, and the Plan object that carries it.

A Plan holds one handle over one buffer of the C++ plan layout (wavealign/plan_buffers.h): a HostHandle (the
CPU plan's export, or a plan restored from a pickle) or a _gpu_plan.DeviceHandle (the GPU planner's device
buffer); both answer the same questions (see HostHandle), so the Plan never asks where it was built. The views
it derives for a device (the buffer's arrays there, the kernel's schedule of a batch layout) are cached per key
in a _DeviceCache.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from . import _core, _flex_mask, _gpu_plan, _ingest, _profile, _rows, ops
from ._buffers import PlanBuffers, exact, host_mask, permuted_host_mask
from ._ingest import Source
from ._util import (INT64_MAX, UINT64_MAX, block_pair, blocks_for, check_choice, check_int, heads_view_shape,
                    host_array, invalid, is_torch_tensor, torch_or_none)


class HostHandle:
    """A plan whose outputs live in a host buffer: built by the CPU plan (the C++ make_plan result, exported in
    the one buffer layout with its decisions), or restored from a pickle. The handle interface, which
    _gpu_plan.DeviceHandle also answers, so that the Plan never asks where it was built:

        planner ("cpu" or "gpu": where it was built), heads, q_blocks, kv_blocks, wave_size, order, home (the
        device of its own buffer; None: the host)
        check()                   raises the mask's ValueError (a host buffer's mask was checked already)
        pending_error()           the device validation record not yet read on the host, or None
        decisions()               (skipped, reasons, stats)
        host()                    the buffer on the host (PlanBuffers over numpy)
        on(device)                the buffer on a torch device (PlanBuffers over torch)
        permutations(), inverses()                       int32 [H, MB] numpy
        schedule_array(batch, heads, head_order)         make_batch_schedule's int32 [items, 2] numpy
        schedule_tensor(device, batch, heads, head_order)   the same as a tensor on `device`
        permuted_dense(), permuted_csr(), permuted_flex_arrays()   the mask in plan order
    """

    home = None

    def __init__(self, buffers: PlanBuffers, decisions: tuple[list[bool], list[str], dict[str, Any]],
                 wave_size: int, order: str, planner: str = "cpu") -> None:
        self.buffers = buffers
        self._decisions = decisions
        self.planner = planner
        self.heads: int = buffers.heads
        self.q_blocks: int = buffers.q_blocks
        self.kv_blocks: int = buffers.layout["kv_blocks"]
        self.wave_size = wave_size
        self.order = order

    @classmethod
    def from_cpu_plan(cls, handle: Any) -> HostHandle:
        buffer, layout, skipped, reasons, stats = handle.export()
        return cls(PlanBuffers(buffer, layout), (skipped, reasons, stats), handle.wave_size, handle.order)

    def check(self) -> None:
        """Nothing to read: the mask of a host buffer was checked before it was planned."""

    def pending_error(self) -> Any:
        return None

    def decisions(self) -> tuple[list[bool], list[str], dict[str, Any]]:
        skipped, reasons, stats = self._decisions
        return list(skipped), list(reasons), dict(stats)

    def host(self) -> PlanBuffers:
        return self.buffers

    def on(self, device: Any) -> PlanBuffers:
        return self.buffers.to(device)

    def permutations(self) -> np.ndarray:
        return self.buffers.permutations()

    def inverses(self) -> np.ndarray:
        return self.buffers.inverses()

    def schedule_array(self, batch: int, heads: int, head_order: str) -> np.ndarray:
        if (batch, heads, head_order) == (1, self.heads, "sequential"):
            return self.buffers.schedule()
        return _core.batch_schedule(self.permutations(), batch, heads, head_order)

    def schedule_tensor(self, device: Any, batch: int, heads: int, head_order: str) -> Any:
        import torch

        return torch.from_numpy(self.schedule_array(batch, heads, head_order)).to(device)

    def permuted_dense(self) -> np.ndarray:
        return permuted_host_mask(self.buffers, self.kv_blocks).dense()

    def permuted_csr(self) -> tuple[np.ndarray, np.ndarray]:
        return exact(*self.buffers.permuted_csr())

    def permuted_flex_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return permuted_host_mask(self.buffers, self.kv_blocks).flex()


_CACHE_LIMIT = 8


class _DeviceCache:
    """Tensors a plan derives for a key (a device, a batch layout), made on first use and kept: at most
    _CACHE_LIMIT, oldest out, so a plan's memory stays bounded whatever its callers ask for.

    A tensor made on one CUDA stream may be asked for from another (a plan shared by threads on their own
    streams): an entry keeps an event recorded after it was made, and a caller on another stream waits for
    it on the device (no host synchronization) and marks the tensors as used by that stream, so the caching
    allocator does not hand their memory out again while that stream may still read it. Nothing made during
    CUDA graph capture is kept (its memory belongs to the graph), and nothing waits there (capture begins
    after a device synchronization). Under torch.compile an entry is only looked up (made by an eager call).
    """

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[Any, Any, int | None]] = {}  # key -> (tensors, event, stream)
        self._lock = threading.Lock()

    def put(self, key: tuple, value: Any) -> None:
        """A tensor tuple the plan made with itself (its planning stream orders it, like any output)."""
        ops.trust(*value)
        with self._lock:
            self._entries[key] = (value, None, None)

    def get(self, key: tuple, device: Any, make: Callable[[], Any]) -> Any:
        torch = torch_or_none()
        if torch.compiler.is_compiling():
            entry = self._entries.get(key)
            return make() if entry is None else entry[0]
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        entry = self._entries.get(key)
        if entry is None:
            value = make()
            ops.trust(*value)  # the plan made them: the ops skip their device check while they are unchanged
            if stream is not None and torch.cuda.is_current_stream_capturing():
                return value
            event = None
            if stream is not None:
                event = torch.cuda.Event()
                event.record(stream)
            with self._lock:
                entry = self._entries.setdefault(key, (value, event, None if stream is None else stream.cuda_stream))
                while len(self._entries) > _CACHE_LIMIT:
                    self._entries.pop(next(iter(self._entries)))
        value, event, made_on = entry
        if event is not None and stream.cuda_stream != made_on and not torch.cuda.is_current_stream_capturing():
            stream.wait_event(event)
            for tensor in value:
                tensor.record_stream(stream)
        return value

    def __len__(self) -> int:
        return len(self._entries)


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
    A plan built on the GPU keeps its arrays on the device; its mask was validated there, and the result is read
    on the host at the first host access (check(), skipped, reason, stats, csr(), a CSR or Flex
    permuted_mask()), which synchronizes once and raises the ValueError of an invalid mask.

    A plan pickles and deep-copies: the copy holds the plan's host state (its buffer read back to the host, its
    decisions, where its mask came from) and puts its tensors on the mask's device again when first used.
    """

    def __init__(self, handle: Any, source: Source, block_size: tuple[int, int], *, eager: bool = True) -> None:
        self._handle = handle
        self._source = source
        self.block_size = block_size
        self.heads: int = handle.heads
        self.q_blocks: int = handle.q_blocks
        self.kv_blocks: int = handle.kv_blocks
        self.wave_size: int = handle.wave_size
        self.order: str = handle.order
        self.planner: str = handle.planner
        self._decisions: tuple[list[bool], list[str], dict[str, Any]] | None = None
        self._cache = _DeviceCache()
        if source.framework == "torch" and eager:
            # The tensors of the default call are there from the start (a compiled caller finds them ready):
            # a GPU plan's own buffer, a CPU plan's buffer copied to the mask's device in one transfer.
            device = source.device
            self._cache.put(("views", _key(device)), _views(handle.on(device)))

    def __repr__(self) -> str:
        # A GPU-built plan's skip flags are on the device until read: repr does not synchronize for them.
        skipped = "" if self._decisions is None else f", skipped={sum(self._decisions[0])}/{self.heads}"
        return (f"wavealign.Plan(heads={self.heads}, q_blocks={self.q_blocks}, kv_blocks={self.kv_blocks}, "
                f"block_size={self.block_size}, order={self.order!r}, wave_size={self.wave_size}, "
                f"planner={self.planner!r}{skipped})")

    # ---- pickle and copy: the host state ------------------------------------------------------------------

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        host = self._handle.host()  # a GPU plan reads its buffer back (and raises for an invalid mask)
        state = {"buffer": host.buffer, "layout": host.layout, "decisions": self._decided(),
                 "wave_size": self.wave_size, "order": self.order, "planner": self.planner,
                 "source": self._source, "block_size": self.block_size}
        return _restore, (state,)

    def __deepcopy__(self, memo: dict[int, Any]) -> Plan:
        import copy

        restore, (state,) = self.__reduce__()
        return restore(copy.deepcopy(state, memo))

    # ---- the mask's validation, per-head decisions and statistics (host values) --------------------------

    def check(self) -> None:
        """Raises the ValueError of an invalid mask (the text the CPU plan raises for it in wavealign.plan()).

        A GPU-built plan validates its mask on the device; the first call reads the result (one
        synchronization). A CPU-built plan's mask was checked before planning: nothing to do.
        """
        self._handle.check()

    def _decided(self) -> tuple[list[bool], list[str], dict[str, Any]]:
        if self._decisions is None:
            self._decisions = self._handle.decisions()
        return self._decisions

    @property
    def skipped(self) -> list[bool]:
        """Per head, True when the adaptive skip kept the original order."""
        return list(self._decided()[0])

    @property
    def reason(self) -> list[str]:
        """Per head, why the head was (not) reordered, with the numbers that decided."""
        return list(self._decided()[1])

    @property
    def stats(self) -> dict[str, Any]:
        """Per-head mask statistics and plan timings (a GPU plan has no per-head timings: NaN)."""
        return dict(self._decided()[2])

    @property
    def source_block_mask(self) -> Any:
        """The FlexAttention BlockMask the plan was built from (its mask_mod included), or None for a dense or
        CSR mask."""
        return self._source.flex if self._source.format == "flex" else None

    # ---- arrays in the caller's framework ---------------------------------------------------------------

    def _torch_source(self) -> bool:
        return self._source.framework == "torch"

    def _views(self, device: Any) -> tuple[Any, Any, Any, Any, Any]:
        """(permutation, inverse, sequential schedule, row_ptr, col_idx) tensors on `device`: views of the plan's
        buffer there."""
        return self._cache.get(("views", _key(device)), device, lambda: _views(self._handle.on(device)))

    @property
    def permutation(self) -> Any:
        """int32 [H, MB]: position p of head h runs original query block permutation[h, p]."""
        if self._torch_source():
            return self._views(self._source.device)[0]
        return self._handle.permutations()

    @property
    def inverse(self) -> Any:
        """int32 [H, MB]: the inverse permutation per head (inverse[h, permutation[h, p]] == p)."""
        if self._torch_source():
            return self._views(self._source.device)[1]
        return self._handle.inverses()

    def schedule(self, head_order: str = "sequential") -> Any:
        """int32 [H*MB, 2] (head, original query block) items in the order the kernel runs them.

        head_order: "sequential" (head by head) or "concurrent-heads" (position p of every head, then p+1).
        """
        check_choice(head_order, "head_order", "head_order")
        if self._torch_source():
            return self._schedule(self._source.device, 1, self.heads, head_order)
        return self._handle.schedule_array(1, self.heads, head_order)

    def csr(self) -> tuple[Any, Any]:
        """The original mask as (row_ptr int64 [H*MB+1], col_idx int32 [nnz]), columns ascending per row."""
        row_ptr, col_idx = exact(*self._handle.host().csr())
        return self._to_caller(row_ptr), self._to_caller(col_idx)

    def _to_caller(self, array: np.ndarray, dtype: Any = None) -> Any:
        """A host array in the caller's framework (and dtype: a numpy or a torch dtype, as the input had)."""
        if self._torch_source():
            import torch

            tensor = torch.from_numpy(np.ascontiguousarray(array)).to(self._source.device)
            return tensor if dtype is None else tensor.to(dtype)
        return array if dtype is None else array.astype(dtype, copy=False)

    # ---- device state for the kernel and the torch ops --------------------------------------------------

    def _schedule(self, device: Any, batch: int, heads: int, head_order: str) -> Any:
        if (batch, heads, head_order) == (1, self.heads, "sequential"):
            return self._views(device)[2]
        key = ("schedule", _key(device), batch, heads, head_order)
        return self._cache.get(key, device,
                               lambda: (self._handle.schedule_tensor(device, batch, heads, head_order),))[0]

    def _launch_tensors(self, device: Any, batch: int, heads: int, head_order: str) -> tuple[Any, Any, Any, Any]:
        """What one kernel launch over `batch` entries of `heads` heads on `device` reads.

        Returns (row_ptr int64 [H*MB+1], col_idx int32 [>= nnz], schedule int32 [batch*heads*MB, 2], error):
        the plan's mask (H = heads: shared by the batch, batch*heads: one per entry, or 1: shared by all) and
        make_batch_schedule's items (head = b*heads + h, batch-major). error is the device validation record
        (int32, nonzero first entry = invalid mask) while the host has not read it, else None; an invalid mask
        known on the host raises its ValueError here. A GPU plan used on another device is checked first.
        """
        error = self._handle.pending_error()
        if error is not None and device != self._handle.home:
            self._handle.check()
            error = None
        views = self._views(device)
        return views[3], views[4], self._schedule(device, batch, heads, head_order), error

    def _launch_arrays(self, batch: int, heads: int, head_order: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """_launch_tensors on the host (the CPU reference): (row_ptr, col_idx, schedule) numpy, checked."""
        row_ptr, col_idx = exact(*self._handle.host().csr())
        return row_ptr, col_idx, self._handle.schedule_array(batch, heads, head_order)

    # ---- plug-in path: run any kernel in plan order ------------------------------------------------------

    def permute_rows(self, x: Any) -> Any:
        """Gathers the query blocks of x [..., L, d] into plan order: [..., MB*q_block, d].

        The leading dimensions end in the mask's heads ([..., H, L, d]; a B*H-head mask also takes [B, H, L, d]; a
        one-head mask serves every head). A partial last block (L not a multiple of q_block) is padded with zero
        tokens, so the result always has MB*q_block tokens; unpermute_rows(o, seq_len=L) drops them again. A torch
        result is laid out in memory like x (docs/python.md, "Layout").
        """
        block = self.block_size[0]
        if is_torch_tensor(x):
            # The op checks x against the permutation when it runs (its body is not traced by torch.compile,
            # where a call into the extension here would break the graph).
            ops.register()
            ops.refuse_grad(torch_or_none(), ((x, "x"),), "wavealign.Plan.permute_rows")
            return torch_or_none().ops.wavealign.permute_rows(x, self._views(x.device)[0], block)
        array = host_array(x, "x")
        self._check_permute_input(array.shape, "x")
        return _rows.permute_numpy(array, self._handle.permutations(), block, "x")

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
            return torch_or_none().ops.wavealign.unpermute_rows(o, self._views(o.device)[1], block, length)
        return _rows.unpermute_numpy(host_array(o, "o"), self._handle.inverses(), block, length, "o")

    def _check_permute_input(self, shape: tuple[int, ...], argument: str) -> None:
        if len(shape) < 2:
            raise invalid(argument, f"must be [..., L, d], got shape {list(shape)}")
        _core.check_query_blocks(int(shape[-2]), self.block_size[0], self.q_blocks, argument)
        heads_view_shape(shape[:-2], self.heads, argument)

    def permuted_mask(self) -> Any:
        """The mask with each head's rows in plan order, in the input's format and framework.

        dense -> bool/uint8 [H, MB, NB] (or [MB, NB]); CSR -> (row_ptr, col_idx) with the input's dtypes;
        FlexAttention BlockMask -> a BlockMask over the permuted query blocks (see wavealign.flex.block_mask).
        A GPU-built plan of a CSR or Flex mask reads its validation first (see check()).
        """
        source = self._source
        if source.format == "flex":
            self._handle.check()
            return _flex_mask.permuted_block_mask(self, source.seq_lengths[1], device=source.device)
        if source.format == "csr":
            row_ptr, col_idx = self._handle.permuted_csr()
            row_dtype, col_dtype = source.dtype
            return self._caller_array(row_ptr, row_dtype), self._caller_array(col_idx, col_dtype)
        dense = self._handle.permuted_dense()
        return self._caller_array(dense[0] if source.dense_ndim == 2 else dense, source.dtype)

    def _caller_array(self, value: Any, dtype: Any) -> Any:
        """A handle's array (numpy, or a tensor on the plan's device) in the caller's framework and dtype."""
        if is_torch_tensor(value):
            return value.to(dtype)
        return self._to_caller(value, dtype)

    def _permuted_flex_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(kv_num_blocks int32 [H, MB], kv_indices int32 [H, MB, NB]) of the permuted mask on the host."""
        return self._handle.permuted_flex_arrays()


def _views(buffers: PlanBuffers) -> tuple[Any, Any, Any, Any, Any]:
    """(permutation, inverse, sequential schedule, row_ptr, col_idx) tensors of a device buffer. On the CPU the
    columns are cut to the mask's nnz (read on the host at no cost): the ops check CPU tensors by the ingest
    rules, whose last entry of row_ptr is col_idx's length."""
    row_ptr, col_idx = buffers.csr()
    if row_ptr.device.type == "cpu":
        row_ptr, col_idx = exact(row_ptr, col_idx)
    return buffers.permutations(), buffers.inverses(), buffers.schedule(), row_ptr, col_idx


def _restore(state: dict[str, Any]) -> Plan:
    """A Plan from the host state of __reduce__: its tensors go to the mask's device when first used."""
    handle = HostHandle(PlanBuffers(state["buffer"], state["layout"]), state["decisions"], state["wave_size"],
                        state["order"], state["planner"])
    plan = Plan(handle, state["source"], state["block_size"], eager=False)
    plan._decisions = state["decisions"]
    return plan


def _key(device: Any) -> tuple[str, int | None]:
    return device.type, device.index


def plan(block_mask: Any, wave_size: int | None = None, order: str = "wavealign", iterations: int = 10,
         seed: int = 0, skip: str = "auto", gpu: str = "h200", *, block_size: int | tuple[int, int] = 128,
         heads: int | None = None, kv_blocks: int | None = None, head_dim: int = 128, plan_reuse: float = 1.0,
         threads: int = 0, planner: str = "auto", profile: Any = None, tokens: int | None = None) -> Plan:
    """Plans the WaveAlign row order of a block mask: on the mask's GPU for CUDA masks, else on the CPU.

    Args:
        block_mask: one of
            - bool/uint8 [H, MB, NB] or [MB, NB] (numpy, torch CPU/CUDA, any DLPack producer);
            - a CSR pair (row_ptr int64/int32 [H*MB+1], col_idx int32/int64 [nnz]) with `kv_blocks` (and
              `heads`);
            - a FlexAttention BlockMask (kv_num_blocks / kv_indices, plus full_kv_* when present; B folds
              into heads; its BLOCK_SIZE overrides `block_size`).
        wave_size: rows per wave W; None = the slots of `gpu` (SMs x CTAs per SM).
        order: "wavealign" (Stage 1 + 2), "s1", "s2", "original", "shuffled", or a further order of
            docs/reordering.md ("com", "span", "wave-union", ...). "com" and "span" also have a GPU plan;
            the others are CPU plan only (planner="cpu" for a CUDA mask).
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
        profile: the calibrated skip profile (docs/skip-profile.md), chosen by the rule of the CLI's --profile:
            None (the default) = the built-in profile of `gpu` (the H200's; none for a preset without one), so
            plan(mask) decides as `wavealign reorder --mask mask.npy` does; "none" = no profile (the mask
            statistics alone decide); a GPU preset's name ("h200") = its built-in profile; else a path (str or
            os.PathLike) to a profile JSON file, its JSON text, or a dict of it. With skip="auto", heads the
            statistics let through are reordered only when the profile's kernel gain x plan_reuse exceeds its
            plan cost (their reason names the profile's device and the point it was read at); with another skip
            policy it is checked but has no effect. Parsed profiles are cached (a file by path, modification time
            and size).
        tokens: the sequence length the profile is read at; None = the BlockMask's seq_lengths[0] for a
            FlexAttention mask, else q_blocks x kv_block.

    Every mask is checked by the one ingest of wavealign/ingest.h. The CPU plan checks it here and raises
    ValueError naming the argument; the GPU plan checks it on the device and raises the same error at the
    plan's first host access (Plan.check). The GPU plan runs on the current stream of the mask's device without
    host synchronization (creating the planner of a new device, shape and config synchronizes once);
    skip="auto" then decides from the mask statistics only, or with a profile from the statistics and then the
    profile's gain and plan cost, both on the device. The CPU plan of a CUDA mask copies it to the host (a
    device synchronization) and puts the plan's tensors on that device. See docs/python.md.
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
    parsed = _profile.resolve(profile, gpu)
    tokens = None if tokens is None else check_int(tokens, "tokens", 0, INT64_MAX)

    on_device = planner != "cpu" and _ingest.on_cuda(block_mask) and (planner == "gpu" or _gpu_plan.available())
    if planner == "gpu" and not _ingest.on_cuda(block_mask):
        raise invalid("planner", "'gpu' needs a mask on a CUDA device (a torch tensor, a CSR pair of them or a "
                                 "FlexAttention BlockMask on CUDA)")
    if on_device:
        import torch

        with torch.cuda.device(_device_of(block_mask)):
            ingested = _ingest.ingest(block_mask, heads, kv_blocks, blocks, on_device=True)
    else:
        ingested = _ingest.ingest(block_mask, heads, kv_blocks, blocks, on_device=False)
    if tokens is None:
        tokens = ingested.source.default_tokens()
    if on_device:
        options = {"order": order, "gpu": gpu, "wave_size": wave, "iterations": iterations, "seed": seed,
                   "skip": skip, "head_dim": head_dim, "element_bytes": 2, "kv_block": ingested.block_size[1],
                   "plan_reuse": float(plan_reuse), "profile": parsed, "tokens": tokens}
        handle = _gpu_plan.plan_on_device(torch, ingested, options)
    else:
        mask = _core.ingest(ingested.view)
        planned = _core.make_plan(mask, order, gpu, wave, iterations, seed, skip, threads, head_dim, 2,
                                  ingested.block_size[1], float(plan_reuse), None if parsed is None else parsed.core,
                                  tokens)
        handle = HostHandle.from_cpu_plan(planned)
    if ingested.source.framework == "torch":
        ops.register()
    return Plan(handle, ingested.source, ingested.block_size)


PLANNERS = ("auto", "cpu", "gpu")


def _device_of(block_mask: Any) -> Any:
    if _ingest.is_flex(block_mask):
        return block_mask.kv_num_blocks.device
    if _ingest.is_csr_pair(block_mask):
        return block_mask[0].device
    return block_mask.device
