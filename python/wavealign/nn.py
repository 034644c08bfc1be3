"""wavealign.nn.SparseAttention: a drop-in attention module that plans each mask once and reuses the plan."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

import torch

from . import _profile
from ._attention import sparse_attention
from ._plan import Plan, plan as make_plan


class _Entry(NamedTuple):
    mask: Any           # the mask object itself: holding it keeps its id from being reused
    versions: tuple     # in-place version counters of its tensors when the entry was made
    plan: Plan


def _mask_tensors(block_mask: Any) -> list[torch.Tensor]:
    if isinstance(block_mask, torch.Tensor):
        return [block_mask]
    if isinstance(block_mask, (tuple, list)):
        return [x for x in block_mask if isinstance(x, torch.Tensor)]
    return [x for x in (getattr(block_mask, name, None) for name in
                        ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"))
            if isinstance(x, torch.Tensor)]


class SparseAttention(torch.nn.Module):
    """Block-sparse attention in WaveAlign order, for swapping into a transformer's attention block.

    forward(q, k, v, block_mask, mask_key=None) -> O with q's shape: q, k, v are [B, H, L, d] (or [H, L, d]),
    block_mask is what a mask method produced (bool/uint8 [H, MB, NB] or [B*H, MB, NB], a CSR pair, or a
    FlexAttention BlockMask). CUDA bf16/fp16 tensors run the fused kernel; CPU tensors the float32 reference.

    Plans are cached per mask, keyed by the caller, never by hashing the mask on the host:
      - mask_key (any hashable, e.g. (layer, step // refresh)): the plan of that key is reused as long as it is
        cached; pass a new key when the mask changes. block_mask may then be None on a hit.
      - without mask_key: the mask object's identity and the in-place version counters of its tensors; a new
        tensor or an in-place write gives a new plan. numpy masks have no version counter: mutate them in place
        only with a mask_key.
    The cache holds at most `cache_size` plans (oldest out first) and keeps their masks alive.

    Args: block_size, wave_size, order, iterations, seed, skip, gpu, plan_reuse, profile: as in wavealign.plan()
    (the profile is parsed once, here; each plan reads it at the mask's length, see wavealign.plan's `tokens`);
    scale, traversal, head_order, kernel: as in wavealign.sparse_attention().
    """

    def __init__(self, *, block_size: int | tuple[int, int] = 128, wave_size: int | None = None,
                 order: str = "wavealign", iterations: int = 10, seed: int = 0, skip: str = "auto",
                 gpu: str = "h200", plan_reuse: float = 1.0, profile: Any = None, scale: float | None = None,
                 traversal: str = "ascending", head_order: str = "sequential", kernel: str = "auto",
                 cache_size: int = 8) -> None:
        super().__init__()
        self.plan_options = dict(block_size=block_size, wave_size=wave_size, order=order, iterations=iterations,
                                 seed=seed, skip=skip, gpu=gpu, plan_reuse=plan_reuse,
                                 profile=_profile.resolve(profile))
        self.scale = scale
        self.traversal = traversal
        self.head_order = head_order
        self.kernel = kernel
        self.cache_size = max(1, int(cache_size))
        self._plans: OrderedDict[Any, _Entry] = OrderedDict()

    def extra_repr(self) -> str:
        return f"order={self.plan_options['order']!r}, block_size={self.plan_options['block_size']}, " \
               f"cached_plans={len(self._plans)}"

    def plan_for(self, block_mask: Any, mask_key: Any = None, *, head_dim: int = 128) -> Plan:
        """The cached plan of this mask (see the class docstring), planning it on a miss."""
        key = ("key", mask_key) if mask_key is not None else ("id", id(block_mask))
        entry = self._plans.get(key)
        if entry is not None and (mask_key is not None or self._still_valid(entry, block_mask)):
            return entry.plan
        if block_mask is None:
            raise ValueError("invalid argument 'block_mask': is None and no plan is cached for this mask_key")
        new_plan = self._plan(block_mask, head_dim)
        self._plans[key] = _Entry(block_mask, self._versions(block_mask), new_plan)
        while len(self._plans) > self.cache_size:
            self._plans.popitem(last=False)
        return new_plan

    @staticmethod
    def _versions(block_mask: Any) -> tuple:
        return tuple(x._version for x in _mask_tensors(block_mask))

    def _still_valid(self, entry: _Entry, block_mask: Any) -> bool:
        return entry.mask is block_mask and entry.versions == self._versions(block_mask)

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
                                head_order=self.head_order, kernel=self.kernel)
