"""One plan's outputs in one buffer, viewed at the offsets of its C++ layout (wavealign/plan_buffers.h).

Both planners write the same layout: the GPU planner into a torch uint8 tensor on its device, the CPU plan into a
numpy uint8 array (its export). Every array a Plan hands out (permutation, inverse, schedule, the mask's CSR and
the permuted CSR) is a typed view of that one buffer, so a plan crosses to another device with one copy. The
layout, and with it every offset and capacity, comes from C++ (`_core.plan_layout`, `PlanHandle.export`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core
from ._util import torch_or_none

_NUMPY = {"int32": np.int32, "int64": np.int64, "uint8": np.uint8}


class PlanBuffers:
    """A plan's buffer (numpy uint8 [bytes] on the host, or a torch uint8 tensor on a device) and its layout.

    layout: the dict of `_core.plan_layout` (bytes, host_block_bytes, heads, q_blocks, kv_blocks, csr_capacity,
    permuted_capacity, regions {name: (offset, bytes)}).
    """

    def __init__(self, buffer: Any, layout: dict[str, Any]) -> None:
        self.buffer = buffer
        self.layout = layout
        self.heads: int = layout["heads"]
        self.q_blocks: int = layout["q_blocks"]

    @property
    def on_host(self) -> bool:
        return isinstance(self.buffer, np.ndarray)

    def _region(self, name: str, dtype: str, shape: tuple[int, ...]) -> Any:
        offset, size = self.layout["regions"][name]
        raw = self.buffer[offset:offset + size]
        if self.on_host:
            return raw.view(_NUMPY[dtype]).reshape(shape)
        torch = torch_or_none()
        return raw.view(getattr(torch, dtype)).view(shape)

    def host_block(self) -> Any:
        """uint8 [host_block_bytes]: the validation record, the statistics and the skip codes."""
        return self.buffer[:self.layout["host_block_bytes"]]

    def record(self) -> Any:
        """int32 [10]: the mask's validation record (first entry nonzero = invalid mask)."""
        return self._region("record", "int32", (10,))

    def permutations(self) -> Any:
        """int32 [H, MB]."""
        return self._region("permutations", "int32", (self.heads, self.q_blocks))

    def inverses(self) -> Any:
        """int32 [H, MB]."""
        return self._region("inverses", "int32", (self.heads, self.q_blocks))

    def schedule(self) -> Any:
        """int32 [H*MB, 2]: (head, original query block) in the sequential head order."""
        return self._region("schedule", "int32", (self.heads * self.q_blocks, 2))

    def csr(self) -> tuple[Any, Any]:
        """(row_ptr int64 [H*MB+1], col_idx int32 [csr_capacity]): the mask in the original row order; the
        entries past row_ptr[-1] are not part of it."""
        return (self._region("csr_row_ptr", "int64", (self.heads * self.q_blocks + 1,)),
                self._region("csr_col_idx", "int32", (self.layout["csr_capacity"],)))

    def permuted_csr(self) -> tuple[Any, Any] | None:
        """The mask with each head's rows in plan order, like csr(); None when the layout has no permuted CSR."""
        if self.layout["permuted_capacity"] == 0:
            return None
        return (self._region("permuted_row_ptr", "int64", (self.heads * self.q_blocks + 1,)),
                self._region("permuted_col_idx", "int32", (self.layout["permuted_capacity"],)))

    def to(self, device: Any) -> PlanBuffers:
        """The same buffer on a torch device (one copy)."""
        torch = torch_or_none()
        source = torch.from_numpy(self.buffer) if self.on_host else self.buffer
        return PlanBuffers(source.to(device), self.layout)

    def to_host(self) -> PlanBuffers:
        """The same buffer as a numpy array (one copy from a device; synchronizes with its stream)."""
        if self.on_host:
            return self
        return PlanBuffers(self.buffer.cpu().numpy(), self.layout)


def exact(row_ptr: Any, col_idx: Any) -> tuple[Any, Any]:
    """A host CSR whose col_idx holds exactly row_ptr[-1] entries (a capacity-sized buffer cut to the mask)."""
    return row_ptr, col_idx[:int(row_ptr[-1])]


def host_mask(host: PlanBuffers, kv_blocks: int) -> Any:
    """The plan's mask (original row order) as a `_core.Mask`, from a host buffer."""
    return _core.mask_from_csr(*exact(*host.csr()), host.heads, kv_blocks)


def permuted_host_mask(host: PlanBuffers, kv_blocks: int) -> Any:
    """The mask with each head's rows in plan order as a `_core.Mask`, from a host buffer: its permuted CSR where
    the layout has one, else the mask's rows gathered by the permutation."""
    permuted = host.permuted_csr()
    if permuted is not None:
        return _core.mask_from_csr(*exact(*permuted), host.heads, kv_blocks)
    dense = host_mask(host, kv_blocks).dense()
    rows = host.permutations().astype(np.int64)[:, :, None]
    return _core.mask_from_dense(np.take_along_axis(dense, rows, axis=1))
