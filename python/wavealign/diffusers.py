"""wavealign inside diffusers: block-sparse self-attention in WaveAlign order, as a diffusers attention backend.

Three routes, one implementation (docs/diffusers.md):

    import wavealign.diffusers as wd

    # 1. one call: the processors of every block's self-attention, with dense warm-up steps/layers and timings
    handle = wd.apply(pipe.transformer, method="xattention", backend="wavealign", dense_steps=10, timing=True)
    latents = pipe(prompt_embeds=..., negative_prompt_embeds=..., output_type="latent").frames
    wd.remove(pipe.transformer)

    # 2. diffusers' own switch: the attention backend "wavealign", with the options of the calls it runs
    from diffusers.models.attention_dispatch import attention_backend
    with attention_backend("wavealign"), wd.BackendOptions("xattention", precision="int8"):
        latents = pipe(...).frames

    # 3. several GPUs: diffusers' context parallelism (Ulysses) runs the backend on each rank's heads
    pipe.transformer.set_attention_backend("wavealign")
    pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))

Importing this module registers "wavealign" with diffusers' attention dispatcher (`register_backend`). Each
call the backend makes sparse runs the mask method on the q and k it receives ([B, H, L, d] views), plans the
mask (on the GPU for a CUDA mask) and runs the kernel in plan order (`BackendOptions`); calls it cannot make
sparse (cross-attention: the key's length differs from the query's) run diffusers' "native" backend. Under
diffusers' Ulysses context parallelism the backend receives the rank's H/P heads over the whole sequence after
the all-to-all, so the mask is computed for those heads only and the result equals one process's.

`apply` swaps the processor of every block's self-attention (`attn1`) of a `WanTransformer3DModel` (or of an
`LTXVideoTransformer3DModel`: LTX-Video's norms across heads and its RoPE); the cross-attention (`attn2`) keeps
its own. The processor does what diffusers' processor does around the attention (the fused or separate q/k/v
projections, the q/k RMSNorms, RoPE, the output projection) and hands the attention to the backend above
through diffusers' dispatcher, telling it its layer: the handle adds dense warm-up steps and layers, plan reuse
across steps, the step's timings and `on_plan`. WanPipeline wraps each transformer call in
`transformer.cache_context("cond" | "uncond", step_index=i, ...)`; the handle reads that context (the step
index and the branch name) through a diffusers hook on the transformer. A loop that does not say the step
calls `handle.set_step(i)` (and, to tell CFG branches apart, `branch=`). Of the package, only this module
imports diffusers (on import, to register the backend, when diffusers is installed).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import _profile
from ._plan import Plan, plan as make_plan
from ._util import block_pair, blocks_for, check_choice, check_int, invalid, require_torch

BACKEND_NAME = "wavealign"
"""The name wavealign has in diffusers' attention dispatcher (attention_backend, set_attention_backend)."""

BACKENDS = ("wavealign", "fa4", "flex", "sdpa-masked")
"""The kernel of the sparse calls. wavealign: the fused kernel (CUDA bf16/fp16; precision="int8": the 8-bit
kernel) or the float32 CPU reference; fa4: FlashAttention-4 through the plug-in path (wavealign.fa4); flex:
FlexAttention through the plug-in path; sdpa-masked: dense SDPA with the block mask expanded to tokens, in the
original order (the reference of the tests; no plan is made)."""

METHODS = ("xattention", "sparge", "minference", "flexprefill")
"""Mask methods resolved by name from wavealign.methods; "dense" runs every call dense."""

_HOOK_NAME = "wavealign_step_context"
_HANDLE_ATTRIBUTE = "_wavealign_sparse_attention"
_NO_HANDLE, _NO_LAYER = 0, -1     # the op's handle and layer of a call that comes through the backend alone

_handles: weakref.WeakValueDictionary[int, WanSparseAttention] = weakref.WeakValueDictionary()
_handle_ids = itertools.count(1)
_op_lock = threading.Lock()
_op_registered = False
_backend_member: Any = None       # diffusers' AttentionBackendName member of "wavealign", once registered


def _checked_dict(value: Any, argument: str) -> dict[str, Any]:
    """A copy of a dict argument that may be None."""
    if value is not None and not isinstance(value, dict):
        raise invalid(argument, f"must be a dict or None, got {type(value).__name__}")
    return dict(value or {})


# ---- what the backend runs in a sparse call -----------------------------------------------------------------

_active_options: contextvars.ContextVar[BackendOptions | None] = contextvars.ContextVar(
    "wavealign_backend_options", default=None)
_default_options: BackendOptions | None = None


class BackendOptions:
    """The options of the calls the "wavealign" attention backend makes sparse: mask method, plan and kernel.

        with attention_backend("wavealign"), wavealign.diffusers.BackendOptions("xattention", precision="int8"):
            latents = pipe(...).frames

    A `with` block makes these options the active ones in it (nested blocks: the innermost);
    `set_backend_options(options)` sets those used outside any block. In every call the backend makes sparse
    the mask method runs on the call's q and k, its mask is planned and the kernel runs in plan order; a new
    mask and plan in every call (apply's handle adds reuse across steps).

    Args (the same as apply's):
        method: "xattention", "sparge", "minference" or "flexprefill" (wavealign.methods, with `block_size` and
            `method_options`, checked here), "dense" (diffusers' native attention in every call), or any
            callable (q, k) -> block mask, called with q and k as [B, H, L, d] views; the mask is what
            wavealign.plan takes (bool [H | B*H, MB, NB], a CSR pair or a FlexAttention BlockMask) in blocks of
            `block_size`.
        backend: the kernel: "wavealign" (fused kernel on CUDA, float32 reference on the CPU), "fa4"
            (FlashAttention-4, wavealign.fa4), "flex" (FlexAttention) or "sdpa-masked" (dense SDPA with the
            expanded mask, original order, no plan).
        precision: the fused kernel's arithmetic, as in wavealign.sparse_attention: "native" or "int8" (backend
            "wavealign" only: the 8-bit kernel).
        order: the plan's row order ("wavealign", "s1", "s2", "original", "shuffled").
        block_size: tokens per mask block, int or (q_block, kv_block).
        method_options: keyword arguments of the mask method (a named method's block_size is `block_size`).
        skip, profile: as in wavealign.plan (the profile is parsed once, here).
        plan_options: further wavealign.plan keywords (wave_size, iterations, seed, gpu, planner, tokens,
            plan_reuse).
    """

    def __init__(self, method: Any, *, backend: str = "wavealign", precision: str = "native",
                 order: str = "wavealign", block_size: int | tuple[int, int] = 128,
                 method_options: dict[str, Any] | None = None, skip: str = "auto", profile: Any = None,
                 plan_options: dict[str, Any] | None = None) -> None:
        method_options = _checked_dict(method_options, "method_options")
        plan_options = _checked_dict(plan_options, "plan_options")
        self.block_size = block_pair(block_size)
        self._method, self.method_name = _resolve_method(method, method_options, self.block_size)
        self.precision = check_choice(precision, "precision", "precision")
        self._backend_call = _resolve_backend(backend, self.precision)
        self.backend = backend
        self.order = check_choice(order, "order", "order")
        reserved = sorted({"block_size", "order", "head_dim", "skip", "profile"} & plan_options.keys())
        if reserved:
            raise invalid("plan_options", f"{reserved} are arguments of their own (pass them as such)")
        plan_options.update(skip=check_choice(skip, "skip", "skip"), profile=_profile.resolve(profile))
        self._plan_options = plan_options
        self._tokens: list[contextvars.Token] = []

    def __repr__(self) -> str:
        return (f"wavealign.diffusers.BackendOptions(method={self.method_name!r}, backend={self.backend!r}, "
                f"precision={self.precision!r}, order={self.order!r}, block_size={self.block_size})")

    def __enter__(self) -> BackendOptions:
        self._tokens.append(_active_options.set(self))
        return self

    def __exit__(self, *exception: Any) -> None:
        _active_options.reset(self._tokens.pop())

    @property
    def dense(self) -> bool:
        """Whether every call runs dense (method "dense")."""
        return self._method is None

    # The steps of one sparse call, on [B, H, L, d] views; apply's handle runs the same steps with its timing
    # marks in between and its plan reuse around them.

    def _mask(self, q: Any, k: Any) -> Any:
        return self._method(q, k)

    def _plan(self, mask: Any, q: Any, where: str) -> tuple[Plan | None, Any]:
        """(the plan, None) of the mask; (None, the mask) for sdpa-masked, which reads the mask itself."""
        tokens = q.shape[-2]
        if self.backend == "sdpa-masked":
            if getattr(mask, "ndim", 0) >= 2:
                self._check_blocks(mask.shape[-2], mask.shape[-1], tokens, where)
            return None, mask
        plan = make_plan(mask, block_size=self.block_size, order=self.order, head_dim=int(q.shape[-1]),
                         **self._plan_options)
        self._check_blocks(plan.q_blocks, plan.kv_blocks, tokens, where)
        return plan, None

    def _run(self, q: Any, k: Any, v: Any, plan: Plan | None, mask: Any, scale: float | None) -> Any:
        """O [B, H, L, d] of the kernel in plan order (the mask's original order for sdpa-masked)."""
        torch = require_torch("wavealign.diffusers")
        if self.backend == "sdpa-masked":
            return _masked_sdpa(torch, q, k, v, mask, self.block_size, scale)
        if self.backend == "flex":
            return _flex(torch, q, k, v, plan, scale)
        return self._backend_call(q, k, v, plan, scale=scale)

    def _attend(self, q: Any, k: Any, v: Any, scale: float | None) -> Any:
        """One call of the backend: q, k, v [B, L, H, d] -> O [B, L, H, d] (contiguous)."""
        if self.dense:
            return _dense_attention(q, k, v, scale, None)
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))   # [B, H, L, d] views, no copy
        plan, mask = self._plan(self._mask(qh, kh), qh, "")
        return self._run(qh, kh, vh, plan, mask, scale).transpose(1, 2).contiguous()

    def _check_blocks(self, q_blocks: int, kv_blocks: int, tokens: int, where: str) -> None:
        q_block, kv_block = self.block_size
        expected = (blocks_for(tokens, q_block), blocks_for(tokens, kv_block))
        if (q_blocks, kv_blocks) != expected:
            raise invalid("method", f"returned a mask of {q_blocks} x {kv_blocks} blocks{where}; {tokens} tokens "
                                    f"in blocks of block_size={self.block_size} need {expected[0]} x {expected[1]}")


def set_backend_options(options: BackendOptions | None) -> None:
    """Sets the options the "wavealign" backend uses outside any `with BackendOptions(...)` block (None: none,
    and a call outside a block raises)."""
    global _default_options
    if options is not None and not isinstance(options, BackendOptions):
        raise invalid("options", f"must be a wavealign.diffusers.BackendOptions or None, got "
                                 f"{type(options).__name__}")
    _default_options = options


def active_backend_options() -> BackendOptions | None:
    """The options a call of the "wavealign" backend uses now: the innermost `with` block's, else those of
    set_backend_options, else None."""
    options = _active_options.get()
    return options if options is not None else _default_options


def _options_of_this_call() -> BackendOptions:
    options = active_backend_options()
    if options is None:
        raise RuntimeError("wavealign.diffusers: the attention backend 'wavealign' runs with options that say the "
                           "mask method, plan and kernel, and none are active: call the model inside "
                           "`with wavealign.diffusers.BackendOptions(method, ...):`, or set them with "
                           "wavealign.diffusers.set_backend_options(BackendOptions(method, ...))")
    return options


def _dense_attention(q: Any, k: Any, v: Any, scale: float | None, backend: Any) -> Any:
    """Dense attention of q, k, v [B, L, H, d] through diffusers' `backend` (None: the active one; "native"
    where that is wavealign itself), contiguous."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, \
        dispatch_attention_fn

    if backend is None:
        backend = _AttentionBackendRegistry.get_active_backend()[0]
    if backend == BACKEND_NAME:
        backend = AttentionBackendName.NATIVE
    out = dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=scale,
                                backend=backend, parallel_config=None)
    return out.contiguous()


# ---- apply's handle -----------------------------------------------------------------------------------------

@dataclass
class _Call:
    """One self-attention call: where it ran and its timing marks (CUDA events or perf_counter seconds)."""

    step: int | None
    branch: str | None
    layer: int
    dense: bool
    marks: list[Any] = field(default_factory=list)


class WanSparseAttention:
    """The handle of `apply`: the backend's options, the step state, the plan cache and the timings of one
    transformer.

    Attributes (read-only after apply): options (the BackendOptions its sparse calls run), method_name, backend,
    order, block_size ((q_block, kv_block)), dense_steps, dense_layers (a frozenset), refresh, layers (how many
    blocks the transformer has).
    """

    def __init__(self, *, options: BackendOptions, dense_steps: int, dense_layers: frozenset[int], refresh: int,
                 timing: bool, on_plan: Callable[..., Any] | None, layers: int) -> None:
        self.options = options
        self.dense_steps = dense_steps
        self.dense_layers = dense_layers
        self.refresh = refresh
        self.layers = layers
        self.timing = timing
        self._on_plan = on_plan
        self._explicit: tuple[int, str | None] | None = None
        self._context: Any = None
        self._plans: dict[tuple[int, str | None], tuple[int, tuple[Plan | None, Any]]] = {}
        self._calls: list[_Call] = []
        self._processors: list[_SparseSelfAttnProcessor] = []
        self._restore: tuple[list[Any], bool, bool] | None = None   # stock processors, had registry / forward
        self.id = next(_handle_ids)
        _handles[self.id] = self

    method_name = property(lambda self: self.options.method_name)
    backend = property(lambda self: self.options.backend)
    order = property(lambda self: self.options.order)
    block_size = property(lambda self: self.options.block_size)

    def __repr__(self) -> str:
        return (f"wavealign.diffusers.WanSparseAttention(method={self.method_name!r}, backend={self.backend!r}, "
                f"order={self.order!r}, dense_steps={self.dense_steps}, dense_layers={sorted(self.dense_layers)}, "
                f"refresh={self.refresh}, block_size={self.block_size}, layers={self.layers})")

    # ---- where the denoising loop is -----------------------------------------------------------------------

    def set_step(self, step: int, branch: str | None = None) -> None:
        """Sets the denoising step (and the CFG branch name) of the following calls.

        A call inside the pipeline's `transformer.cache_context(name, step_index=i)` takes the context's step
        and name instead; a context without a step index takes this step and the context's name.
        """
        step = check_int(step, "step", 0)
        if branch is not None and not isinstance(branch, str):
            raise invalid("branch", f"must be a str or None, got {type(branch).__name__}")
        self._explicit = (step, branch)

    @property
    def position(self) -> tuple[int | None, str | None]:
        """(step, branch) of the next call; step None when neither a cache context nor set_step told it."""
        context = self._context
        step, branch = self._explicit if self._explicit is not None else (None, None)
        if context is not None:
            branch = context.name
            if context.step_index is not None:
                step = int(context.step_index)
        return step, branch

    def _record_context(self, context: Any) -> None:
        self._context = context

    # ---- timings -------------------------------------------------------------------------------------------

    def step_times(self, clear: bool = False) -> list[dict[str, Any]]:
        """Per (step, branch), in call order: {"step", "branch", "calls", "sparse_calls", "dense_calls",
        "mask_ms", "plan_ms", "attention_ms"} summed over the self-attention calls (timing=True only).

        On CUDA the times are device times between CUDA events recorded on the current stream around the mask
        method, the plan and the attention kernel; reading them synchronizes the device. A gap in which the
        device waited for the host to enqueue the next work counts in the part it fell into. On the CPU they
        are wall times. Dense calls have only an attention time. Under context parallelism each rank times
        its own calls (its heads, after the all-to-all).
        """
        torch = require_torch("wavealign.diffusers")
        if not self.timing:
            raise RuntimeError("wavealign.diffusers: step_times() needs apply(..., timing=True)")
        if any(isinstance(mark, torch.cuda.Event) for call in self._calls for mark in call.marks):
            torch.cuda.synchronize()
        rows: dict[tuple[int | None, str | None], dict[str, Any]] = {}
        for call in self._calls:
            row = rows.setdefault((call.step, call.branch), {
                "step": call.step, "branch": call.branch, "calls": 0, "sparse_calls": 0, "dense_calls": 0,
                "mask_ms": 0.0, "plan_ms": 0.0, "attention_ms": 0.0})
            spans = [elapsed_ms(start, end) for start, end in zip(call.marks, call.marks[1:])]
            row["calls"] += 1
            if call.dense:
                row["dense_calls"] += 1
                row["attention_ms"] += spans[0]
            else:
                row["sparse_calls"] += 1
                row["mask_ms"] += spans[0]
                row["plan_ms"] += spans[1]
                row["attention_ms"] += spans[2]
        if clear:
            self._calls.clear()
        return list(rows.values())

    def clear_times(self) -> None:
        self._calls.clear()

    def clear_plans(self) -> None:
        """Drops the cached plans (refresh > 1 keeps one per layer and branch)."""
        self._plans.clear()

    # ---- one self-attention call (inside torch.ops.wavealign.diffusers_attention) --------------------------

    def _is_dense(self, layer: int, step: int | None) -> bool:
        if self.options.dense or layer in self.dense_layers:
            return True
        if self.dense_steps or self.refresh > 1:
            if step is None:
                raise RuntimeError(
                    f"wavealign.diffusers: dense_steps={self.dense_steps} and refresh={self.refresh} need the "
                    "denoising step, and none was given: run the transformer inside "
                    "transformer.cache_context(name, step_index=i) (WanPipeline does), or call "
                    "handle.set_step(i) before each step")
            return step < self.dense_steps
        return False

    def _attend(self, layer: int, q: Any, k: Any, v: Any, scale: float | None) -> Any:
        """q, k, v [B, L, H, d] after RoPE (under context parallelism: the rank's heads) -> O [B, L, H, d]
        (contiguous, q's dtype): the backend's call with the handle's dense calls, plan reuse and timing."""
        step, branch = self.position
        dense = self._is_dense(layer, step)
        call = _Call(step, branch, layer, dense) if self.timing else None
        self._mark(call, q)
        if dense:
            out = _dense_attention(q, k, v, scale, self._processors[layer]._attention_backend)
            self._mark(call, q)
            return out
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))   # [B, H, L, d] views, no copy
        plan, mask = self._plan_for(layer, step, branch, qh, kh, call)
        out = self.options._run(qh, kh, vh, plan, mask, scale)
        self._mark(call, q)
        return out.transpose(1, 2).contiguous()

    def _plan_for(self, layer: int, step: int | None, branch: str | None, q: Any, k: Any,
                  call: _Call | None) -> tuple[Plan | None, Any]:
        """The plan of this call (and the mask, for sdpa-masked): cached per layer and branch for `refresh`
        steps, never keyed by the mask's contents."""
        key = (layer, branch)
        window = None if self.refresh == 1 else (step - self.dense_steps) // self.refresh
        cached = self._plans.get(key) if window is not None else None
        if cached is not None and cached[0] == window:
            if call is not None:
                call.marks += [call.marks[-1]] * 2       # no mask and no plan made: both spans are 0
            return cached[1]
        mask = self.options._mask(q, k)
        self._mark(call, q)
        planned = self.options._plan(mask, q, f" at layer {layer}")
        if planned[0] is not None and self._on_plan is not None:
            self._on_plan(layer, step, branch, planned[0])
        self._mark(call, q)
        if window is not None:
            self._plans[key] = (window, planned)
        return planned

    def _mark(self, call: _Call | None, like: Any) -> None:
        if call is None:
            return
        if not call.marks:
            self._calls.append(call)
        call.marks.append(time_mark(like.device))


def time_mark(device: Any) -> Any:
    """A timing mark on a torch device: a CUDA event recorded on its current stream, or perf_counter seconds."""
    if device.type == "cuda":
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def elapsed_ms(start: Any, end: Any) -> float:
    """Milliseconds between two time_mark()s (CUDA events must have completed: synchronize first)."""
    if isinstance(start, float):
        return 1e3 * (end - start)
    return float(start.elapsed_time(end))


# ---- the kernels that wavealign.sparse_attention does not cover --------------------------------------------

def _masked_sdpa(torch: Any, q: Any, k: Any, v: Any, mask: Any, block_size: tuple[int, int],
                 scale: float | None) -> Any:
    """Dense SDPA over [B, H, L, d] with a dense block mask [H | B*H, MB, NB] expanded to tokens; rows that keep
    no block give O = 0 (SDPA alone would give NaN)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 3):
        raise invalid("method", "backend 'sdpa-masked' needs a dense bool block mask [H, MB, NB] or [B*H, MB, NB] "
                                f"from the mask method, got {type(mask).__name__}")
    batch, heads, length, _ = q.shape
    q_block, kv_block = block_size
    blocks = mask.to(device=q.device, dtype=torch.bool)
    blocks = blocks.reshape(-1, *blocks.shape[-2:])
    if blocks.shape[0] not in (1, heads, batch * heads):
        raise invalid("method", f"returned a mask of {blocks.shape[0]} heads; the layer has {heads} heads and "
                                f"batch {batch}")
    tokens = blocks.repeat_interleave(q_block, 1)[:, :length].repeat_interleave(kv_block, 2)[:, :, :length]
    tokens = tokens.reshape(batch if blocks.shape[0] == batch * heads else 1, -1, length, length)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=tokens, scale=scale)
    return torch.where(tokens.any(-1, keepdim=True), out, torch.zeros((), dtype=out.dtype, device=out.device))


_compiled_flex: Any = None


def _flex(torch: Any, q: Any, k: Any, v: Any, plan: Plan, scale: float | None) -> Any:
    """FlexAttention in plan order (the plug-in path). On CUDA flex_attention is compiled once per process:
    its eager form materializes the whole score matrix."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    from . import flex

    length = q.shape[-2]
    function = flex_attention
    if q.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        function = _compiled_flex
    block_mask = flex.block_mask(plan, length, device=q.device)
    out = function(plan.permute_rows(q), k, v, block_mask=block_mask, scale=scale)
    return plan.unpermute_rows(out, seq_len=length)


# ---- the diffusers attention backend -------------------------------------------------------------------------

def register_backend() -> Any:
    """Registers "wavealign" with diffusers' attention dispatcher (importing this module does it when diffusers
    imports) and returns its AttentionBackendName member. Calling it again changes nothing.

    diffusers' backend registry is keyed by members of its enum AttentionBackendName, which is closed: a name
    it does not list cannot be registered, passed to attention_backend() or set_attention_backend(). Rather
    than replace the enum or patch the functions that read it, one member is added the way Enum makes its
    own: an instance of the enum with `_name_` "WAVEALIGN" and `_value_` "wavealign", entered in the two
    tables Enum's lookups read, `_value2member_map_` (AttentionBackendName("wavealign"), which
    attention_backend and dispatch_attention_fn call) and `_member_map_` (`__members__`, the list
    set_attention_backend checks names against). `_member_names_` is left alone, so iterating the enum lists
    diffusers' own backends only. The backend itself goes in through the registry's own decorator,
    `_AttentionBackendRegistry.register(..., supports_context_parallel=True)`, like diffusers' built-in
    backends. A diffusers release that lists "wavealign" itself, or a second call, finds the member by value
    and adds nothing.
    """
    global _backend_member
    if _backend_member is not None:
        return _backend_member
    torch = require_torch("wavealign.diffusers")
    _require_diffusers()
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    try:
        member = AttentionBackendName(BACKEND_NAME)
    except ValueError:
        member = str.__new__(AttentionBackendName, BACKEND_NAME)
        member._name_, member._value_ = BACKEND_NAME.upper(), BACKEND_NAME
        AttentionBackendName._value2member_map_[BACKEND_NAME] = member
        AttentionBackendName._member_map_[member._name_] = member
    _register_op(torch)
    if member not in _AttentionBackendRegistry._backends:
        _AttentionBackendRegistry.register(member, supports_context_parallel=True)(_wavealign_attention)
    _backend_member = member
    return member


def _wavealign_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                         is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                         return_lse: bool = False, _parallel_config: Any = None,
                         _wavealign_handle: int = _NO_HANDLE, _wavealign_layer: int = _NO_LAYER) -> Any:
    """The "wavealign" backend: diffusers' dispatch_attention_fn calls it with q, k, v [B, L, H, d].

    A self-attention call (the key's length is the query's) runs block-sparse: with the options of the
    enclosing BackendOptions block, or, from apply's processors (`_wavealign_handle`, `_wavealign_layer`
    through the call's attention_kwargs), with those of the handle and its layer. Under context parallelism it
    goes through diffusers' templated Ulysses attention, which gives each rank H/P heads over the whole
    sequence; the sparse call runs on those. A cross-attention call (the key has its own length, as the text
    tokens of attn2) runs diffusers' "native" backend with everything it was given.
    """
    from diffusers.models.attention_dispatch import AttentionBackendName, _templated_context_parallel_attention, \
        dispatch_attention_fn

    if key.shape[1] != query.shape[1]:
        return dispatch_attention_fn(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                     is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                                     attention_kwargs={"return_lse": True} if return_lse else None,
                                     backend=AttentionBackendName.NATIVE, parallel_config=_parallel_config)
    _refuse_what_sparse_calls_do_not_take(attn_mask, dropout_p, is_causal, enable_gqa, return_lse)
    if _parallel_config is None:
        return _sparse_call(query, key, value, scale, _wavealign_handle, _wavealign_layer)
    context_parallel = _parallel_config.context_parallel_config
    if context_parallel.ring_degree > 1:
        raise invalid("ring_degree", f"is {context_parallel.ring_degree}: the attention backend 'wavealign' runs "
                                     "under Ulysses context parallelism only (ulysses_degree). A ring step sees one "
                                     "shard of the keys, and the mask methods select each query block's keys "
                                     "from all of them, so no ring step could make the one-process mask")
    forward = functools.partial(_ulysses_forward, handle=_wavealign_handle, layer=_wavealign_layer)
    return _templated_context_parallel_attention(query, key, value, None, 0.0, False, scale, False, False,
                                                 forward_op=forward, backward_op=_no_backward,
                                                 _parallel_config=_parallel_config)


def _refuse_what_sparse_calls_do_not_take(attn_mask: Any, dropout_p: float, is_causal: bool, enable_gqa: bool,
                                          return_lse: bool) -> None:
    refused = {"attn_mask": attn_mask is not None, "dropout_p": dropout_p != 0.0, "is_causal": bool(is_causal),
               "enable_gqa": bool(enable_gqa), "return_lse": bool(return_lse)}
    for argument, given in refused.items():
        if given:
            raise invalid(argument, "is not taken by the attention backend 'wavealign' in a self-attention call: "
                                    "its block mask comes from the mask method (no attention mask, causal mask, "
                                    "dropout or grouped heads), and it returns O alone")


def _sparse_call(query: Any, key: Any, value: Any, scale: float | None, handle: int, layer: int) -> Any:
    import torch

    return torch.ops.wavealign.diffusers_attention(query, key, value, scale, handle, layer)


def _ulysses_forward(ctx: Any, query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float, is_causal: bool,
                     scale: float | None, enable_gqa: bool, return_lse: bool, _save_ctx: bool = True,
                     _parallel_config: Any = None, *, handle: int, layer: int) -> Any:
    """diffusers' forward_op of the templated context-parallel attention: q, k, v [B, L, H/P, d] of the rank's
    heads over the whole sequence (after the all-to-all), O of the same shape. Nothing is saved for a backward."""
    return _sparse_call(query, key, value, scale, handle, layer)


def _no_backward(ctx: Any, grad_out: Any, *args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("wavealign.diffusers: the attention backend 'wavealign' has no backward (inference only)")


def _register_op(torch: Any) -> None:
    """torch.ops.wavealign.diffusers_attention(q, k, v, scale, handle, layer) -> O, q, k, v and O [B, L, H, d]:
    one opaque node per sparse call under torch.compile. The mask method, the plan and the kernel run eagerly
    inside and read host state there: the handle's step for apply's calls (handle, layer), the active
    BackendOptions for the backend's own (handle 0)."""
    global _op_registered
    with _op_lock:
        if _op_registered:
            return

        @torch.library.custom_op("wavealign::diffusers_attention", mutates_args=(),
                                 schema="(Tensor q, Tensor k, Tensor v, float? scale, int handle, int layer) -> Tensor")
        def diffusers_attention(q, k, v, scale, handle, layer):
            if handle == _NO_HANDLE:
                return _options_of_this_call()._attend(q, k, v, scale)
            owner = _handles.get(handle)
            if owner is None:
                raise RuntimeError("wavealign.diffusers: this processor's handle was removed "
                                   "(wavealign.diffusers.remove); apply it again")
            return owner._attend(layer, q, k, v, scale)

        @diffusers_attention.register_fake
        def _(q, k, v, scale, handle, layer):
            return torch.empty_like(q, memory_format=torch.contiguous_format)

        _op_registered = True


# ---- apply's processors ---------------------------------------------------------------------------------------

class _SparseSelfAttnProcessor:
    """What the self-attention processors `apply` puts on a block's attn1 share (one per layer): the handle and
    layer they serve, the refusals, and the attention, handed to the "wavealign" backend through diffusers'
    dispatch_attention_fn with the handle and the layer in its attention_kwargs (so context parallelism takes
    the backend's route). The diffusers attributes are kept: `_attention_backend` is the backend of the dense
    calls (the stock processor's), `_parallel_config` the context-parallel config enable_parallelism sets.
    Each model's subclass mirrors its stock processor up to the attention.
    """

    _attention_backend = None
    _parallel_config = None

    def __init__(self, handle: WanSparseAttention, layer: int, stock: Any) -> None:
        self.handle_id = handle.id
        self.layer = layer
        self._attention_backend = getattr(stock, "_attention_backend", None)
        self._parallel_config = getattr(stock, "_parallel_config", None)

    def __repr__(self) -> str:
        return f"wavealign.diffusers.{type(self).__name__}(layer={self.layer})"

    def _refuse(self, encoder_hidden_states: Any, attention_mask: Any) -> None:
        if encoder_hidden_states is not None or attention_mask is not None:
            raise invalid("encoder_hidden_states" if encoder_hidden_states is not None else "attention_mask",
                          "the wavealign self-attention processor takes neither (it replaces attn1 only)")

    def _attend(self, attn: Any, query: Any, key: Any, value: Any) -> Any:
        """O of q, k, v [B, L, H, d] through the backend, heads flattened, through attn's output projection."""
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        out = dispatch_attention_fn(query, key, value, backend=_backend_member, parallel_config=self._parallel_config,
                                    attention_kwargs={"_wavealign_handle": self.handle_id,
                                                      "_wavealign_layer": self.layer})
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


class WanSparseAttnProcessor(_SparseSelfAttnProcessor):
    """On a WanTransformer3DModel block's attn1: diffusers' WanAttnProcessor up to the attention."""

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, rotary_emb: tuple[Any, Any] | None = None) -> Any:
        from diffusers.models.transformers.transformer_wan import _get_qkv_projections

        self._refuse(encoder_hidden_states, attention_mask)
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query = _rotate(query, *rotary_emb)
            key = _rotate(key, *rotary_emb)
        return self._attend(attn, query, key, value)


class LtxSparseAttnProcessor(_SparseSelfAttnProcessor):
    """On an LTXVideoTransformer3DModel block's attn1: diffusers' LTXVideoAttnProcessor up to the attention (the
    norms across heads and diffusers' own LTX RoPE on the flattened heads, then the heads split)."""

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, image_rotary_emb: tuple[Any, Any] | None = None) -> Any:
        from diffusers.models.transformers.transformer_ltx import apply_rotary_emb

        self._refuse(encoder_hidden_states, attention_mask)
        query = attn.norm_q(attn.to_q(hidden_states))
        key = attn.norm_k(attn.to_k(hidden_states))
        value = attn.to_v(hidden_states)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb)
            key = apply_rotary_emb(key, image_rotary_emb)
        heads = (attn.heads, -1)
        return self._attend(attn, query.unflatten(2, heads), key.unflatten(2, heads), value.unflatten(2, heads))


def _rotate(x: Any, cos: Any, sin: Any) -> Any:
    """Wan's RoPE on x [B, L, H, d]: each channel pair (2i, 2i+1) turns by the angle of cos/sin [1, L, 1, d]
    (whose entries repeat per pair). The float32 products are rounded back to x's dtype once, as diffusers
    does, so the result is bit for bit diffusers' own."""
    import torch

    pairs = x.unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    turned = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return turned.flatten(-2).to(x.dtype)


# ---- the step context of diffusers pipelines ---------------------------------------------------------------

def _step_hook(handle: WanSparseAttention) -> Any:
    """A stateful diffusers hook whose StateManager hands the pipeline's cache context to the handle."""
    from diffusers.hooks import ModelHook
    from diffusers.hooks.hooks import BaseState, StateManager

    class _NoState(BaseState):
        def reset(self, *args: Any, **kwargs: Any) -> None:
            pass

    class _ContextToHandle(StateManager):
        def __init__(self) -> None:
            super().__init__(_NoState)

        def set_context(self, context: Any) -> None:
            super().set_context(context)
            handle._record_context(context)

    class _StepContextHook(ModelHook):
        _is_stateful = True

        def __init__(self) -> None:
            super().__init__()
            self.state = _ContextToHandle()

        def reset_state(self, module: Any) -> Any:
            self.state.reset()
            handle._record_context(None)
            return module

    return _StepContextHook()


# ---- apply / remove ----------------------------------------------------------------------------------------

def _resolve_method(method: Any, options: dict[str, Any],
                    block_size: tuple[int, int]) -> tuple[Callable[..., Any] | None, str]:
    """(the mask method as a callable (q, k) -> mask, or None for "dense"; its name). A named method makes its
    mask in the plan's blocks: block_size goes to it, and its options are checked here, before any call."""
    if isinstance(method, str):
        if method == "dense":
            if options:
                raise invalid("method_options", "method 'dense' takes no options")
            return None, method
        if method not in METHODS:
            raise invalid("method", f"unknown value {method!r} (expected one of: {', '.join(METHODS)}, dense, "
                                    "or a callable (q, k) -> block mask)")
        try:
            methods = importlib.import_module("wavealign.methods")
        except ImportError as error:
            raise invalid("method", f"{method!r} needs wavealign.methods, which cannot be imported ({error}); "
                                    "pass a callable (q, k) -> block mask instead") from error
        function = getattr(methods, method, None)
        if function is None:
            raise invalid("method", f"wavealign.methods has no {method!r}")
        options = _method_options_with_block(method, options, block_size)
        try:
            methods.check_options(method, **options)
        except TypeError as error:  # a keyword the method does not take
            raise invalid("method_options", f"{error}") from error
    elif callable(method):
        function, method = method, getattr(method, "__name__", type(method).__name__)
    else:
        raise invalid("method", f"must be a method name or a callable (q, k) -> block mask, got "
                                f"{type(method).__name__}")
    return (lambda q, k: function(q, k, **options)) if options else function, method


def _method_options_with_block(method: str, options: dict[str, Any], block_size: tuple[int, int]) -> dict[str, Any]:
    """A named method's options with the block size of the plan: its masks have square blocks, the plan's."""
    q_block, kv_block = block_size
    if q_block != kv_block:
        raise invalid("block_size", f"is {block_size}, but method {method!r} makes square blocks: give one size")
    given = options.get("block_size", q_block)
    if given != q_block:
        raise invalid("method_options", f"block_size={given!r} differs from the block_size={q_block} argument: "
                                        "the mask must be in the plan's blocks (give block_size once, as the "
                                        "argument)")
    return dict(options, block_size=q_block)


def _resolve_backend(backend: Any, precision: str) -> Callable[..., Any] | None:
    """The kernel call (q, k, v, plan, scale=) of a backend that wavealign.sparse_attention or wavealign.fa4
    runs; None for flex and sdpa-masked, which run here."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise invalid("backend", f"unknown value {backend!r} (expected one of: {', '.join(BACKENDS)})")
    if precision != "native" and backend != "wavealign":
        raise invalid("precision", f"{precision!r} runs on backend 'wavealign' (the fused 8-bit kernel), got "
                                   f"backend {backend!r}")
    if backend == "wavealign":
        from ._attention import sparse_attention

        return functools.partial(sparse_attention, precision=precision)
    if backend == "fa4":
        try:
            fa4 = importlib.import_module("wavealign.fa4")
        except ImportError as error:
            raise invalid("backend", f"'fa4' needs wavealign.fa4, which cannot be imported ({error})") from error
        if not hasattr(fa4, "sparse_attention"):
            raise invalid("backend", "'fa4': wavealign.fa4 has no sparse_attention(q, k, v, plan)")
        return fa4.sparse_attention
    return None


def _dense_layer_set(dense_layers: Any, layers: int) -> frozenset[int]:
    if isinstance(dense_layers, bool):
        raise invalid("dense_layers", "must be an int or a collection of layer indices, got bool")
    if isinstance(dense_layers, int):
        count = check_int(dense_layers, "dense_layers", 0)
        return frozenset(range(min(count, layers)))
    if not isinstance(dense_layers, Iterable):
        raise invalid("dense_layers", f"must be an int or a collection of layer indices, got "
                                      f"{type(dense_layers).__name__}")
    indices = frozenset(check_int(index, "dense_layers", 0) for index in dense_layers)
    outside = sorted(index for index in indices if index >= layers)
    if outside:
        raise invalid("dense_layers", f"layer indices {outside} are outside the transformer's {layers} blocks")
    return indices


def _self_attentions(transformer: Any) -> tuple[list[Any], type]:
    """(each block's attn1, the processor class for them) of a WanTransformer3DModel (`blocks`) or an
    LTXVideoTransformer3DModel (`transformer_blocks`)."""
    blocks, processor = getattr(transformer, "blocks", None), WanSparseAttnProcessor
    if blocks is None and type(transformer).__name__ == "LTXVideoTransformer3DModel":
        blocks, processor = getattr(transformer, "transformer_blocks", None), LtxSparseAttnProcessor
    if blocks is None or not all(hasattr(block, "attn1") for block in blocks):
        raise invalid("transformer", f"must be a diffusers WanTransformer3DModel or LTXVideoTransformer3DModel "
                                     f"(blocks with attn1), got {type(transformer).__name__}")
    attentions = [block.attn1 for block in blocks]
    for layer, attention in enumerate(attentions):
        if getattr(attention, "is_cross_attention", False) or getattr(attention, "add_k_proj", None) is not None:
            raise invalid("transformer", f"blocks[{layer}].attn1 is not a self-attention")
    return attentions, processor


def apply(transformer: Any, method: Any, *, backend: str = "wavealign", order: str = "wavealign",
          dense_steps: int = 0, dense_layers: int | Iterable[int] = 0, refresh: int = 1,
          block_size: int | tuple[int, int] = 128, method_options: dict[str, Any] | None = None,
          skip: str = "auto", profile: Any = None, plan_options: dict[str, Any] | None = None,
          timing: bool = False, on_plan: Callable[..., Any] | None = None,
          precision: str = "native") -> WanSparseAttention:
    """Puts the wavealign sparse self-attention processor on every block's attn1 of a WanTransformer3DModel or
    an LTXVideoTransformer3DModel (cross-attention untouched); its calls run the "wavealign" attention backend
    with BackendOptions(method, backend=, precision=, order=, block_size=, method_options=, skip=, profile=,
    plan_options=) and the layer they come from. A transformer with diffusers' context parallelism enabled
    (before or after apply) runs them through diffusers' Ulysses attention, each rank on its heads.

    Args:
        transformer: a diffusers WanTransformer3DModel or LTXVideoTransformer3DModel (pipe.transformer).
        method: the mask method: "xattention", "sparge", "minference" or "flexprefill" (wavealign.methods),
            "dense" (every call dense, for timing), or any callable (q, k) -> block mask, called with the
            RoPE'd q and k as [B, H, L, d] views; the mask is what wavealign.plan takes (bool [H | B*H, MB, NB],
            a CSR pair or a FlexAttention BlockMask) in blocks of `block_size`. A named method gets
            `block_size` (square) and its options are checked here (wavealign.methods.check_options).
        backend: the kernel: "wavealign" (fused kernel on CUDA, float32 reference on the CPU), "fa4"
            (FlashAttention-4, wavealign.fa4), "flex" (FlexAttention) or "sdpa-masked" (dense SDPA with the
            expanded mask, in the original order, no plan: the reference).
        order: the plan's row order ("wavealign", "s1", "s2", "original", "shuffled").
        dense_steps: the first `dense_steps` denoising steps run dense (needs the step, see set_step).
        dense_layers: an int N (layers 0..N-1 run dense) or a collection of layer indices.
        refresh: denoising steps that share one mask and plan per layer and branch (1 = a new mask every
            call). refresh > 1 keeps one plan per layer and branch alive (a GPU plan holds a bool copy of its
            mask: H x MB x NB bytes).
        block_size: tokens per mask block, int or (q_block, kv_block).
        method_options: keyword arguments of the mask method (a named method's block_size is apply's).
        skip, profile: as in wavealign.plan (the profile is parsed once, here).
        plan_options: further wavealign.plan keywords (wave_size, iterations, seed, gpu, planner, tokens,
            plan_reuse; plan_reuse defaults to `refresh`).
        timing: record mask, plan and attention times per call (see WanSparseAttention.step_times).
        on_plan: called as on_plan(layer, step, branch, plan) each time a plan is made.
        precision: the fused kernel's arithmetic, as in wavealign.sparse_attention: "native" or "int8" (backend
            "wavealign" only).

    Returns the handle; `remove(transformer)` puts the original processors back.
    """
    register_backend()
    if getattr(transformer, _HANDLE_ATTRIBUTE, None) is not None:
        raise invalid("transformer", "already has the wavealign processors; call wavealign.diffusers.remove "
                                     "first")
    attentions, processor_class = _self_attentions(transformer)
    refresh = check_int(refresh, "refresh", 1)
    plan_options = _checked_dict(plan_options, "plan_options")
    plan_options.setdefault("plan_reuse", float(refresh))
    options = BackendOptions(method, backend=backend, precision=precision, order=order, block_size=block_size,
                             method_options=method_options, skip=skip, profile=profile, plan_options=plan_options)
    if on_plan is not None and not callable(on_plan):
        raise invalid("on_plan", f"must be callable or None, got {type(on_plan).__name__}")
    handle = WanSparseAttention(
        options=options, dense_steps=check_int(dense_steps, "dense_steps", 0),
        dense_layers=_dense_layer_set(dense_layers, len(attentions)), refresh=refresh, timing=bool(timing),
        on_plan=on_plan, layers=len(attentions))

    from diffusers.hooks import HookRegistry

    had_registry = hasattr(transformer, "_diffusers_hook")
    had_forward = "forward" in vars(transformer)
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    registry.register_hook(_step_hook(handle), _HOOK_NAME)
    stock = [attention.processor for attention in attentions]
    handle._processors = [processor_class(handle, layer, processor) for layer, processor in enumerate(stock)]
    handle._restore = (stock, had_registry, had_forward)
    for attention, processor in zip(attentions, handle._processors):
        attention.set_processor(processor)
    setattr(transformer, _HANDLE_ATTRIBUTE, handle)
    return handle


def remove(transformer: Any) -> None:
    """Puts back the processors that apply() found (the same objects) and removes its step hook. A context-
    parallel config that enable_parallelism set on apply's processors goes to the stock ones."""
    handle = getattr(transformer, _HANDLE_ATTRIBUTE, None)
    if handle is None:
        raise invalid("transformer", "has no wavealign processors (apply was not called, or remove was)")
    stock, had_registry, had_forward = handle._restore
    for attention, processor, ours in zip(_self_attentions(transformer)[0], stock, handle._processors):
        if ours._parallel_config is not None and hasattr(processor, "_parallel_config"):
            processor._parallel_config = ours._parallel_config
        attention.set_processor(processor)
    registry = transformer._diffusers_hook
    registry.remove_hook(_HOOK_NAME, recurse=False)
    if not registry.hooks and not had_registry:
        del transformer._diffusers_hook
        if not had_forward:
            vars(transformer).pop("forward", None)
    delattr(transformer, _HANDLE_ATTRIBUTE)
    _handles.pop(handle.id, None)
    handle.clear_plans()


def _require_diffusers() -> Any:
    try:
        import diffusers
    except ImportError as error:
        raise ImportError(f"wavealign.diffusers needs diffusers (import diffusers failed: {error}); "
                          "pip install diffusers==0.42.1") from error
    return diffusers


try:
    register_backend()
except ImportError:   # diffusers (or torch) is not installed: apply and BackendOptions' use say so when called
    pass


__all__ = ["apply", "remove", "WanSparseAttention", "WanSparseAttnProcessor", "LtxSparseAttnProcessor",
           "BackendOptions", "set_backend_options", "active_backend_options", "register_backend", "BACKEND_NAME",
           "BACKENDS", "METHODS", "time_mark", "elapsed_ms"]
