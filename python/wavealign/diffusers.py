"""wavealign inside diffusers' Wan2.1 transformer: block-sparse self-attention in WaveAlign order.

    import wavealign.diffusers

    handle = wavealign.diffusers.apply(pipe.transformer, method="xattention", backend="wavealign",
                                       dense_steps=10, dense_layers=1, timing=True)
    latents = pipe(prompt_embeds=..., negative_prompt_embeds=..., output_type="latent").frames
    for row in handle.step_times():
        print(row)                          # per step and branch: mask, plan and attention ms
    wavealign.diffusers.remove(pipe.transformer)

`apply` swaps the processor of every block's self-attention (`attn1`) of a `WanTransformer3DModel` (or of an
`LTXVideoTransformer3DModel`: LTX-Video's norms across heads and its RoPE); the cross-attention (`attn2`) keeps
its own. Each self-attention call runs the mask method on the RoPE'd q and k,
plans the mask (on the GPU for a CUDA mask) and runs the chosen backend in plan order; dense warm-up steps and
layers run diffusers' own attention. The processor does what diffusers' WanAttnProcessor does around the
attention (the fused or separate q/k/v projections, the q/k RMSNorms, RoPE, the output projection), so the
model is unchanged but for the attention of the sparse calls. diffusers and torch are imported only here.

The step: WanPipeline wraps each transformer call in `transformer.cache_context("cond" | "uncond",
step_index=i, ...)`; the handle reads that context (the step index and the branch name) through a diffusers
hook on the transformer. A loop that does not say the step calls `handle.set_step(i)` (and, to tell CFG
branches apart, `branch=`). See docs/python.md ("In a diffusers Wan2.1 model").
"""

from __future__ import annotations

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

BACKENDS = ("wavealign", "fa4", "flex", "sdpa-masked")
"""wavealign: the fused kernel (CUDA bf16/fp16) or the float32 CPU reference; fa4: FlashAttention-4 through the
plug-in path (wavealign.fa4); flex: FlexAttention through the plug-in path; sdpa-masked: dense SDPA with the
block mask expanded to tokens, in the original order (the reference of the tests; no plan is made)."""

METHODS = ("xattention", "sparge", "minference", "flexprefill")
"""Mask methods resolved by name from wavealign.methods; "dense" runs every call dense (timed)."""

_HOOK_NAME = "wavealign_step_context"
_HANDLE_ATTRIBUTE = "_wavealign_sparse_attention"

_handles: weakref.WeakValueDictionary[int, WanSparseAttention] = weakref.WeakValueDictionary()
_handle_ids = itertools.count(1)
_op_lock = threading.Lock()
_op_registered = False


@dataclass
class _Call:
    """One self-attention call: where it ran and its timing marks (CUDA events or perf_counter seconds)."""

    step: int | None
    branch: str | None
    layer: int
    dense: bool
    marks: list[Any] = field(default_factory=list)


class WanSparseAttention:
    """The handle of `apply`: the options, the step state, the plan cache and the timings of one transformer.

    Attributes (read-only after apply): method, backend, order, dense_steps, dense_layers (a frozenset),
    refresh, block_size ((q_block, kv_block)), layers (how many blocks the transformer has).
    """

    def __init__(self, *, method: Callable[..., Any] | None, method_name: str, backend: str, order: str,
                 dense_steps: int, dense_layers: frozenset[int], refresh: int, block_size: tuple[int, int],
                 plan_options: dict[str, Any], timing: bool, on_plan: Callable[..., Any] | None,
                 layers: int, backend_call: Callable[..., Any] | None) -> None:
        self.method_name = method_name
        self.backend = backend
        self.order = order
        self.dense_steps = dense_steps
        self.dense_layers = dense_layers
        self.refresh = refresh
        self.block_size = block_size
        self.layers = layers
        self.timing = timing
        self._method = method
        self._plan_options = plan_options
        self._on_plan = on_plan
        self._backend_call = backend_call
        self._explicit: tuple[int, str | None] | None = None
        self._context: Any = None
        self._plans: dict[tuple[int, str | None], tuple[int, Plan]] = {}
        self._calls: list[_Call] = []
        self._processors: list[_SparseSelfAttnProcessor] = []
        self._restore: tuple[list[Any], bool, bool] | None = None   # stock processors, had registry / forward
        self.id = next(_handle_ids)
        _handles[self.id] = self

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
        method, the plan and the attention backend; reading them synchronizes the device. A gap in which the
        device waited for the host to enqueue the next work counts in the part it fell into. On the CPU they
        are wall times. Dense calls have only an attention time.
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

    # ---- one self-attention call (inside torch.ops.wavealign.wan_self_attention) ---------------------------

    def _is_dense(self, layer: int, step: int | None) -> bool:
        if self._method is None or layer in self.dense_layers:
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

    def _attend(self, processor: _SparseSelfAttnProcessor, q: Any, k: Any, v: Any) -> Any:
        """q, k, v [B, L, H, d] after RoPE -> O [B, L, H, d] (contiguous, q's dtype)."""
        torch = require_torch("wavealign.diffusers")
        layer = processor.layer
        step, branch = self.position
        dense = self._is_dense(layer, step)
        call = _Call(step, branch, layer, dense) if self.timing else None
        self._mark(call, q)
        if dense:
            from diffusers.models.attention_dispatch import dispatch_attention_fn

            out = dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                        backend=processor._attention_backend, parallel_config=None)
            self._mark(call, q)
            return out.contiguous()
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))   # [B, H, L, d] views, no copy
        plan, mask = self._plan_for(layer, step, branch, qh, kh, call)
        if self.backend == "sdpa-masked":
            out = _masked_sdpa(torch, qh, kh, vh, mask, self.block_size)
        elif self.backend == "flex":
            out = _flex(torch, qh, kh, vh, plan)
        else:
            out = self._backend_call(qh, kh, vh, plan)
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
        mask = self._method(q, k)
        self._mark(call, q)
        plan = None
        if self.backend != "sdpa-masked":
            plan = make_plan(mask, block_size=self.block_size, order=self.order, head_dim=int(q.shape[-1]),
                             **self._plan_options)
            self._check_blocks(plan.q_blocks, plan.kv_blocks, q.shape[-2], layer)
            if self._on_plan is not None:
                self._on_plan(layer, step, branch, plan)
            mask = None                                   # the plan holds what the backends read
        elif getattr(mask, "ndim", 0) >= 2:
            self._check_blocks(mask.shape[-2], mask.shape[-1], q.shape[-2], layer)
        self._mark(call, q)
        if window is not None:
            self._plans[key] = (window, (plan, mask))
        return plan, mask

    def _check_blocks(self, q_blocks: int, kv_blocks: int, tokens: int, layer: int) -> None:
        q_block, kv_block = self.block_size
        expected = (blocks_for(tokens, q_block), blocks_for(tokens, kv_block))
        if (q_blocks, kv_blocks) != expected:
            raise invalid("method", f"returned a mask of {q_blocks} x {kv_blocks} blocks at layer {layer}; "
                                    f"{tokens} tokens in blocks of block_size={self.block_size} need "
                                    f"{expected[0]} x {expected[1]}")

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


# ---- the backends that wavealign.sparse_attention does not cover -------------------------------------------

def _masked_sdpa(torch: Any, q: Any, k: Any, v: Any, mask: Any, block_size: tuple[int, int]) -> Any:
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
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=tokens)
    return torch.where(tokens.any(-1, keepdim=True), out, torch.zeros((), dtype=out.dtype, device=out.device))


_compiled_flex: Any = None


def _flex(torch: Any, q: Any, k: Any, v: Any, plan: Plan) -> Any:
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
    out = function(plan.permute_rows(q), k, v, block_mask=block_mask)
    return plan.unpermute_rows(out, seq_len=length)


# ---- the processor ------------------------------------------------------------------------------------------

class _SparseSelfAttnProcessor:
    """What the self-attention processors `apply` puts on a block's attn1 share (one per layer): the handle and
    layer they serve, the refusals, and the attention itself, handed to the handle through the custom op
    torch.ops.wavealign.wan_self_attention, so torch.compile traces the module around it in one graph. The
    diffusers attributes `_attention_backend` (the backend of the dense calls) and `_parallel_config` are kept;
    context parallelism is not supported. Each model's subclass mirrors its stock processor up to the attention.
    """

    _attention_backend = None
    _parallel_config = None

    def __init__(self, handle: WanSparseAttention, layer: int, stock: Any) -> None:
        self.handle_id = handle.id
        self.layer = layer
        self._attention_backend = getattr(stock, "_attention_backend", None)

    def __repr__(self) -> str:
        return f"wavealign.diffusers.{type(self).__name__}(layer={self.layer})"

    def _refuse(self, encoder_hidden_states: Any, attention_mask: Any) -> None:
        if encoder_hidden_states is not None or attention_mask is not None:
            raise invalid("encoder_hidden_states" if encoder_hidden_states is not None else "attention_mask",
                          "the wavealign self-attention processor takes neither (it replaces attn1 only)")
        if self._parallel_config is not None:
            raise RuntimeError("wavealign.diffusers: context parallelism is not supported by the sparse "
                               "self-attention processor")

    def _attend(self, attn: Any, query: Any, key: Any, value: Any) -> Any:
        """O of q, k, v [B, L, H, d] through the handle, heads flattened, through attn's output projection."""
        import torch

        out = torch.ops.wavealign.wan_self_attention(query, key, value, self.handle_id, self.layer)
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


def _register_op(torch: Any) -> None:
    """torch.ops.wavealign.wan_self_attention(q, k, v, handle, layer) -> O: one opaque node per self-attention
    call under torch.compile (mask method, plan and backend run eagerly inside; they read host state)."""
    global _op_registered
    with _op_lock:
        if _op_registered:
            return

        @torch.library.custom_op("wavealign::wan_self_attention", mutates_args=(),
                                 schema="(Tensor q, Tensor k, Tensor v, int handle, int layer) -> Tensor")
        def wan_self_attention(q, k, v, handle, layer):
            owner = _handles.get(handle)
            if owner is None:
                raise RuntimeError("wavealign.diffusers: this processor's handle was removed "
                                   "(wavealign.diffusers.remove); apply it again")
            return owner._attend(owner._processors[layer], q, k, v)

        @wan_self_attention.register_fake
        def _(q, k, v, handle, layer):
            return q.new_empty(q.shape)

        _op_registered = True


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
    """A named method's options with apply's block size: its masks have square blocks, those of the plan."""
    q_block, kv_block = block_size
    if q_block != kv_block:
        raise invalid("block_size", f"is {block_size}, but method {method!r} makes square blocks: give one size")
    given = options.get("block_size", q_block)
    if given != q_block:
        raise invalid("method_options", f"block_size={given!r} differs from apply's block_size={q_block}: the "
                                        "mask must be in the plan's blocks (give block_size to apply only)")
    return dict(options, block_size=q_block)


def _resolve_backend(backend: Any, precision: str) -> Callable[..., Any] | None:
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
        if getattr(attention.processor, "_parallel_config", None) is not None:
            raise invalid("transformer", "context parallelism is enabled; the sparse self-attention processor "
                                         "does not support it")
    return attentions, processor


def apply(transformer: Any, method: Any, *, backend: str = "wavealign", order: str = "wavealign",
          dense_steps: int = 0, dense_layers: int | Iterable[int] = 0, refresh: int = 1,
          block_size: int | tuple[int, int] = 128, method_options: dict[str, Any] | None = None,
          skip: str = "auto", profile: Any = None, plan_options: dict[str, Any] | None = None,
          timing: bool = False, on_plan: Callable[..., Any] | None = None,
          precision: str = "native") -> WanSparseAttention:
    """Puts the wavealign sparse self-attention processor on every block's attn1 of a WanTransformer3DModel or
    an LTXVideoTransformer3DModel (cross-attention untouched).

    Args:
        transformer: a diffusers WanTransformer3DModel or LTXVideoTransformer3DModel (pipe.transformer).
        method: the mask method: "xattention", "sparge", "minference" or "flexprefill" (wavealign.methods),
            "dense" (every call dense, for timing), or any callable (q, k) -> block mask, called with the
            RoPE'd q and k as [B, H, L, d] views; the mask is what wavealign.plan takes (bool [H | B*H, MB, NB],
            a CSR pair or a FlexAttention BlockMask) in blocks of `block_size`. A named method gets
            `block_size` (square) and its options are checked here (wavealign.methods.check_options).
        backend: "wavealign" (fused kernel on CUDA, float32 reference on the CPU), "fa4" (FlashAttention-4,
            wavealign.fa4), "flex" (FlexAttention) or "sdpa-masked" (dense SDPA with the expanded mask, in the
            original order, no plan: the reference).
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
    torch = require_torch("wavealign.diffusers")
    _require_diffusers()
    if getattr(transformer, _HANDLE_ATTRIBUTE, None) is not None:
        raise invalid("transformer", "already has the wavealign processors; call wavealign.diffusers.remove "
                                     "first")
    attentions, processor_class = _self_attentions(transformer)
    if method_options is not None and not isinstance(method_options, dict):
        raise invalid("method_options", f"must be a dict or None, got {type(method_options).__name__}")
    if plan_options is not None and not isinstance(plan_options, dict):
        raise invalid("plan_options", f"must be a dict or None, got {type(plan_options).__name__}")
    block = block_pair(block_size)
    function, method_name = _resolve_method(method, dict(method_options or {}), block)
    backend_call = _resolve_backend(backend, check_choice(precision, "precision", "precision"))
    order = check_choice(order, "order", "order")
    skip = check_choice(skip, "skip", "skip")
    refresh = check_int(refresh, "refresh", 1)
    options = dict(plan_options or {})
    reserved = sorted({"block_size", "order", "head_dim", "skip", "profile"} & options.keys())
    if reserved:
        raise invalid("plan_options", f"{reserved} are arguments of apply itself")
    options.setdefault("plan_reuse", float(refresh))
    options.update(skip=skip, profile=_profile.resolve(profile))
    if on_plan is not None and not callable(on_plan):
        raise invalid("on_plan", f"must be callable or None, got {type(on_plan).__name__}")
    handle = WanSparseAttention(
        method=function, method_name=method_name, backend=backend, order=order,
        dense_steps=check_int(dense_steps, "dense_steps", 0),
        dense_layers=_dense_layer_set(dense_layers, len(attentions)), refresh=refresh,
        block_size=block, plan_options=options, timing=bool(timing), on_plan=on_plan,
        layers=len(attentions), backend_call=backend_call)
    _register_op(torch)

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
    """Puts back the processors that apply() found (the same objects) and removes its step hook."""
    handle = getattr(transformer, _HANDLE_ATTRIBUTE, None)
    if handle is None:
        raise invalid("transformer", "has no wavealign processors (apply was not called, or remove was)")
    stock, had_registry, had_forward = handle._restore
    for attention, processor in zip(_self_attentions(transformer)[0], stock):
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


__all__ = ["apply", "remove", "WanSparseAttention", "WanSparseAttnProcessor", "LtxSparseAttnProcessor", "BACKENDS",
           "METHODS", "time_mark", "elapsed_ms"]
