"""The plan of a CUDA mask built on its device (wavealign::cuda::GpuPlanner), on the current torch stream.

A call allocates its outputs through torch and enqueues the planner: no host synchronization, so it can be
captured in a CUDA graph once the planner of its (device, shape, config) exists. Creating a planner
synchronizes once (prepare() writes the start block of Stage 1 into its workspace).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from . import _core
from ._util import invalid

_CACHE_SIZE = 8
_planners: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
_lock = threading.Lock()


def available() -> bool:
    """True when the extension was built with the GPU planner."""
    return bool(getattr(_core, "has_gpu_plan", False))


def _planner(torch: Any, device: Any, shape: tuple[int, int, int], options: dict[str, Any]) -> tuple[Any, Any]:
    """(planner, workspace) of this device, shape and config: made, prepared and cached on first use.

    The workspace is a torch uint8 tensor (the caching allocator's memory). At most _CACHE_SIZE planners are
    kept, oldest out first. options["profile"] is a parsed _profile.Profile or None and enters the key by its
    content digest, so a planner made with one profile never serves another; options["tokens"] None is 0.
    """
    profile = options.get("profile")
    tokens = options.get("tokens") or 0
    plain = sorted(name for name in options if name not in ("profile", "tokens"))
    key = (device.index, *shape, *(options[name] for name in plain), tokens,
           None if profile is None else profile.key)
    entry = _planners.get(key)
    if entry is not None:
        _planners.move_to_end(key)
        return entry
    planner = _core.GpuPlanner(*shape, options["order"], options["gpu"], options["wave_size"],
                               options["iterations"], options["seed"], options["skip"], options["head_dim"],
                               options["element_bytes"], options["kv_block"], options["plan_reuse"],
                               None if profile is None else profile.core, tokens)
    workspace = torch.empty(max(1, planner.workspace_bytes()), dtype=torch.uint8, device=device)
    planner.prepare(workspace.data_ptr(), workspace.numel(), torch.cuda.current_stream(device).cuda_stream)
    _planners[key] = (planner, workspace)
    while len(_planners) > _CACHE_SIZE:
        _planners.popitem(last=False)
    return planner, workspace


def clear_cache() -> None:
    """Drops the cached planners and their workspaces."""
    with _lock:
        _planners.clear()


class DeviceHandle:
    """A plan built on the device, with the interface of the C++ PlanHandle (see _plan.Plan).

    Device tensors (H = heads, MB = query blocks, NB = KV blocks): permutation / inverse int32 [H, MB],
    schedule int32 [H*MB, 2] (sequential head order), mask bool [H, MB, NB] (the planned mask, a copy owned by
    the plan). The statistics and skip flags stay on the device until skipped() / reasons() / stats() is first
    called; that call synchronizes the device. The host methods (permutations, schedule, mask, permuted_mask)
    copy to the host once, for the paths that need host arrays.
    """

    def __init__(self, planner: Any, mask: Any, permutation: Any, inverse: Any, schedule: Any, stats: Any,
                 skip: Any) -> None:
        self._planner = planner
        self.device_mask = mask
        self.device_permutation = permutation
        self.device_inverse = inverse
        self.device_schedule = schedule
        self._stats_raw = stats
        self._skip_raw = skip
        self.heads: int = planner.heads
        self.q_blocks: int = planner.q_blocks
        self.kv_blocks: int = planner.kv_blocks
        self.wave_size: int = planner.wave_size
        self.order: str = planner.order
        self._decoded: tuple[list[bool], list[str], dict[str, Any]] | None = None
        self._host_mask: Any = None
        self._host_permutation: np.ndarray | None = None
        self._host_inverse: np.ndarray | None = None

    def _decode(self) -> tuple[list[bool], list[str], dict[str, Any]]:
        if self._decoded is None:
            self._decoded = self._planner.decode(self._stats_raw.cpu().numpy(), self._skip_raw.cpu().numpy())
        return self._decoded

    def skipped(self) -> list[bool]:
        return list(self._decode()[0])

    def reasons(self) -> list[str]:
        return list(self._decode()[1])

    def stats(self) -> dict[str, Any]:
        return dict(self._decode()[2])

    def permutations(self) -> np.ndarray:
        if self._host_permutation is None:
            self._host_permutation = self.device_permutation.cpu().numpy()
        return self._host_permutation

    def inverses(self) -> np.ndarray:
        if self._host_inverse is None:
            self._host_inverse = self.device_inverse.cpu().numpy()
        return self._host_inverse

    def schedule(self, head_order: str = "sequential") -> np.ndarray:
        """int32 [H*MB, 2] (head, original query block) on the host, like PlanHandle.schedule."""
        permutation = self.permutations()
        heads = np.broadcast_to(np.arange(self.heads, dtype=np.int32)[:, None], permutation.shape)
        items = np.stack([heads, permutation], axis=-1)
        if head_order != "sequential":
            items = items.transpose(1, 0, 2)
        return np.ascontiguousarray(items.reshape(-1, 2))

    @property
    def mask(self) -> Any:
        """The planned mask as a host _core.Mask (copied once)."""
        if self._host_mask is None:
            self._host_mask = _core.mask_from_dense(self.device_mask.cpu().numpy())
        return self._host_mask

    def permuted_mask(self) -> Any:
        """The mask with each head's rows in plan order, as a host _core.Mask."""
        dense = self.device_mask.cpu().numpy()
        rows = np.take_along_axis(dense, self.permutations().astype(np.int64)[:, :, None], axis=1)
        return _core.mask_from_dense(rows)


def dense_from_csr(torch: Any, row_ptr: Any, col_idx: Any, heads: int, kv_blocks: int) -> Any:
    """bool [H, MB, NB] of a device CSR mask, without host synchronization.

    Entries outside [row_ptr[0], row_ptr[-1]) and column indices outside [0, NB) are ignored (the planner's
    rule); duplicates are kept once.
    """
    rows = row_ptr.numel() - 1
    device = row_ptr.device
    entries = torch.arange(col_idx.numel(), device=device, dtype=torch.int64)
    row = torch.searchsorted(row_ptr, entries, right=True) - 1
    column = col_idx.to(torch.int64)
    valid = (row >= 0) & (row < rows) & (column >= 0) & (column < kv_blocks)
    padded = torch.zeros((rows + 1, kv_blocks + 1), dtype=torch.bool, device=device)
    padded[torch.where(valid, row, rows), torch.where(valid, column, kv_blocks)] = True
    return padded[:rows, :kv_blocks].reshape(heads, rows // heads, kv_blocks).contiguous()


def dense_from_flex(torch: Any, pairs: list[tuple[Any, Any]], kv_blocks: int) -> Any:
    """bool [R, MB, NB] of FlexAttention (counts [R, MB], indices [R, MB, W]) pairs on the device.

    Entries past a row's count and indices outside [0, NB) are ignored; no host synchronization.
    """
    counts = pairs[0][0]
    rows, q_blocks = counts.shape
    padded = torch.zeros((rows * q_blocks, kv_blocks + 1), dtype=torch.bool, device=counts.device)
    for count, indices in pairs:
        width = indices.shape[-1]
        index = indices.reshape(rows * q_blocks, width).to(torch.int64)
        within = torch.arange(width, device=index.device) < count.reshape(-1, 1)
        valid = within & (index >= 0) & (index < kv_blocks)
        index = torch.where(valid, index, kv_blocks)
        padded.scatter_(1, index, torch.ones_like(index, dtype=torch.bool))
    return padded[:, :kv_blocks].reshape(rows, q_blocks, kv_blocks).contiguous()


def plan_on_device(torch: Any, device: Any, heads: int, q_blocks: int, kv_blocks: int, options: dict[str, Any], *,
                   dense: Any = None, csr: tuple[Any, Any] | None = None) -> DeviceHandle:
    """Enqueues the plan of a device mask on the current stream of `device` and returns its handle.

    dense: bool [H, MB, NB], contiguous, owned by the plan. csr: (row_ptr int64 [H*MB+1], col_idx int32
    [nnz]), contiguous; the handle's mask is then rebuilt from it on the device.
    """
    if not available():
        raise RuntimeError("wavealign was built without its CUDA code, so the GPU plan is not available")
    with torch.cuda.device(device):
        with _lock:
            planner, workspace = _planner(torch, device, (heads, q_blocks, kv_blocks), options)
            stream = torch.cuda.current_stream(device).cuda_stream
            empty = {"dtype": torch.int32, "device": device}
            permutation = torch.empty((heads, q_blocks), **empty)
            inverse = torch.empty((heads, q_blocks), **empty)
            schedule = torch.empty((heads * q_blocks, 2), **empty)
            stats = torch.empty(heads * _core.gpu_plan_stats_bytes, dtype=torch.uint8, device=device)
            skip = torch.empty(heads, dtype=torch.uint8, device=device)
            if dense is not None:
                planner.plan(dense.data_ptr(), 0, 0, permutation.data_ptr(), inverse.data_ptr(),
                             schedule.data_ptr(), stats.data_ptr(), skip.data_ptr(), workspace.data_ptr(), stream)
            elif csr is not None:
                row_ptr, col_idx = csr
                planner.plan(0, row_ptr.data_ptr(), col_idx.data_ptr(), permutation.data_ptr(),
                             inverse.data_ptr(), schedule.data_ptr(), stats.data_ptr(), skip.data_ptr(),
                             workspace.data_ptr(), stream)
                dense = dense_from_csr(torch, row_ptr, col_idx, heads, kv_blocks)
            else:
                raise invalid("block_mask", "no mask given")
    return DeviceHandle(planner, dense, permutation, inverse, schedule, stats, skip)
