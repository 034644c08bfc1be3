"""The plan of a CUDA mask built on its device (wavealign::cuda::GpuPlanner), on the current torch stream.

A call allocates, through torch (the caching allocator, on the current stream), one output buffer of the layout
C++ gives for the mask (`_core.plan_layout`) and its scratch, and enqueues the planner: no host synchronization,
so it can be captured in a CUDA graph once the planner of its (device, shape, config) exists. Creating a planner
synchronizes once (prepare() writes the start block of Stage 1 into its prepared workspace). The prepared
workspace is only read by plan() calls, and every call has scratch of its own, so threads planning on their own
streams never share device memory.

The mask's values are validated on the device (the rules of wavealign/ingest.h); the record is read on the
host with the statistics and skip codes (the buffer's host block, one copy) at the plan's first host access
(DeviceHandle.check). A warm plan crosses into C++ three times: the mask's view, its layout and the plan.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from . import _core
from ._buffers import PlanBuffers, permuted_host_mask
from ._ingest import Ingested

_CACHE_SIZE = 8
_planners: OrderedDict[tuple, tuple[Any, Any, int, int]] = OrderedDict()
_lock = threading.Lock()


def available() -> bool:
    """True when the extension was built with the GPU planner."""
    return bool(getattr(_core, "has_gpu_plan", False))


def _planner(torch: Any, device: Any, shape: tuple[int, int, int],
             options: dict[str, Any]) -> tuple[Any, Any, int, int]:
    """(planner, prepared workspace, the stream it was made on, scratch bytes of one call) of this device, shape
    and config: made, prepared and cached on first use.

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
        entry = (planner, prepared, stream, planner.scratch_bytes())
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
    device = ingested.source.device
    with torch.cuda.device(device):
        planner, prepared, prepared_on, scratch_bytes = _planner(torch, device, ingested.view.shape, options)
        stream = torch.cuda.current_stream(device)
        layout = _core.plan_layout(ingested.view)
        buffer = torch.empty(layout["bytes"], dtype=torch.uint8, device=device)
        scratch = torch.empty(max(1, scratch_bytes), dtype=torch.uint8, device=device)
        planner.plan(ingested.view, buffer.data_ptr(), buffer.numel(), prepared.data_ptr(), scratch.data_ptr(),
                     scratch.numel(), stream.cuda_stream)
        if ingested.inputs_record is not None:
            # A mask method's q or k held NaN or inf: its record becomes the plan's (on the device, in stream
            # order), so the plan raises it at its first host access and the kernel computes nothing from it.
            record = PlanBuffers(buffer, layout).record()
            upstream = ingested.inputs_record
            record.copy_(torch.where(upstream[0] != 0, upstream, record))
        if stream.cuda_stream != prepared_on and not torch.cuda.is_current_stream_capturing():
            # Read on another stream than it was allocated on: should the planner leave the cache, the
            # allocator must not hand its memory out again before this stream's work is done.
            prepared.record_stream(stream)
    # `scratch` is released here: the caching allocator hands it out again only to later work on this stream.
    return DeviceHandle(planner, ingested, PlanBuffers(buffer, layout), stream)


class DeviceHandle:
    """A plan built on the device: the handle interface of _plan.Plan (see _plan.HostHandle), over one device
    buffer (PlanBuffers: permutation, inverse, sequential schedule, the mask's CSR with a capacity bound for a
    dense or Flex mask, the permuted CSR of a CSR mask, and the host block: the validation record, the statistics
    and the skip codes). The host block is read on the host once, on the planning stream, by the first call that
    needs a host value (check); that call synchronizes.
    """

    planner = "gpu"

    def __init__(self, planner: Any, ingested: Ingested, buffers: PlanBuffers, stream: Any) -> None:
        self._planner = planner
        self._source = ingested.source
        self._owned = ingested.owned
        self._view = ingested.view  # keeps the mask's arrays alive while the plan may still read them
        self.buffers = buffers
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
        self._host: PlanBuffers | None = None

    # ---- the validation record and the host values ------------------------------------------------------

    def check(self) -> None:
        """Reads the host block (once; synchronizes) and raises the mask's ValueError (the CPU plan's message) if
        the device found a broken rule."""
        if self._decoded is None:
            import torch

            with self._lock:
                if self._decoded is None:
                    with torch.cuda.stream(self._stream):
                        block = self.buffers.host_block().cpu().numpy()
                    message, skipped, reasons, stats = self._planner.decode(block)
                    self._message = message
                    self._decoded = (skipped, reasons, stats)
                    # The stream has passed the plan: the mask's arrays and the planner are no longer needed,
                    # and a plan kept alive past the program (by a compiled graph, say) holds no extension
                    # object then.
                    self._planner = None
                    self._view = None
        if self._message is not None:
            raise ValueError(self._message)

    def pending_error(self) -> Any:
        """The device record (int32 [10], nonzero first entry = invalid) while the host has not read it; None
        once it has been read and the mask is valid; raises the mask's ValueError once it is known invalid."""
        if self._decoded is None:
            return self.buffers.record()
        self.check()
        return None

    def decisions(self) -> tuple[list[bool], list[str], dict[str, Any]]:
        self.check()
        skipped, reasons, stats = self._decoded
        return list(skipped), list(reasons), dict(stats)

    def host(self) -> PlanBuffers:
        """The whole buffer on the host (checks first: an invalid mask's plan raises)."""
        self.check()
        if self._host is None:
            self._host = self.buffers.to_host()
        return self._host

    def permutations(self) -> np.ndarray:
        return self.host().permutations()

    def inverses(self) -> np.ndarray:
        return self.host().inverses()

    # ---- device buffers ----------------------------------------------------------------------------------

    def on(self, device: Any) -> PlanBuffers:
        """The buffer on `device`: the plan's own on its device (no synchronization), else a copy (checks first)."""
        if device == self.home:
            return self.buffers
        return self.host().to(device)

    def schedule_array(self, batch: int, heads: int, head_order: str) -> np.ndarray:
        return _core.batch_schedule(self.permutations(), batch, heads, head_order)

    def schedule_tensor(self, device: Any, batch: int, heads: int, head_order: str) -> Any:
        """int32 [batch*heads*MB, 2] (make_batch_schedule's layout) on `device`; on the plan's device written
        from its permutation on the current stream, without a host synchronization."""
        import torch

        if device != self.home:
            return torch.from_numpy(self.schedule_array(batch, heads, head_order)).to(device)
        if (batch, heads, head_order) == (1, self.heads, "sequential"):
            return self.buffers.schedule()
        schedule = torch.empty((batch * heads * self.q_blocks, 2), dtype=torch.int32, device=device)
        with torch.cuda.device(device):
            _core.gpu_batch_schedule(self.buffers.permutations().data_ptr(), self.heads, self.q_blocks, batch,
                                     heads, head_order, schedule.data_ptr(),
                                     torch.cuda.current_stream(device).cuda_stream)
        return schedule

    # ---- the permuted mask -------------------------------------------------------------------------------

    def permuted_dense(self) -> Any:
        """bool [H, MB, NB] on the device, rows in plan order (a dense input's plan; no synchronization)."""
        import torch

        index = self.buffers.permutations().to(torch.int64)[:, :, None]
        return torch.take_along_dim(self._owned, index, dim=1)

    def permuted_csr(self) -> tuple[Any, Any]:
        """(row_ptr int64, col_idx int32) on the device, rows in plan order (a CSR input's plan; checks first)."""
        self.check()
        return self.buffers.permuted_csr()

    def permuted_flex_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(kv_num_blocks [H, MB], kv_indices [H, MB, NB]) of the permuted mask on the host."""
        return permuted_host_mask(self.host(), self.kv_blocks).flex()
