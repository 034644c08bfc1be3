"""The paper's sparse-attention methods as mask generators, and adapters from the methods' own outputs.

    mask = wavealign.methods.xattention(q, k, threshold=0.9, stride=8)   # bool [H, MB, NB] (or [B*H, ...])
    mask = wavealign.methods.flexprefill(q, k, preset="table1")          # Table I's densities (synthetic Q/K)
    plan = wavealign.plan(mask)
    out = wavealign.sparse_attention(q, k, v, plan)

q, k: [B, H, L, d] or [H, L, d]. CUDA torch tensors (bfloat16/float16) run the GPU generator on the current
stream without host synchronization and return a CUDA bool tensor; numpy arrays and CPU torch tensors run the
fp64 CPU reference (small L) and return the same framework. Every method is the non-causal form video
self-attention needs; docs/methods.md gives each method's steps, its parameters, the non-causal adaptations
and the parity flags (options that reproduce a reference quirk). The options' defaults are the C++
MethodConfig's (defaults(method)); check_options(method, **options) checks a set of options without q and k.

q and k must be finite. NaN or inf raises ValueError naming q or k (and the first such value) on the CPU; on
the GPU the generator records it on the device (no synchronization) and returns an empty mask carrying the
record: wavealign.plan(mask) adopts it (the plan raises at its first host access, sparse_attention with it
writes NaN), check(mask) raises it at once.

Adapters (so that a user of the original packages plugs in without conversion code):
    from_sparge(block_map, seq_len=L)        SpargeAttn's per-head block map (its mask_id), 64x128 or 128x64
    from_xattention(block_mask, seq_len=L)   XAttention's bool block mask [B, H, nq, nk] on 128-token blocks
    from_minference(vertical_indices, slash_indices, seq_len=L)   MInference's vertical/slash index lists
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from . import _core
from ._util import INT64_MAX, check_int, check_scale_value, host_array, invalid, is_torch_tensor, torch_or_none

__all__ = ["xattention", "sparge", "minference", "flexprefill", "from_sparge", "from_xattention", "from_minference",
           "defaults", "check_options", "check"]

METHODS = ("xattention", "sparge", "minference", "flexprefill")
_CACHE_SIZE = 8
_generators: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
_lock = threading.Lock()
# The attribute under which a mask made on the GPU keeps the record of its inputs' NaN and inf check.
_RECORD = "_wavealign_inputs_record"
# Given as q and k, the methods return their resolved options instead of a mask (check_options).
_RESOLVE_ONLY = object()


def defaults(method: str) -> dict[str, Any]:
    """Every option of `method` ("xattention", "sparge", "minference", "flexprefill") with its default, keyed by
    its keyword: the C++ MethodConfig's (wavealign/methods.h), from which the functions here take theirs. Per-head
    options are tuples; None means unset (scale: 1/sqrt(d); topk: TopCdf mode; max_budget: no bound)."""
    if method not in METHODS:
        raise invalid("method", f"unknown value {method!r} (expected one of: {', '.join(METHODS)})")
    return {name: tuple(value) if isinstance(value, list) else value
            for name, value in _core.method_defaults(method).items()}


_XATTENTION, _SPARGE, _MINFERENCE, _FLEXPREFILL = (defaults(method) for method in METHODS)


def xattention(q: Any, k: Any, *, threshold: float | Sequence[float] = _XATTENTION["threshold"],
               stride: int = _XATTENTION["stride"], block_size: int = _XATTENTION["block_size"],
               force_first_kblock: bool = _XATTENTION["force_first_kblock"],
               mask_padded_keys: bool = _XATTENTION["mask_padded_keys"],
               int8_estimate: bool = _XATTENTION["int8_estimate"],
               force_dense: bool = _XATTENTION["force_dense"], scale: float | None = _XATTENTION["scale"],
               preset: str = "default") -> Any:
    """XAttention: antidiagonal scores of stride x stride tiles, per-row cumulative threshold.

    Args (defaults: the C++ XAttentionOptions', see defaults("xattention")):
        threshold: tau, one value or one per head (of the flattened B*H); >= 1 keeps rows dense.
        stride: S (8 or 16 in the reference's video runs); must divide block_size.
        block_size: square block of the mask: 128 or 64 for the kernel.
        force_first_kblock: keep key block 0 in every row (the reference's side effect, on for parity).
        mask_padded_keys: False = the reference's non-causal padding (zero keys take part in the softmax).
        int8_estimate: score INT8 codes of Q and of K minus its mean (ours, parity off): on the GPU the fused
            sm_90 estimate at the INT8 rate; elsewhere the CPU reference; other GPUs refuse it.
        force_dense: every block kept, nothing scored (warm-up steps, dense layers).
        scale: softmax scale; None = 1/sqrt(d).
        preset: "default" or "table1" (docs/methods.md; it sets no XAttention option: the defaults stay).
    """
    _with_preset("xattention", preset, {})
    options = {"threshold": _per_head(threshold, "threshold"), "stride": check_int(stride, "stride"),
               "force_first_kblock": _flag(force_first_kblock, "force_first_kblock"),
               "mask_padded_keys": _flag(mask_padded_keys, "mask_padded_keys"),
               "int8_estimate": _flag(int8_estimate, "int8_estimate")}
    return _generate("xattention", q, k, options, block_size, force_dense, scale)


def sparge(q: Any, k: Any, *, simthreshd1: float | Sequence[float] | None = None,
           cdfthreshd: float | Sequence[float] | None = None, topk: float | Sequence[float] | None = _SPARGE["topk"],
           smooth_k: bool = _SPARGE["smooth_k"], attention_sink: bool = _SPARGE["attention_sink"],
           native_block: tuple[int, int] = _SPARGE["native_block"],
           nan_dense_partial_blocks: bool = _SPARGE["nan_dense_partial_blocks"],
           block_size: int = _SPARGE["block_size"], force_dense: bool = _SPARGE["force_dense"],
           scale: float | None = _SPARGE["scale"], preset: str = "default") -> Any:
    """SpargeAttn: mean-pooled Q/K, self-similarity filter, per-row TopCdf (or top-k) on its native blocks.

    Args (defaults: the C++ SpargeOptions', see defaults("sparge")):
        simthreshd1: theta (a block is similar iff its mean pairwise cosine > theta), scalar or per head;
            None = the preset's ("default": the C++ default; "table1": -1, the filter off).
        cdfthreshd: tau of TopCdf (the block that crosses tau excluded, at least one kept), scalar or per head;
            None = the preset's ("default": the C++ default; "table1": 0.96).
        topk: top-k mode instead: the kept fraction of key blocks per row, scalar or per head.
        smooth_k: subtract the sequence mean of K first.
        attention_sink: keep key block 0 in every row.
        native_block: (query, key) block the method works on: (64, 128) as on sm_90, or (128, 64); the map is
            then OR-reduced (or repeated) onto block_size.
        nan_dense_partial_blocks: parity: partial last blocks are non-similar (the reference's NaN).
        preset: "default" or "table1" (options calibrated to the paper's Table I densities on the synthetic
            workload at 401 frames; docs/methods.md); options given explicitly win.
    """
    chosen = _with_preset("sparge", preset, {"simthreshd1": simthreshd1, "cdfthreshd": cdfthreshd})
    options = {"simthreshd1": _per_head(chosen["simthreshd1"], "simthreshd1"),
               "cdfthreshd": _per_head(chosen["cdfthreshd"], "cdfthreshd"),
               "topk": None if topk is None else _per_head(topk, "topk"),
               "smooth_k": _flag(smooth_k, "smooth_k"), "attention_sink": _flag(attention_sink, "attention_sink"),
               "native_block": _pair(native_block, "native_block"),
               "nan_dense_partial_blocks": _flag(nan_dense_partial_blocks, "nan_dense_partial_blocks")}
    return _generate("sparge", q, k, options, block_size, force_dense, scale)


def minference(q: Any, k: Any, *, vertical_size: int | None = None, slash_size: int | None = None,
               sampled_queries: int = _MINFERENCE["sampled_queries"],
               query_sample: str = _MINFERENCE["query_sample"], two_sided: bool = _MINFERENCE["two_sided"],
               sink_tokens: int = _MINFERENCE["sink_tokens"], near_diagonals: int = _MINFERENCE["near_diagonals"],
               block_size: int = _MINFERENCE["block_size"], force_dense: bool = _MINFERENCE["force_dense"],
               scale: float | None = _MINFERENCE["scale"], preset: str = "default") -> Any:
    """MInference vertical-slash: top key columns and top diagonals of sampled queries' softmax.

    Args (defaults: the C++ MInferenceOptions', see defaults("minference")):
        vertical_size, slash_size: columns and diagonals kept (at least 30 and 50, as in the reference); None =
            the preset's ("default": the C++ defaults; "table1": 200 and 2000).
        sampled_queries: queries that score the keys; query_sample "strided" (spread over the video, the
            non-causal adaptation) or "last" (the causal reference's choice).
        two_sided: diagonals on both sides of the main one (video); False = below it only.
        sink_tokens, near_diagonals: first columns and diagonals |q - k| below this always kept.
        preset: "default" or "table1" (docs/methods.md); options given explicitly win.
    """
    chosen = _with_preset("minference", preset, {"vertical_size": vertical_size, "slash_size": slash_size})
    options = {"vertical_size": check_int(chosen["vertical_size"], "vertical_size"),
               "slash_size": check_int(chosen["slash_size"], "slash_size"),
               "sampled_queries": check_int(sampled_queries, "sampled_queries"),
               "query_sample": _text(query_sample, "query_sample"),
               "two_sided": _flag(two_sided, "two_sided"), "sink_tokens": check_int(sink_tokens, "sink_tokens"),
               "near_diagonals": check_int(near_diagonals, "near_diagonals")}
    return _generate("minference", q, k, options, block_size, force_dense, scale)


def flexprefill(q: Any, k: Any, *, gamma: float | None = None, tau: float = _FLEXPREFILL["tau"],
                min_budget: int = _FLEXPREFILL["min_budget"], max_budget: int | None = _FLEXPREFILL["max_budget"],
                representative_blocks: int = _FLEXPREFILL["representative_blocks"],
                query_sample: str = _FLEXPREFILL["query_sample"], two_sided: bool = _FLEXPREFILL["two_sided"],
                force_first_kblock: bool = _FLEXPREFILL["force_first_kblock"],
                js_nan_is_vertical_slash: bool = _FLEXPREFILL["js_nan_is_vertical_slash"],
                budget_block_128: bool = _FLEXPREFILL["budget_block_128"],
                block_size: int = _FLEXPREFILL["block_size"], force_dense: bool = _FLEXPREFILL["force_dense"],
                scale: float | None = _FLEXPREFILL["scale"], preset: str = "default") -> Any:
    """FlexPrefill: coverage budgets of vertical and slash blocks, or query-aware heads by JS distance.

    Args (defaults: the C++ FlexPrefillOptions', see defaults("flexprefill")):
        gamma: coverage in (0, 1]; None = the preset's ("default": the C++ default, the paper's video runs;
            "table1": 0.965).
        tau: JS distance below which a head is query-aware (0 = never).
        min_budget, max_budget: token bounds of both budgets (max None = no bound).
        representative_blocks, query_sample: the query blocks that score the keys ("strided" over the video,
            or the "last" ones as the causal reference).
        two_sided: diagonals on both sides of the main one.
        force_first_kblock: key block 0 is a forced vertical (the main diagonal always is).
        js_nan_is_vertical_slash, budget_block_128: parity with the reference's 0 log 0 = NaN and its
            hard-coded 128-token budget blocks.
        preset: "default" or "table1" (docs/methods.md); options given explicitly win.
    """
    chosen = _with_preset("flexprefill", preset, {"gamma": gamma})
    options = {"gamma": _number(chosen["gamma"], "gamma"), "tau": _number(tau, "tau"),
               "min_budget": check_int(min_budget, "min_budget", maximum=INT64_MAX),
               "max_budget": None if max_budget is None else check_int(max_budget, "max_budget", 1, INT64_MAX),
               "representative_blocks": check_int(representative_blocks, "representative_blocks"),
               "query_sample": _text(query_sample, "query_sample"),
               "two_sided": _flag(two_sided, "two_sided"),
               "force_first_kblock": _flag(force_first_kblock, "force_first_kblock"),
               "js_nan_is_vertical_slash": _flag(js_nan_is_vertical_slash, "js_nan_is_vertical_slash"),
               "budget_block_128": _flag(budget_block_128, "budget_block_128")}
    return _generate("flexprefill", q, k, options, block_size, force_dense, scale)


_FUNCTIONS = {"xattention": xattention, "sparge": sparge, "minference": minference, "flexprefill": flexprefill}


def check_options(method: str, **options: Any) -> None:
    """Checks the keyword arguments of `method` as it would be called, without q and k: ValueError naming the
    first option it refuses whatever q and k are (a stride that does not divide block_size, a threshold <= 0,
    an unknown preset, ...), TypeError for a keyword it does not take. For integrations that set a method up
    before they see Q and K (wavealign.diffusers.apply); the per-head options' counts need the heads."""
    if method not in _FUNCTIONS:
        raise invalid("method", f"unknown value {method!r} (expected one of: {', '.join(METHODS)})")
    _FUNCTIONS[method](_RESOLVE_ONLY, _RESOLVE_ONLY, **options)


def check(mask: Any) -> None:
    """Raises the ValueError of a mask made on the GPU from q or k that held NaN or inf ("invalid argument 'q'"
    or 'k', with the first such value; the mask itself is then empty). Reads the generator's record, so it waits
    for the generator's stream. Returns for a valid mask and for anything else (a CPU method refuses such inputs
    at once)."""
    record = pending_record(mask)
    if record is not None:
        message = _core.mask_error_message(record.cpu().numpy())
        if message is not None:
            raise ValueError(message)


def pending_record(mask: Any) -> Any:
    """The device record (int32 [10], first entry nonzero: q or k held NaN or inf) that a GPU generator wrote
    with `mask`, or None for a mask it did not make. A view or copy of the mask is a new tensor without it."""
    return getattr(mask, _RECORD, None) if is_torch_tensor(mask) else None


# ---- adapters --------------------------------------------------------------------------------------------

def from_sparge(block_map: Any, *, seq_len: int, native_block: tuple[int, int] = (64, 128),
                block_size: int = 128) -> Any:
    """SpargeAttn's per-head block map (its mask_id: bool/int [B, H, nq, nk] or [H, nq, nk], nonzero = kept,
    on native_block = (64, 128) as on sm_90 or (128, 64)) as a [B*H, MB, NB] mask on block_size blocks: a
    block is kept iff a kept native block overlaps it (OR-reduction; repetition to finer blocks)."""
    native = _pair(native_block, "native_block")
    block = check_int(block_size, "block_size", 1)
    tokens = check_int(seq_len, "seq_len", 1)
    return _on_host(block_map, "block_map",
                    lambda mask: _core.resample_block_mask(mask, *native, block, block, tokens, "block_map"))


def from_xattention(block_mask: Any, *, seq_len: int | None = None, block_size: int = 128) -> Any:
    """XAttention's bool block mask [B, H, nq, nk] (or [H, nq, nk]) on 128-token blocks, already sliced to
    the sequence, as a [B*H, MB, NB] mask; block_size 64 repeats each block (seq_len then required)."""
    block = check_int(block_size, "block_size", 1)
    shape = tuple(int(n) for n in getattr(block_mask, "shape", ()))
    if len(shape) not in (3, 4):
        raise invalid("block_mask", f"must be [B, H, nq, nk] or [H, nq, nk], got shape {list(shape)}")
    tokens = shape[-2] * 128 if seq_len is None else check_int(seq_len, "seq_len", 1)
    if seq_len is None and block != 128:
        raise invalid("seq_len", "is needed to resample XAttention's 128-token blocks to another block size")
    return _on_host(block_mask, "block_mask",
                    lambda mask: _core.resample_block_mask(mask, 128, 128, block, block, tokens, "block_mask"))


def from_minference(vertical_indices: Any, slash_indices: Any, *, seq_len: int, block_size: int = 128) -> Any:
    """MInference's vertical/slash index lists as a [B*H, MB, NB] mask: vertical_indices holds key positions
    ([B, H, v] or [B, H, 1, v], its vertical_topk), slash_indices offsets q - k ([B, H, s], its
    (q_len - 1) - topk indices; negative for the two-sided form). Block (I, J) is kept iff a listed column
    lies in key block J or a listed diagonal crosses the block."""
    tokens = check_int(seq_len, "seq_len", 1)
    block = check_int(block_size, "block_size", 1)
    vertical = _index_rows(vertical_indices, "vertical_indices")
    slash = _index_rows(slash_indices, "slash_indices")
    if vertical.shape[0] != slash.shape[0]:
        raise invalid("slash_indices", f"has {slash.shape[0]} heads, vertical_indices {vertical.shape[0]}")
    mask = _core.vertical_slash_mask(vertical.reshape(-1), slash.reshape(-1), vertical.shape[0], tokens, block)
    return _like(mask, vertical_indices)


# ---- shared steps ----------------------------------------------------------------------------------------

def _with_preset(method: str, preset: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The values of the preset-set options: the given ones (not None), else the preset's (from the C++ table),
    else the C++ defaults."""
    if not isinstance(preset, str):
        raise invalid("preset", f"must be a string (\"default\" or \"table1\"), got {type(preset).__name__}")
    method_defaults = defaults(method)
    chosen = {name: method_defaults[name] for name in given}
    for name, value in _core.method_preset_options(method, preset):
        chosen[name] = int(value) if isinstance(method_defaults[name], int) else value
    chosen.update({name: value for name, value in given.items() if value is not None})
    return chosen


def _generate(method: str, q: Any, k: Any, options: dict[str, Any], block_size: Any, force_dense: Any,
              scale: Any) -> Any:
    options = dict(options, block_size=check_int(block_size, "block_size"),
                   force_dense=_flag(force_dense, "force_dense"),
                   scale=None if scale is None else check_scale_value(scale))
    if q is _RESOLVE_ONLY:
        _core.method_check_options(method, options)
        return options
    shape = _check_shapes(q, k)
    batch, heads, length, head_dim = shape
    if is_torch_tensor(q) and q.device.type == "cuda":
        return _generate_on_gpu(method, q, k, options, shape)
    q_host = _float32_heads(q, "q", shape)
    k_host = _float32_heads(k, "k", shape)
    mask = _core.method_reference_mask(method, options, q_host, k_host)
    return _like(mask, q)


def _generate_on_gpu(method: str, q: Any, k: Any, options: dict[str, Any], shape: tuple[int, int, int, int]) -> Any:
    torch = torch_or_none()
    if not getattr(_core, "has_mask_generators", False):
        raise invalid("q", "is a CUDA tensor, but this wavealign build has no GPU generators (built without CUDA)")
    if not is_torch_tensor(k) or k.device != q.device:
        raise invalid("k", f"must be a tensor on q's device {q.device}")
    names = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
    for tensor, name in ((q, "q"), (k, "k")):
        if tensor.dtype not in names:
            raise invalid(name, f"has dtype {tensor.dtype}; the GPU generators take bfloat16 or float16 "
                                f"(convert with .to(torch.bfloat16))")
        if tensor.stride(-1) != 1:
            raise invalid(name, "must be contiguous in its last dimension (head_dim)")
    if k.dtype != q.dtype:
        raise invalid("k", f"has dtype {k.dtype}, q has {q.dtype}")
    batch, heads, length, head_dim = shape
    generator, workspace = _generator(torch, q.device, method, options, shape)
    blocks = generator.q_blocks
    mask = torch.empty((batch * heads, blocks, blocks), dtype=torch.bool, device=q.device)
    record = torch.empty(_core.mask_error_bytes, dtype=torch.uint8, device=q.device)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    generator.run(q.data_ptr(), k.data_ptr(), names[q.dtype], _strides(q), _strides(k), mask.data_ptr(),
                  record.data_ptr(), workspace.data_ptr(), workspace.numel(), stream, batch, heads, length, head_dim)
    # The NaN and inf check's record stays on the device (no synchronization): a plan of the mask adopts it,
    # check(mask) reads it.
    setattr(mask, _RECORD, record.view(torch.int32))
    return mask


def _generator(torch: Any, device: Any, method: str, options: dict[str, Any],
               shape: tuple[int, ...]) -> tuple[Any, Any]:
    """(generator, workspace) of this device, method, options and shape, made on first use (at most
    _CACHE_SIZE kept, oldest out first)."""
    key = (device.index, method, *shape, tuple(sorted((name, _frozen(value)) for name, value in options.items())))
    with _lock:
        entry = _generators.get(key)
        if entry is not None:
            _generators.move_to_end(key)
            return entry
        generator = _core.MaskGenerator(method, options, *shape)
        workspace = torch.empty(max(1, generator.workspace_bytes()), dtype=torch.uint8, device=device)
        _generators[key] = (generator, workspace)
        while len(_generators) > _CACHE_SIZE:
            _generators.popitem(last=False)
        return generator, workspace


def clear_cache() -> None:
    """Drops the cached GPU generators and their workspaces."""
    with _lock:
        _generators.clear()


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _strides(tensor: Any) -> tuple[int, int, int]:
    """(batch, head, token) strides in elements of a [B, H, L, d] or [H, L, d] tensor (batch 0 for 3-D)."""
    if tensor.dim() == 3:
        return (tensor.shape[0] * tensor.stride(0), tensor.stride(0), tensor.stride(1))
    return (tensor.stride(0), tensor.stride(1), tensor.stride(2))


def _check_shapes(q: Any, k: Any) -> tuple[int, int, int, int]:
    """(B, H, L, d) of q and k, which must share one shape."""
    q_shape = tuple(int(n) for n in getattr(q, "shape", ()))
    k_shape = tuple(int(n) for n in getattr(k, "shape", ()))
    if len(q_shape) not in (3, 4):
        raise invalid("q", f"must be [B, H, L, d] or [H, L, d], got shape {list(q_shape)}")
    if k_shape != q_shape:
        raise invalid("k", f"has shape {list(k_shape)}, expected q's shape {list(q_shape)}")
    batch, heads, length, head_dim = (1, *q_shape) if len(q_shape) == 3 else q_shape
    if min(batch, heads, length, head_dim) < 1:
        raise invalid("q", f"has an empty dimension: {list(q_shape)}")
    return batch, heads, length, head_dim


def _float32_heads(x: Any, argument: str, shape: tuple[int, int, int, int]) -> np.ndarray:
    """x as a C-contiguous float32 [B*H, L, d] host array (a copy unless it already is one)."""
    if is_torch_tensor(x):
        torch = torch_or_none()
        x = x.detach().to(device="cpu", dtype=torch.float32)
    array = host_array(x, argument)
    if not np.issubdtype(array.dtype, np.floating):
        raise invalid(argument, f"has dtype {array.dtype}, expected a floating-point dtype")
    batch, heads, length, head_dim = shape
    return np.ascontiguousarray(array.reshape(batch * heads, length, head_dim), dtype=np.float32)


def _like(mask: np.ndarray, source: Any) -> Any:
    """The numpy mask in source's framework and device (torch in, torch out on the same device)."""
    if is_torch_tensor(source):
        torch = torch_or_none()
        return torch.from_numpy(mask).to(source.device)
    return mask


def _on_host(mask: Any, argument: str, convert: Any) -> Any:
    """convert(bool [B*H, A, B] host mask) in the framework and device of `mask` (a CUDA tensor is copied to the
    host and back: this adapter synchronizes)."""
    array = host_array(mask, argument)
    if array.ndim not in (3, 4):
        raise invalid(argument, f"must be [B, H, nq, nk] or [H, nq, nk], got shape {list(array.shape)}")
    if not (array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer)):
        raise invalid(argument, f"has dtype {array.dtype}, expected bool or an integer dtype (nonzero = kept)")
    folded = np.ascontiguousarray(array.reshape(-1, *array.shape[-2:]) != 0)
    return _like(convert(folded), mask)


def _index_rows(indices: Any, argument: str) -> np.ndarray:
    """int64 [B*H, n] from [B, H, n], [B, H, 1, n] or [H, n] index lists."""
    array = host_array(indices, argument)
    if not np.issubdtype(array.dtype, np.integer):
        raise invalid(argument, f"has dtype {array.dtype}, expected an integer dtype")
    if array.ndim == 4 and array.shape[2] == 1:
        array = array[:, :, 0, :]
    if array.ndim not in (2, 3):
        raise invalid(argument, f"must be [B, H, n], [B, H, 1, n] or [H, n], got shape {list(array.shape)}")
    return np.ascontiguousarray(array.reshape(-1, array.shape[-1]), dtype=np.int64)


def _per_head(value: Any, argument: str) -> list[float]:
    values = [value] if isinstance(value, (int, float, np.floating, np.integer)) else value
    try:
        result = [float(v) for v in values]
    except (TypeError, ValueError) as error:
        raise invalid(argument, f"must be a number or a sequence of numbers (one per head), got {value!r}") from error
    if any(isinstance(v, bool) for v in values) or not result:
        raise invalid(argument, f"must be a number or a non-empty sequence of numbers, got {value!r}")
    return result


def _number(value: Any, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise invalid(argument, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise invalid(argument, f"must be finite, got {value}")
    return float(value)


def _flag(value: Any, argument: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(argument, f"must be a bool, got {type(value).__name__}")
    return bool(value)


def _pair(value: Any, argument: str) -> tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise invalid(argument, f"must be a (query, key) pair of block sizes, got {value!r}")
    return check_int(value[0], argument, 1), check_int(value[1], argument, 1)


def _text(value: Any, argument: str) -> str:
    if not isinstance(value, str):
        raise invalid(argument, f"must be a string, got {type(value).__name__}")
    return value
