"""The plan of a CUDA mask built on its device (wavealign::cuda::GpuPlanner), on the current torch stream.

A call allocates its outputs and its scratch through torch (the caching allocator, on the current stream) and
enqueues the planner: no host synchronization, so it can be captured in a CUDA graph once the planner of its
(device, shape, config) exists. Creating a planner synchronizes once (prepare() writes the start block of
Stage 1 into its prepared workspace). The prepared workspace is only read by plan() calls, and every call has
scratch of its own, so threads planning on their own streams never share device memory.

The mask's values are validated on the device (the rules of wavealign/ingest.h); the record is read on the
host with the statistics and skip flags, at the plan's first host access (DeviceHandle.check).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from . import _core
from ._ingest import Ingested

_CACHE_SIZE = 8
_planners: OrderedDict[tuple, tuple[Any, Any, int]] = OrderedDict()
_lock = threading.Lock()


def available() -> bool:
    """True when the extension was built with the GPU planner."""
    return bool(getattr(_core, "has_gpu_plan", False))


def _planner(torch: Any, device: Any, shape: tuple[int, int, int],
             options: dict[str, Any]) -> tuple[Any, Any, int]:
    """(planner, prepared workspace, the stream it was made on) of this device, shape and config: made,
    prepared and cached on first use.

    The prepared workspace is a torch uint8 tensor (the caching allocator's memory) that plan() calls only
    read. At most _CACHE_SIZE planners are kept, oldest out first. options["profile"] is a parsed _profile.Profile or None and
    enters the key by its content digest, so a planner made with one profile never serves another;
    options["tokens"] None is 0.
    """
    profile = options.get("profile")
    tokens = options.get("tokens") or 0
    plain = sorted(name for name in options if name not in ("profile", "tokens"))
    key = (device.index, *shape, *(options[name] for name in plain), tokens,
           None if profile is None else profile.key)
    with _lock:
        entry = _planners.get(key)
        if entry is not None:
            _planners.move_to_end(key)
            return entry
        planner = _core.GpuPlanner(*shape, options["order"], options["gpu"], options["wave_size"],
                                   options["iterations"], options["seed"], options["skip"], options["head_dim"],
                                   options["element_bytes"], options["kv_block"], options["plan_reuse"],
                                   None if profile is None else profile.core, tokens)
        prepared = torch.empty(max(1, planner.prepared_bytes), dtype=torch.uint8, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream
        planner.prepare(prepared.data_ptr(), prepared.numel(), stream)
        entry = (planner, prepared, stream)
        _planners[key] = entry
        while len(_planners) > _CACHE_SIZE:
            _planners.popitem(last=False)
        return entry


def clear_cache() -> None:
    """Drops the cached planners and their workspaces."""
    with _lock:
        _planners.clear()


def plan_on_device(torch: Any, ingested: Ingested, options: dict[str, Any]) -> DeviceHandle:
    """Enqueues the plan of a device mask on the current stream of its device and returns its handle."""
    if not available():
        raise RuntimeError("wavealign was built without its CUDA code, so the GPU plan is not available")
    source = ingested.source
    device = source.device
    heads, q_blocks, kv_blocks = ingested.view.shape
    rows = heads * q_blocks
    with torch.cuda.device(device):
        planner, prepared, prepared_on = _planner(torch, device, (heads, q_blocks, kv_blocks), options)
        stream = torch.cuda.current_stream(device)
        outputs = _core.GpuPlanOutputs()
        ints = {"dtype": torch.int32, "device": device}
        tensors = {"permutation": torch.empty((heads, q_blocks), **ints),
                   "inverse": torch.empty((heads, q_blocks), **ints),
                   "schedule": torch.empty((rows, 2), **ints),
                   # One block for the host to read at once: the validation record, the statistics, the skip
                   # flags (MaskStats is 8-byte aligned after the 40-byte record).
                   "host": torch.empty(_core.mask_error_bytes + heads * (_core.gpu_plan_stats_bytes + 1),
                                       dtype=torch.uint8, device=device)}
        outputs.permutations = tensors["permutation"].data_ptr()
        outputs.inverses = tensors["inverse"].data_ptr()
        outputs.schedule = tensors["schedule"].data_ptr()
        outputs.error = tensors["host"].data_ptr()
        outputs.stats = outputs.error + _core.mask_error_bytes
        outputs.skip = outputs.stats + heads * _core.gpu_plan_stats_bytes
        if source.format == "csr":
            row_ptr, col_idx = ingested.owned
            nnz = col_idx.numel()
            tensors["csr"] = (row_ptr, col_idx if col_idx.dtype == torch.int32 else None)
            # The permuted CSR of a CSR mask, exactly nnz entries (its nnz is known on the host).
            tensors["permuted_csr"] = (torch.empty(rows + 1, dtype=torch.int64, device=device),
                                       torch.empty(max(nnz, 1), **ints))
            outputs.permuted_row_ptr = tensors["permuted_csr"][0].data_ptr()
            outputs.permuted_col_idx = tensors["permuted_csr"][1].data_ptr()
            outputs.permuted_col_capacity = max(nnz, 1)
        else:
            # The nnz of a dense or Flex mask is known only on the device: the column buffer holds the most it
            # can have (every cell for a dense mask; both pairs' widths, at most NB, per row for a Flex one).
            width = kv_blocks
            if source.format == "flex":
                arrays = [getattr(source.flex, name, None) for name in ("kv_indices", "full_kv_indices")]
                width = min(kv_blocks, sum(int(a.shape[-1]) for a in arrays if a is not None))
            capacity = max(rows * width, 1)
            tensors["csr"] = (torch.empty(rows + 1, dtype=torch.int64, device=device), torch.empty(capacity, **ints))
            outputs.csr_row_ptr = tensors["csr"][0].data_ptr()
            outputs.csr_col_idx = tensors["csr"][1].data_ptr()
            outputs.csr_col_capacity = capacity
        scratch = torch.empty(max(1, planner.scratch_bytes()), dtype=torch.uint8, device=device)
        planner.plan(ingested.view, outputs, prepared.data_ptr(), scratch.data_ptr(), scratch.numel(),
                     stream.cuda_stream)
        if ingested.inputs_record is not None:
            # A mask method's q or k held NaN or inf: its record becomes the plan's (on the device, in stream
            # order), so the plan raises it at its first host access and the kernel computes nothing from it.
            record = tensors["host"][:_core.mask_error_bytes].view(torch.int32)
            upstream = ingested.inputs_record
            record.copy_(torch.where(upstream[0] != 0, upstream, record))
        if stream.cuda_stream != prepared_on and not torch.cuda.is_current_stream_capturing():
            # Read on another stream than it was allocated on: should the planner leave the cache, the
            # allocator must not hand its memory out again before this stream's work is done.
            prepared.record_stream(stream)
        if source.format == "csr":
            if tensors["csr"][1] is None:  # int64 columns: the kernel reads int32 (exact once the record is clear)
                tensors["csr"] = (tensors["csr"][0], ingested.owned[1].to(torch.int32))
            tensors["permuted_csr"] = (tensors["permuted_csr"][0], tensors["permuted_csr"][1][:nnz])
    # `scratch` is released here: the caching allocator hands it out again only to later work on this stream.
    return DeviceHandle(planner, ingested, tensors, stream)


class DeviceHandle:
    """A plan built on the device: the handle interface of _plan.Plan (see _plan.CpuHandle), over device tensors.

    Device tensors (H = heads, MB = query blocks, NB = KV blocks): permutation / inverse int32 [H, MB],
    schedule int32 [H*MB, 2] (sequential head order), the mask's CSR (row_ptr int64 [H*MB+1], col_idx int32:
    the validated copy of a CSR input, or the planner's output with a capacity bound for a dense or Flex one),
    the permuted CSR of a CSR input, the plan's dense copy of a dense input, and one uint8 block holding the
    validation record, the statistics and the skip flags. That block is read on the host once, on the
    planning stream, by the first call that needs a host value (check); that call synchronizes.
    """

    planner = "gpu"

    def __init__(self, planner: Any, ingested: Ingested, tensors: dict[str, Any], stream: Any) -> None:
        self._planner = planner
        self._source = ingested.source
        self._owned = ingested.owned
        self._tensors = tensors
        self._stream = stream
        self.home = ingested.source.device
        self.heads: int = planner.heads
        self.q_blocks: int = planner.q_blocks
        self.kv_blocks: int = planner.kv_blocks
        self.wave_size: int = planner.wave_size
        self.order: str = planner.order
        self._lock = threading.Lock()
        self._message: str | None = None
        self._decoded: tuple[list[bool], list[str], dict[str, Any]] | None = None
        self._host_permutation: np.ndarray | None = None
        self._host_inverse: np.ndarray | None = None

    # ---- the validation record and the host values ------------------------------------------------------

    def check(self) -> None:
        """Reads the record, statistics and skip flags (once; synchronizes) and raises the mask's ValueError
        (the CPU plan's message) if the device found a broken rule."""
        if self._decoded is None:
            import torch

            with self._lock:
                if self._decoded is None:
                    with torch.cuda.stream(self._stream):
                        host = self._tensors["host"].cpu().numpy()
                    record = host[:_core.mask_error_bytes]
                    stats = host[_core.mask_error_bytes:_core.mask_error_bytes + self.heads * _core.gpu_plan_stats_bytes]
                    skip = host[_core.mask_error_bytes + self.heads * _core.gpu_plan_stats_bytes:]
                    self._message = _core.mask_error_message(record)
                    self._decoded = self._planner.decode(stats, skip)
        if self._message is not None:
            raise ValueError(self._message)

    def pending_error(self) -> Any:
        """The device record (int32 [10], nonzero first entry = invalid) while the host has not read it; None
        once it has been read and the mask is valid; raises the mask's ValueError once it is known invalid."""
        if self._decoded is None:
            import torch

            return self._tensors["host"][:_core.mask_error_bytes].view(torch.int32)
        self.check()
        return None

    def decisions(self) -> tuple[list[bool], list[str], dict[str, Any]]:
        self.check()
        skipped, reasons, stats = self._decoded
        return list(skipped), list(reasons), dict(stats)

    # ---- host arrays -------------------------------------------------------------------------------------

    def permutations(self) -> np.ndarray:
        if self._host_permutation is None:
            self._host_permutation = self._tensors["permutation"].cpu().numpy()
        return self._host_permutation

    def inverses(self) -> np.ndarray:
        if self._host_inverse is None:
            self._host_inverse = self._tensors["inverse"].cpu().numpy()
        return self._host_inverse

    def csr_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The mask's CSR on the host, exactly nnz columns (checks first)."""
        self.check()
        row_ptr, col_idx = self._tensors["csr"]
        row_host = row_ptr.cpu().numpy()
        return row_host, col_idx[:int(row_host[-1])].cpu().numpy()

    def schedule_array(self, batch: int, heads: int, head_order: str) -> np.ndarray:
        return _core.batch_schedule(self.permutations(), batch, heads, head_order)

    # ---- device tensors ----------------------------------------------------------------------------------

    def tensors(self, device: Any) -> tuple[Any, Any]:
        permutation, inverse = self._tensors["permutation"], self._tensors["inverse"]
        if device == self.home:
            return permutation, inverse
        return permutation.to(device), inverse.to(device)

    def csr_tensors(self, device: Any) -> tuple[Any, Any]:
        """(row_ptr int64, col_idx int32) for the kernel on `device`: on the plan's device its own tensors
        (col_idx capacity-sized for a dense or Flex mask); elsewhere an exact copy (checks first)."""
        if device == self.home:
            return self._tensors["csr"]
        import torch

        return tuple(torch.from_numpy(array).to(device) for array in self.csr_arrays())

    def schedule_tensor(self, device: Any, batch: int, heads: int, head_order: str) -> Any:
        """int32 [batch*heads*MB, 2] (make_batch_schedule's layout), written on the device from the plan's
        permutation on the current stream: no host synchronization."""
        import torch

        if device != self.home:
            return torch.from_numpy(self.schedule_array(batch, heads, head_order)).to(device)
        if (batch, heads, head_order) == (1, self.heads, "sequential"):
            return self._tensors["schedule"]
        schedule = torch.empty((batch * heads * self.q_blocks, 2), dtype=torch.int32, device=device)
        with torch.cuda.device(device):
            _core.gpu_batch_schedule(self._tensors["permutation"].data_ptr(), self.heads, self.q_blocks, batch, heads,
                                     head_order, schedule.data_ptr(), torch.cuda.current_stream(device).cuda_stream)
        return schedule

    # ---- the permuted mask -------------------------------------------------------------------------------

    def permuted_dense(self) -> Any:
        """bool [H, MB, NB] on the device, rows in plan order (a dense input's plan; no synchronization)."""
        import torch

        index = self._tensors["permutation"].to(torch.int64)[:, :, None]
        return torch.take_along_dim(self._owned, index, dim=1)

    def permuted_csr(self) -> tuple[Any, Any]:
        """(row_ptr int64, col_idx int32) on the device, rows in plan order (a CSR input's plan; checks first)."""
        self.check()
        return self._tensors["permuted_csr"]

    def permuted_flex_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(kv_num_blocks [H, MB], kv_indices [H, MB, NB]) of the permuted mask on the host."""
        if self._source.format == "csr":
            row_ptr, col_idx = (x.cpu().numpy() for x in self.permuted_csr())
            mask = _core.mask_from_csr(row_ptr, col_idx, self.heads, self.kv_blocks)
        else:
            mask = _core.mask_from_dense(self.permuted_dense().cpu().numpy())
        return mask.flex()
