"""wavealign: cache-aware query-row scheduling for block-sparse attention (WaveAlign).

    plan = wavealign.plan(block_mask)                   # once per mask, reused across layers and steps
    o = wavealign.sparse_attention(q, k, v, plan)       # fused CUDA kernel, or the CPU reference
    q_perm = plan.permute_rows(q)                       # plug-in path around any other kernel
    o = plan.unpermute_rows(my_kernel(q_perm, k, v, plan.permuted_mask()), seq_len=L)

Inputs are numpy arrays, torch tensors or any DLPack producer. torch is optional: `wavealign.nn`,
`wavealign.flex`, `wavealign.fa4` and `wavealign.sparge` (FlashAttention-4 and SpargeAttn in plan order) and the
torch.library ops (`wavealign.ops`) need it, the rest does not.
"""

from __future__ import annotations

import atexit
import importlib
import sys
from typing import Any

from . import _core
from ._attention import sparse_attention
from ._plan import Plan, plan

__version__: str = _core.__version__
has_cuda: bool = _core.has_cuda
"""True when the fused CUDA kernel was compiled in."""

__all__ = ["Plan", "plan", "sparse_attention", "has_cuda", "fa4", "sparge", "flex", "nn", "ops", "diffusers", "methods",
           "distributed"]


def __getattr__(name: str) -> Any:
    # wavealign.nn imports torch at import time; load it (and the other submodules) only when asked for.
    if name in ("nn", "fa4", "sparge", "flex", "ops", "diffusers", "methods", "distributed"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'wavealign' has no attribute {name!r}")


@atexit.register
def _release_cached_extension_objects() -> None:
    """Drops the planners, parsed profiles and mask generators the package caches, before the interpreter tears
    the extension down (which reports every extension object still alive then as leaked)."""
    for name in ("_gpu_plan", "_profile", "methods"):
        module = sys.modules.get(f"{__name__}.{name}")
        if module is not None:
            module.clear_cache()
