"""wavealign.nn.SparseAttention: a drop-in attention module that plans each mask once and reuses the plan."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from . import _ingest, _profile
from ._attention import sparse_attention
from ._plan import Plan, plan as make_plan
from ._util import check_choice, host_array


def _content_key(block_mask: Any) -> tuple | None:
    """The content of a host mask as a hashable key: its kind, and per array its framework, dtype, shape and
    bytes (a dense mask's kept/skipped bits packed, 1/8 of its bytes); a FlexAttention mask's block size and
    lengths too. None for a mask on a CUDA device, whose content is not read on the host."""
    if _ingest.on_cuda(block_mask):
        return None
    if _ingest.is_flex(block_mask):
        arrays = [getattr(block_mask, name, None) for name in _ingest.FLEX_ARRAYS]
        extra = (repr(getattr(block_mask, "BLOCK_SIZE", None)), repr(getattr(block_mask, "seq_lengths", None)))
        return ("flex", extra, *(_array_key(array, pack=False) for array in arrays))
    if isinstance(block_mask, (tuple, list)):
        return ("csr", *(_array_key(array, pack=False) for array in block_mask))
    return ("dense", _array_key(block_mask, pack=True))


def _array_key(array: Any, pack: bool) -> tuple:
    if array is None:
        return (None,)
    host = host_array(array, "block_mask")
    content = np.packbits(host != 0) if pack else np.ascontiguousarray(host)
    return (type(array).__name__, str(host.dtype), host.shape, content.tobytes())


class SparseAttention(torch.nn.Module):
    """Block-sparse attention in WaveAlign order, for swapping into a transformer's attention block.

    forward(q, k, v, block_mask, mask_key=None) -> O with q's shape: q, k, v are [B, H, L, d] (or [H, L, d]),
    block_mask is what a mask method produced (bool/uint8 [H, MB, NB] or [B*H, MB, NB], a CSR pair, or a
    FlexAttention BlockMask). CUDA bf16/fp16 tensors run the fused kernel; CPU tensors the float32 reference.

    No result is computed from a stale plan: a plan is reused only for the mask it was made from.
      - mask_key (any hashable, e.g. (layer, step // refresh)): the caller's name for the mask's content; the
        plan of that key is reused as long as it is cached (block_mask may then be None). Pass a new key when
        the mask changes.
      - without mask_key, a host mask (numpy, CPU tensors) is keyed by its content: the bits of a dense mask
        (packed, 1/8 of its bytes, compared at every call), the arrays of a CSR or FlexAttention mask. Edits in
        place, through views (`mask.numpy()[i] = ...`) or not, give a new plan; an equal mask, even a new
        object, reuses the plan.
      - without mask_key, a CUDA mask is planned on every call: its content is not read on the host (that would
        synchronize), and the GPU plan is asynchronous (2.6 ms for a 40-head Wan2.1-14B layer, 0.2 % of its
        attention; docs/gpu-plan.md). Pass mask_key to reuse its plan.
    The cache holds at most `cache_size` plans (oldest out first).

    Args: block_size, wave_size, order, iterations, seed, skip, gpu, plan_reuse, profile: as in wavealign.plan()
    (the profile is parsed once, here; each plan reads it at the mask's length, see wavealign.plan's `tokens`);
    scale, traversal, head_order, kernel, precision: as in wavealign.sparse_attention().
    """

    def __init__(self, *, block_size: int | tuple[int, int] = 128, wave_size: int | None = None,
                 order: str = "wavealign", iterations: int = 10, seed: int = 0, skip: str = "auto",
                 gpu: str = "h200", plan_reuse: float = 1.0, profile: Any = None, scale: float | None = None,
                 traversal: str = "ascending", head_order: str = "sequential", kernel: str = "auto",
                 precision: str = "native", cache_size: int = 8) -> None:
        super().__init__()
        self.plan_options = dict(block_size=block_size, wave_size=wave_size, order=order, iterations=iterations,
                                 seed=seed, skip=skip, gpu=gpu, plan_reuse=plan_reuse,
                                 profile=_profile.resolve(profile))
        self.scale = scale
        self.traversal = traversal
        self.head_order = head_order
        self.kernel = kernel
        self.precision = check_choice(precision, "precision", "precision")
        self.cache_size = max(1, int(cache_size))
        self._plans: OrderedDict[Any, Plan] = OrderedDict()

    def extra_repr(self) -> str:
        return f"order={self.plan_options['order']!r}, block_size={self.plan_options['block_size']}, " \
               f"cached_plans={len(self._plans)}"

    def plan_for(self, block_mask: Any, mask_key: Any = None, *, head_dim: int = 128) -> Plan:
        """The plan of this mask: cached by mask_key or by a host mask's content (see the class docstring),
        planned on a miss; a CUDA mask without mask_key is planned every time."""
        if mask_key is not None:
            key = ("key", mask_key)
            cached = self._plans.get(key)
            if cached is not None:
                self._plans.move_to_end(key)
                return cached
            if block_mask is None:
                raise ValueError("invalid argument 'block_mask': is None and no plan is cached for this mask_key")
        elif block_mask is None:
            raise ValueError("invalid argument 'block_mask': is None and no mask_key is given")
        else:
            try:
                content = _content_key(block_mask)
            except ValueError:
                content = None  # not a mask: wavealign.plan says why
            key = None if content is None else ("content", content)
            cached = self._plans.get(key) if key is not None else None
            if cached is not None:
                self._plans.move_to_end(key)
                return cached
        new_plan = self._plan(block_mask, head_dim)
        if key is not None:
            self._plans[key] = new_plan
            while len(self._plans) > self.cache_size:
                self._plans.popitem(last=False)
        return new_plan

    @torch.compiler.disable
    def _plan(self, block_mask: Any, head_dim: int) -> Plan:
        # Planning runs on the host and calls into C++: it is kept out of compiled graphs.
        return make_plan(block_mask, head_dim=head_dim, **self.plan_options)

    def clear_cache(self) -> None:
        self._plans.clear()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any = None,
                mask_key: Any = None) -> torch.Tensor:
        plan = self.plan_for(block_mask, mask_key, head_dim=int(q.shape[-1]))
        return sparse_attention(q, k, v, plan, scale=self.scale, traversal=self.traversal,
                                head_order=self.head_order, kernel=self.kernel, precision=self.precision)
