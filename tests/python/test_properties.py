"""Property-based tests of the Python entry points (hypothesis): random shapes, dtypes, layouts and corrupt masks.

Every call either raises ValueError/TypeError whose message names the argument ("invalid argument '<name>'"),
or returns what the reference gives:
- plans: each head's permutation is a bijection with its inverse, the schedule and the permuted mask follow it,
  and the dense, CSR and FlexAttention forms of one mask give the same plan;
- sparse_attention (CPU): a float64 dense softmax over the expanded token mask, within atol 2e-5 / rtol 1e-4
  for float32/float64 inputs and one unit of the output dtype's rounding (eps, relative and absolute) for
  float16/bfloat16; LSE within 1e-4; empty rows exactly O = 0 and LSE = -inf; the output bit for bit the same
  in every row order, head order and traversal;
- permute_rows / unpermute_rows and their torch ops: an independent gather of the query blocks, and exact
  round trips.

Examples are derandomized (the conftest's hypothesis profile) and bounded so the file runs in well under a
minute on two cores.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed: the property tests are skipped")
torch = pytest.importorskip("torch", reason="PyTorch is not installed: the property tests are skipped")

from hypothesis import given, settings, strategies as st  # noqa: E402
from torch.nn.attention.flex_attention import BlockMask  # noqa: E402

import wavealign  # noqa: E402
from bad_inputs import recorded_call, replay, schedule_argument  # noqa: E402
from wa_testing import csr_of, dense_attention, expand_mask, flex_of  # noqa: E402

wavealign.ops.register()
EXAMPLES = settings(max_examples=40)
FEW = settings(max_examples=25)
ORDERS = ("wavealign", "s1", "s2", "original", "shuffled")


def names(argument: str) -> str:
    return f"invalid argument '{argument}'"


def assert_refused(call, *arguments: str) -> None:
    """call() raises ValueError/TypeError whose message names one of `arguments`."""
    with pytest.raises((ValueError, TypeError)) as raised:
        call()
    message = str(raised.value)
    assert any(names(argument) in message for argument in arguments), \
        f"{type(raised.value).__name__}: {message!r} names none of {arguments}"


# ---- strategies ---------------------------------------------------------------------------------------------

@st.composite
def block_masks(draw, max_heads=3, max_blocks=7, q_blocks=None, kv_blocks=None):
    """bool [H, MB, NB], empty rows and columns allowed."""
    heads = draw(st.integers(1, max_heads))
    q_blocks = q_blocks or draw(st.integers(1, max_blocks))
    kv_blocks = kv_blocks or draw(st.integers(1, max_blocks))
    density = draw(st.sampled_from([0.0, 0.15, 0.4, 0.8, 1.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).random((heads, q_blocks, kv_blocks)) < density


def numpy_layout(draw, array: np.ndarray) -> np.ndarray:
    """The same values as `array`, in a drawn memory layout: C order, Fortran order, a transposed buffer,
    every other element of a larger buffer, or negative strides."""
    layout = draw(st.sampled_from(["c", "fortran", "transposed", "strided", "reversed"]))
    if layout == "fortran":
        return np.asfortranarray(array)
    if layout == "transposed" and array.ndim >= 2:
        return np.ascontiguousarray(np.swapaxes(array, -1, -2)).swapaxes(-1, -2)
    if layout == "strided":
        wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), array.dtype)
        wide[..., ::2] = array
        return wide[..., ::2]
    if layout == "reversed":
        return np.ascontiguousarray(array[..., ::-1])[..., ::-1]
    return np.ascontiguousarray(array)


def torch_layout(draw, array: np.ndarray, dtype=None):
    """A torch CPU tensor of `array`, contiguous, a transposed view, or a strided slice."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if dtype is not None:
        tensor = tensor.to(dtype)
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    if layout == "transposed" and tensor.dim() >= 2:
        return tensor.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided":
        wide = torch.zeros(*tensor.shape[:-1], 2 * tensor.shape[-1], dtype=tensor.dtype)
        wide[..., ::2] = tensor
        return wide[..., ::2]
    return tensor


def framework_array(draw, array: np.ndarray):
    return numpy_layout(draw, array) if draw(st.booleans()) else torch_layout(draw, array)


def dense_input(draw, mask: np.ndarray):
    dtype = draw(st.sampled_from([np.bool_, np.uint8]))
    value = mask.astype(dtype)
    if dtype == np.uint8:  # any nonzero byte means "kept"
        value = value * np.uint8(draw(st.sampled_from([1, 7, 255])))
    value = value[0] if mask.shape[0] == 1 and draw(st.booleans()) else value
    return framework_array(draw, value)


def csr_input(draw, mask: np.ndarray):
    row_ptr, col_idx = csr_of(mask)
    row_ptr = row_ptr.astype(draw(st.sampled_from([np.int64, np.int32])))
    col_idx = col_idx.astype(draw(st.sampled_from([np.int32, np.int64])))
    return framework_array(draw, row_ptr), framework_array(draw, col_idx)


class FlexArrays:
    """A duck-typed FlexAttention BlockMask (the attributes wavealign.plan reads) over any arrays."""

    def __init__(self, counts, indices, full_counts=None, full_indices=None, block=16, seq_lengths=None):
        self.kv_num_blocks, self.kv_indices = counts, indices
        self.full_kv_num_blocks, self.full_kv_indices = full_counts, full_indices
        self.BLOCK_SIZE = (block, block)
        self.seq_lengths = seq_lengths


def flex_parts(draw, mask: np.ndarray, garbage: bool):
    """(counts, indices, full_counts, full_indices) numpy [1, H, MB(, NB)]: the kept blocks split at random
    into partial and full blocks (full pair None when not split); with `garbage`, entries past each count
    hold arbitrary values (the format leaves them undefined)."""
    full = np.zeros_like(mask)
    if draw(st.booleans()):
        full = mask & (np.random.default_rng(draw(st.integers(0, 2**16))).random(mask.shape) < 0.5)
    partial = mask & ~full
    counts, indices = flex_of(partial)
    if garbage:
        values = np.random.default_rng(draw(st.integers(0, 2**16))).integers(-5, 10**6, indices.shape)
        beyond = np.arange(indices.shape[-1]) >= counts[..., None]
        indices = np.where(beyond, values, indices).astype(np.int32)
    if not full.any() and draw(st.booleans()):
        return counts, indices, None, None
    full_counts, full_indices = flex_of(full)
    return counts, indices, full_counts, full_indices


def flex_input(draw, mask: np.ndarray, block: int = 16):
    """A real FlexAttention BlockMask of the mask, or a duck-typed one over numpy/torch arrays."""
    heads, q_blocks, kv_blocks = mask.shape
    real = draw(st.booleans())
    counts, indices, full_counts, full_indices = flex_parts(draw, mask, garbage=not real)
    seq_lengths = (q_blocks * block, kv_blocks * block)
    if real:
        tensors = [None if a is None else torch.from_numpy(a) for a in (counts, indices, full_counts, full_indices)]
        return BlockMask.from_kv_blocks(tensors[0], tensors[1], tensors[2], tensors[3], BLOCK_SIZE=block,
                                        seq_lengths=seq_lengths)
    return FlexArrays(*(None if a is None else framework_array(draw, a)
                        for a in (counts, indices, full_counts, full_indices)), block=block, seq_lengths=seq_lengths)


def host(value) -> np.ndarray:
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def bits(value) -> np.ndarray:
    """The bytes of an array or tensor (bit-for-bit comparisons, bfloat16 included)."""
    if isinstance(value, torch.Tensor):
        return value.contiguous().view(torch.uint8).numpy()
    return np.ascontiguousarray(value).view(np.uint8)


# ---- plans --------------------------------------------------------------------------------------------------

def check_plan(plan, mask: np.ndarray) -> None:
    """The plan's arrays agree with each other and with the mask."""
    heads, q_blocks, _ = mask.shape
    permutation, inverse = host(plan.permutation), host(plan.inverse)
    assert permutation.shape == inverse.shape == (heads, q_blocks)
    for h in range(heads):
        assert sorted(permutation[h]) == list(range(q_blocks))
        assert (inverse[h][permutation[h]] == np.arange(q_blocks)).all()
    if plan.order == "original" or all(plan.skipped):
        assert (permutation == np.arange(q_blocks)).all()
    schedule = host(plan.schedule())
    expected = np.stack([np.repeat(np.arange(heads), q_blocks), permutation.reshape(-1)], axis=1)
    assert (schedule == expected).all()
    row_ptr, col_idx = (host(x) for x in plan.csr())
    assert (row_ptr == csr_of(mask)[0]).all() and (col_idx == csr_of(mask)[1]).all()


@EXAMPLES
@given(st.data())
def test_dense_csr_and_flex_inputs_give_one_valid_plan(data):
    draw = data.draw
    mask = draw(block_masks())
    heads, _, kv_blocks = mask.shape
    options = {"order": draw(st.sampled_from(ORDERS)), "skip": draw(st.sampled_from(["never", "always"])),
               "wave_size": draw(st.integers(1, 5)), "seed": draw(st.integers(0, 2**32)),
               "iterations": draw(st.integers(1, 12)), "block_size": 16}
    dense = wavealign.plan(dense_input(draw, mask), **options)
    check_plan(dense, mask)
    csr = wavealign.plan(csr_input(draw, mask), heads=heads, kv_blocks=kv_blocks, **options)
    flex = wavealign.plan(flex_input(draw, mask), **options)
    for other in (csr, flex):
        check_plan(other, mask)
        assert (host(other.permutation) == host(dense.permutation)).all()
    permuted = host(dense.permuted_mask()).astype(bool).reshape(mask.shape)
    for h in range(heads):
        assert (permuted[h] == mask[h][host(dense.permutation)[h]]).all()


CSR_CORRUPTIONS = {
    # corruption: the arguments an error may name
    "column past the end": ("col_idx",), "negative column": ("col_idx",), "column beyond int32": ("col_idx",),
    "repeated column": ("col_idx",), "descending columns": ("col_idx",), "decreasing row_ptr": ("row_ptr",),
    "row_ptr not starting at 0": ("row_ptr",), "row_ptr not ending at nnz": ("row_ptr", "col_idx"),
    "row_ptr of another head count": ("row_ptr",), "float row_ptr": ("row_ptr",), "int16 row_ptr": ("row_ptr",),
    "2-D row_ptr": ("row_ptr",), "float col_idx": ("col_idx",), "uint32 col_idx": ("col_idx",),
    "bool col_idx": ("col_idx",), "kv_blocks 0": ("kv_blocks",), "negative heads": ("heads",),
    "missing kv_blocks": ("kv_blocks",), "three arrays": ("block_mask",), "float kv_blocks": ("kv_blocks",),
}


def corrupt_csr(draw, mask: np.ndarray, corruption: str):
    """(block_mask, heads, kv_blocks) of the mask's CSR with one corruption."""
    heads, _, kv_blocks = mask.shape
    row_ptr, col_idx = csr_of(mask)
    rows_with = np.flatnonzero(np.diff(row_ptr) >= 1)
    rows_with_two = np.flatnonzero(np.diff(row_ptr) >= 2)
    if corruption in ("column past the end", "negative column", "column beyond int32") and len(col_idx):
        entry = draw(st.integers(0, len(col_idx) - 1))
        if corruption == "column beyond int32":
            col_idx = col_idx.astype(np.int64)
            col_idx[entry] = draw(st.integers(2**31, 2**62))
        else:
            col_idx[entry] = (draw(st.integers(kv_blocks, 2**31 - 1)) if corruption == "column past the end"
                              else draw(st.integers(-2**31, -1)))
    elif corruption == "repeated column" and len(rows_with):
        row = draw(st.sampled_from(list(rows_with)))
        col_idx = np.insert(col_idx, row_ptr[row], col_idx[row_ptr[row]])
        row_ptr = row_ptr.copy()
        row_ptr[row + 1:] += 1
    elif corruption == "descending columns" and len(rows_with_two):
        row = draw(st.sampled_from(list(rows_with_two)))
        col_idx[row_ptr[row]:row_ptr[row + 1]] = col_idx[row_ptr[row]:row_ptr[row + 1]][::-1].copy()
    elif corruption == "decreasing row_ptr" and len(row_ptr) > 2:
        index = draw(st.integers(1, len(row_ptr) - 2))
        row_ptr[index] = row_ptr[index + 1] + draw(st.integers(1, 3))
    elif corruption == "row_ptr not starting at 0":
        row_ptr = row_ptr + draw(st.integers(1, 3))
    elif corruption == "row_ptr not ending at nnz":
        col_idx = np.append(col_idx, np.int32(0))
    elif corruption == "row_ptr of another head count":
        heads = heads + draw(st.integers(1, 3))
    elif corruption in ("float row_ptr", "int16 row_ptr"):
        row_ptr = row_ptr.astype(np.float64 if corruption == "float row_ptr" else np.int16)
    elif corruption == "2-D row_ptr":
        row_ptr = row_ptr[None]
    elif corruption in ("float col_idx", "uint32 col_idx", "bool col_idx"):
        col_idx = col_idx.astype({"float col_idx": np.float32, "uint32 col_idx": np.uint32,
                                  "bool col_idx": np.bool_}[corruption])
    elif corruption == "kv_blocks 0":
        kv_blocks = 0
    elif corruption == "negative heads":
        heads = -heads
    elif corruption == "missing kv_blocks":
        kv_blocks = None
    elif corruption == "three arrays":
        return (row_ptr, col_idx, col_idx), heads, kv_blocks
    elif corruption == "float kv_blocks":
        kv_blocks = kv_blocks + 0.5
    else:
        return None  # the mask has no row this corruption applies to
    return (framework_array(draw, row_ptr), framework_array(draw, col_idx)), heads, kv_blocks


@EXAMPLES
@given(st.data())
def test_corrupt_csr_masks_are_refused_naming_the_array(data):
    draw = data.draw
    corruption = draw(st.sampled_from(sorted(CSR_CORRUPTIONS)))
    mask = draw(block_masks(max_blocks=6))
    corrupted = corrupt_csr(draw, mask, corruption)
    hypothesis.assume(corrupted is not None)
    block_mask, heads, kv_blocks = corrupted
    assert_refused(lambda: wavealign.plan(block_mask, heads=heads, kv_blocks=kv_blocks, skip="never"),
                   *CSR_CORRUPTIONS[corruption])


FLEX_CORRUPTIONS = {
    "count above the width": ("kv_num_blocks",), "negative count": ("kv_num_blocks",),
    "index past the end": ("kv_indices",), "negative index": ("kv_indices",), "int64 indices": ("kv_indices",),
    "float counts": ("kv_num_blocks",), "counts without batch": ("kv_num_blocks",),
    "full counts without indices": ("full_kv_indices", "full_kv_num_blocks"),
    "full index past the end": ("full_kv_indices",), "indices of other rows": ("kv_indices",),
}
# A FlexAttention mask that lists a block twice (in one pair, or in both the partial and the full pair) is
# refused by the C++ ingest (BlockMask::from_flex) but accepted by the Python binding's own copy of it.
FLEX_DUPLICATES = {"block twice in a row": ("kv_indices",),
                   "block partial and full": ("kv_indices", "full_kv_indices")}


def corrupt_flex(draw, mask: np.ndarray, corruption: str):
    counts, indices = flex_of(mask)
    full_counts = full_indices = None
    kv_blocks = mask.shape[2]
    rows = np.argwhere(counts >= 1)
    if corruption == "count above the width":
        counts[0, 0, 0] = kv_blocks + draw(st.integers(1, 2**30))
    elif corruption == "negative count":
        counts[0, 0, draw(st.integers(0, counts.shape[2] - 1))] = draw(st.integers(-2**31, -1))
    elif corruption in ("index past the end", "negative index") and len(rows):
        row = tuple(rows[draw(st.integers(0, len(rows) - 1))])
        indices[row + (0,)] = (draw(st.integers(kv_blocks, 2**31 - 1)) if corruption == "index past the end"
                               else draw(st.integers(-2**31, -1)))
    elif corruption == "int64 indices":
        indices = indices.astype(np.int64)
    elif corruption == "float counts":
        counts = counts.astype(np.float32)
    elif corruption == "counts without batch":
        counts = counts[0]
    elif corruption == "full counts without indices":
        full_counts = counts
    elif corruption == "full index past the end":
        full_counts, full_indices = np.ones_like(counts), np.full_like(indices, kv_blocks)
        counts = np.zeros_like(counts)
    elif corruption == "indices of other rows":
        indices = indices[:, :, :-1] if mask.shape[1] > 1 else indices[:, :, :0]
    elif corruption == "block twice in a row" and len(rows) and kv_blocks >= 2:
        row = tuple(rows[draw(st.integers(0, len(rows) - 1))])
        counts[row] = max(counts[row], 2) if counts[row] < kv_blocks else counts[row]
        indices[row + (1,)] = indices[row + (0,)]
    elif corruption == "block partial and full" and len(rows):
        full_counts, full_indices = counts.copy(), indices.copy()
    else:
        return None
    return FlexArrays(*(None if a is None else framework_array(draw, a)
                        for a in (counts, indices, full_counts, full_indices)),
                      seq_lengths=(mask.shape[1] * 16, kv_blocks * 16))


def check_corrupt_flex(data, corruptions: dict) -> None:
    draw = data.draw
    corruption = draw(st.sampled_from(sorted(corruptions)))
    mask = draw(block_masks(max_blocks=6))
    flex = corrupt_flex(draw, mask, corruption)
    hypothesis.assume(flex is not None)
    assert_refused(lambda: wavealign.plan(flex, skip="never"), *corruptions[corruption])


@EXAMPLES
@given(st.data())
def test_corrupt_flex_masks_are_refused_naming_the_array(data):
    check_corrupt_flex(data, FLEX_CORRUPTIONS)


@FEW
@given(st.data())
def test_flex_masks_listing_a_block_twice_are_refused(data):
    check_corrupt_flex(data, FLEX_DUPLICATES)


# ---- sparse_attention on the CPU ----------------------------------------------------------------------------

BLOCKS = [(4, 4), (8, 8), (4, 8), (8, 4), (16, 16), (3, 5)]


@st.composite
def attention_cases(draw):
    """(q, k, v as numpy float64 [B, H, L, d], mask [mask heads, MB, NB], block size, batch shape)."""
    q_block, kv_block = draw(st.sampled_from(BLOCKS))
    length = draw(st.integers(1, 40))
    q_blocks, kv_blocks = -(-length // q_block), -(-length // kv_block)
    batch = draw(st.sampled_from([None, 1, 2]))
    heads = draw(st.integers(1, 3))
    per_entry = batch is not None and draw(st.booleans())
    mask_heads = heads * (batch if per_entry else 1)
    mask = np.concatenate([draw(block_masks(max_heads=1, q_blocks=q_blocks, kv_blocks=kv_blocks))
                           for _ in range(mask_heads)])
    head_dim = draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    qkv = rng.standard_normal((3, batch or 1, heads, length, head_dim)) * draw(st.sampled_from([0.5, 1.0, 2.0]))
    return qkv, mask, (q_block, kv_block), batch


def reference_attention(qkv: np.ndarray, mask: np.ndarray, block: tuple[int, int], scale: float):
    q, k, v = qkv
    batch, heads, length, _ = q.shape
    tokens = expand_mask(mask, length, *block)
    tokens = tokens.reshape(-1 if mask.shape[0] == batch * heads and batch > 1 else 1, heads, length, length)
    return dense_attention(q, k, v, tokens, scale)


def operand(draw, array: np.ndarray, kind: str, dtype):
    """One attention operand in a drawn framework, dtype and layout."""
    if kind == "numpy":
        return numpy_layout(draw, array.astype(dtype))
    return torch_layout(draw, array, dtype)


DTYPES = {"numpy": [np.float32, np.float64, np.float16],
          "torch": [torch.float32, torch.float64, torch.bfloat16, torch.float16]}


@EXAMPLES
@given(attention_cases(), st.data())
def test_cpu_attention_equals_the_dense_softmax_in_every_order(case, data):
    draw = data.draw
    qkv, mask, block, batch = case
    kind = draw(st.sampled_from(["numpy", "torch"]))
    dtype = draw(st.sampled_from(DTYPES[kind]))
    scale = draw(st.one_of(st.none(), st.floats(0.05, 1.0)))
    operands = [operand(draw, x if batch else x[0], kind, dtype) for x in qkv]
    # The reference sees the operands as rounded to their dtype.
    rounded = np.stack([host(x.float() if kind == "torch" else x).astype(np.float64).reshape(qkv.shape[1:])
                        for x in operands])
    head_dim = qkv.shape[-1]
    o_ref, lse_ref = reference_attention(rounded, mask, block, 1 / math.sqrt(head_dim) if scale is None else scale)
    outputs = []
    for order in (draw(st.sampled_from(ORDERS)), "original"):
        plan = wavealign.plan(mask, order=order, skip="never", block_size=block, wave_size=draw(st.integers(1, 4)))
        o, lse = wavealign.sparse_attention(*operands, plan, scale=scale, return_lse=True,
                                            head_order=draw(st.sampled_from(["sequential", "concurrent-heads"])),
                                            traversal=draw(st.sampled_from(["ascending", "sawtooth"])))
        outputs.append((o, lse))
    (o, lse), (o_original, lse_original) = outputs
    assert o.shape == operands[0].shape and o.dtype == operands[0].dtype
    o64 = host(o.float() if kind == "torch" else o).astype(np.float64).reshape(o_ref.shape)
    lse64 = host(lse).astype(np.float64).reshape(lse_ref.shape)
    assert not np.isnan(o64).any() and not np.isnan(lse64).any()
    empty = np.isneginf(lse_ref)
    assert (np.isneginf(lse64) == empty).all() and (o64[empty] == 0).all()
    eps = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, np.float16: 2.0**-11}.get(dtype, 0.0)
    np.testing.assert_allclose(o64, o_ref, atol=max(2e-5, eps), rtol=max(1e-4, eps))
    np.testing.assert_allclose(lse64[~empty], lse_ref[~empty], atol=1e-4, rtol=1e-5)
    # Every row's arithmetic depends on that row only: the row order changes no bit.
    assert np.array_equal(bits(o), bits(o_original)) and np.array_equal(bits(lse), bits(lse_original))


ATTENTION_CORRUPTIONS = {
    "scale nan": ("scale",), "scale inf": ("scale",), "scale negative": ("scale",), "scale zero": ("scale",),
    "scale text": ("scale",), "scale bool": ("scale",), "integer q": ("q",), "complex q": ("q",),
    "k shorter": ("k",), "v with other heads": ("v",), "q of another length": ("q",), "2-D q": ("q",),
    "zero head_dim": ("q",), "unknown traversal": ("traversal",), "unknown head_order": ("head_order",),
    "unknown kernel": ("kernel",), "not a plan": ("plan",), "heads not the plan's": ("q",),
    "numpy k with torch q": ("k",), "k of another dtype": ("k",),
}


@EXAMPLES
@given(attention_cases(), st.data())
def test_bad_attention_arguments_are_refused_naming_them(case, data):
    draw = data.draw
    qkv, mask, block, batch = case
    corruption = draw(st.sampled_from(sorted(ATTENTION_CORRUPTIONS)))
    kind = "torch" if corruption in ("numpy k with torch q", "k of another dtype") else \
        draw(st.sampled_from(["numpy", "torch"]))
    q, k, v = (operand(draw, x if batch else x[0], kind, np.float32 if kind == "numpy" else torch.float32)
               for x in qkv)
    plan = wavealign.plan(mask, skip="never", block_size=block)
    options = {}
    scales = {"scale nan": math.nan, "scale inf": math.inf, "scale negative": -draw(st.floats(1e-6, 10)),
              "scale zero": 0.0, "scale text": "0.1", "scale bool": True}
    if corruption in scales:
        options["scale"] = scales[corruption]
    elif corruption in ("integer q", "complex q"):
        q = (q.numpy() if kind == "torch" else q).astype(np.int32 if corruption == "integer q" else np.complex64)
        k, v = host(k), host(v)
    elif corruption == "k shorter":
        k = k[..., :-1, :] if k.shape[-2] > 1 else k[..., :0, :]
    elif corruption == "v with other heads":
        v = v[..., :1, :, :] if v.shape[-3] > 1 else (np.concatenate([v, v], -3) if kind == "numpy"
                                                        else torch.cat([v, v], -3))
    elif corruption == "q of another length":
        extra = np.zeros(q.shape[:-2] + (block[0] * draw(st.integers(1, 3)), q.shape[-1]), np.float32)
        q, k, v = (np.concatenate([host(x), extra], -2) for x in (q, k, v))
    elif corruption == "2-D q":
        q = q[(0,) * (q.ndim - 2)]
    elif corruption == "zero head_dim":
        q, k, v = (x[..., :0] for x in (q, k, v))
    elif corruption in ("unknown traversal", "unknown head_order", "unknown kernel"):
        options[corruption.split()[1]] = draw(st.sampled_from(["", "zigzag", "SEQUENTIAL", "sm70", 3]))
    elif corruption == "not a plan":
        plan = draw(st.sampled_from([None, "plan", mask]))
    elif corruption == "heads not the plan's":
        q, k, v = (np.concatenate([host(x), host(x)[..., :1, :, :]], -3) for x in (q, k, v))
        entries = q.shape[0] if q.ndim == 4 else 1
        hypothesis.assume(plan.heads not in (q.shape[-3], entries * q.shape[-3]))
    elif corruption == "numpy k with torch q":
        k = k.numpy()
    elif corruption == "k of another dtype":
        k = k.to(torch.float64)
    assert_refused(lambda: wavealign.sparse_attention(q, k, v, plan, **options), *ATTENTION_CORRUPTIONS[corruption])


# ---- the plug-in path: permute_rows / unpermute_rows and their torch ops ------------------------------------

def gather_blocks(x: np.ndarray, order: np.ndarray, block: int, heads_axis: int | None) -> np.ndarray:
    """Reference of permute_rows: x [..., L, d] zero-padded to MB*block tokens, query blocks taken in `order`
    [H, MB] (the heads along axis `heads_axis` of the leading dimensions; None = one head for all)."""
    q_blocks = order.shape[1]
    padded = np.zeros(x.shape[:-2] + (q_blocks * block, x.shape[-1]), x.dtype)
    padded[..., :x.shape[-2], :] = x
    blocks = padded.reshape(x.shape[:-2] + (q_blocks, block, x.shape[-1]))
    out = np.empty_like(blocks)
    lead = x.shape[:-2]
    for index in np.ndindex(*lead):
        h = 0 if heads_axis is None else index[heads_axis]
        out[index] = blocks[index][order[h]]
    return out.reshape(padded.shape)


@EXAMPLES
@given(st.data())
def test_permute_rows_gathers_query_blocks_and_round_trips_exactly(data):
    draw = data.draw
    block = draw(st.integers(1, 9))
    length = draw(st.integers(1, 40))
    q_blocks = -(-length // block)
    mask = draw(block_masks(q_blocks=q_blocks, kv_blocks=draw(st.integers(1, 5))))
    heads = mask.shape[0]
    plan = wavealign.plan(mask, order=draw(st.sampled_from(ORDERS)), skip="never", wave_size=2, block_size=block)
    batch = draw(st.sampled_from([(), (1,), (2,), (2, 1)]))
    lead = batch + ((heads,) if heads > 1 or draw(st.booleans()) else ())
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int64, np.float64]))
    x = np.random.default_rng(draw(st.integers(0, 2**32))).integers(-1000, 1000, lead + (length, 3)).astype(dtype)
    expected = gather_blocks(x, host(plan.permutation), block, len(lead) - 1 if heads > 1 else None)
    value = framework_array(draw, x)
    permuted = plan.permute_rows(value)
    assert type(permuted) is type(value)
    assert np.array_equal(host(permuted), expected)
    back = plan.unpermute_rows(permuted, seq_len=length)
    assert np.array_equal(host(back), x)
    padded = plan.unpermute_rows(permuted)
    assert np.array_equal(host(padded)[..., :length, :], x) and (host(padded)[..., length:, :] == 0).all()
    if isinstance(value, torch.Tensor):  # the op the entry point called gives the same when called directly
        func, args = recorded_call(lambda: plan.permute_rows(value), "permute_rows")
        assert torch.equal(replay(func, args), permuted)


PLUG_IN_CORRUPTIONS = {
    "too few tokens": ("x",), "too many tokens": ("x",), "1-D x": ("x",), "other heads": ("x",),
    "o of another length": ("o",), "seq_len 0": ("seq_len",), "seq_len too long": ("seq_len",),
    "seq_len float": ("seq_len",), "seq_len huge": ("seq_len",),
}


@FEW
@given(st.data())
def test_bad_plug_in_arguments_are_refused_naming_them(data):
    draw = data.draw
    mask = draw(block_masks(max_heads=3))
    heads, q_blocks, _ = mask.shape
    block = draw(st.integers(2, 6))
    plan = wavealign.plan(mask, skip="never", block_size=block)
    corruption = draw(st.sampled_from(sorted(PLUG_IN_CORRUPTIONS)))
    padded = q_blocks * block
    tokens = {"too few tokens": padded - block - draw(st.integers(0, padded - block)) if padded > block else None,
              "too many tokens": padded + draw(st.integers(1, 20))}
    x = np.ones((heads, padded, 2), np.float32)
    if corruption in tokens:
        hypothesis.assume(tokens[corruption] is not None)
        x = np.ones((heads, tokens[corruption], 2), np.float32)
        call = lambda value: plan.permute_rows(value)  # noqa: E731
    elif corruption == "1-D x":
        call, x = (lambda value: plan.permute_rows(value)), np.ones(padded, np.float32)
    elif corruption == "other heads":
        call, x = (lambda value: plan.permute_rows(value)), np.ones((heads + 1, padded, 2), np.float32)
        hypothesis.assume(heads > 1)
    elif corruption == "o of another length":
        call, x = (lambda value: plan.unpermute_rows(value)), np.ones((heads, padded + 1, 2), np.float32)
    else:
        seq_len = {"seq_len 0": 0, "seq_len too long": padded + 1, "seq_len float": float(padded),
                   "seq_len huge": 2**70}[corruption]
        call = lambda value: plan.unpermute_rows(value, seq_len=seq_len)  # noqa: E731
    value = framework_array(draw, x)
    assert_refused(lambda: call(value), *PLUG_IN_CORRUPTIONS[corruption])


def corrupt_permutation(draw, permutation: np.ndarray) -> tuple[object, str]:
    """A permutation [H, MB] made invalid in a drawn way, and the kind of corruption."""
    heads, q_blocks = permutation.shape
    kind = draw(st.sampled_from(["repeated", "past the end", "negative", "float", "int64 of another shape"]))
    bad = permutation.copy()
    h = draw(st.integers(0, heads - 1))
    if kind == "repeated" and q_blocks >= 2:
        bad[h, 1] = bad[h, 0]
    elif kind == "past the end" or (kind == "repeated" and q_blocks < 2):
        bad[h, draw(st.integers(0, q_blocks - 1))] = draw(st.integers(q_blocks, 2**31 - 1))
    elif kind == "negative":
        bad[h, draw(st.integers(0, q_blocks - 1))] = draw(st.integers(-2**31, -1))
    elif kind == "float":
        return torch.from_numpy(bad.astype(np.float32)), kind
    else:
        return torch.from_numpy(bad.astype(np.int64).reshape(-1)), kind
    return torch.from_numpy(bad), kind


@FEW
@given(st.data())
def test_torch_ops_refuse_invalid_permutations(data):
    draw = data.draw
    mask = draw(block_masks())
    heads, q_blocks, _ = mask.shape
    block = draw(st.integers(1, 5))
    plan = wavealign.plan(mask, skip="never", block_size=block)
    x = torch.randn(heads, q_blocks * block, 2)
    bad, _ = corrupt_permutation(draw, host(plan.permutation))
    bad_block = draw(st.integers(-3, 0))
    permute, permute_args = recorded_call(lambda: plan.permute_rows(x), "permute_rows")
    unpermute, unpermute_args = recorded_call(lambda: plan.unpermute_rows(x), "unpermute_rows")
    assert_refused(lambda: replay(permute, permute_args, permutation=bad), "permutation")
    assert_refused(lambda: replay(unpermute, unpermute_args, inverse=bad), "inverse")
    assert_refused(lambda: replay(permute, permute_args, block=bad_block), "block")
    assert_refused(lambda: replay(unpermute, unpermute_args, block=bad_block), "block")


def corrupt_schedule(draw, schedule):
    """The schedule tensor (int32 pairs (head, query block)) with one item repeated or out of range."""
    bad = schedule.clone()
    items = bad.view(-1, 2)
    count = items.shape[0]
    item = draw(st.integers(0, count - 1))
    kind = draw(st.sampled_from(["repeated", "head out of range", "block out of range"]))
    if kind == "repeated" and count >= 2:
        items[item] = items[(item + 1) % count]
    else:
        items[item, 0 if kind == "head out of range" else 1] = draw(st.sampled_from([-1, 1000, 2**31 - 1]))
    return bad


@FEW
@given(attention_cases(), st.data())
def test_attention_op_equals_the_entry_point_and_refuses_corrupt_schedules(case, data):
    draw = data.draw
    qkv, mask, block, batch = case
    q, k, v = (torch.from_numpy(x.astype(np.float32)) for x in qkv)
    plan = wavealign.plan(mask, skip="never", block_size=block, order=draw(st.sampled_from(ORDERS)))
    expected = wavealign.sparse_attention(q, k, v, plan, return_lse=True)
    func, args = recorded_call(lambda: wavealign.sparse_attention(q, k, v, plan), "sparse_attention")
    o, lse = replay(func, args)
    assert torch.equal(o, expected[0]) and torch.equal(lse, expected[1])
    name = schedule_argument(func)
    schedule = args[[argument.name for argument in func._schema.arguments].index(name)]
    bad = corrupt_schedule(draw, schedule)
    hypothesis.assume(not torch.equal(bad, schedule))
    assert_refused(lambda: replay(func, args, **{name: bad}), "schedule", "schedules")


# ---- big ints, autograd inputs, FlexAttention partial blocks -----------------------------------------------

BIG_INTS = [2**31 - 1, 2**31, 2**32 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70, -1, -2**63 - 1, -2**70]
# The largest value of each integer argument of plan(): its C++ type's (seed uint64, tokens int64, the rest int).
PLAN_INT_LIMITS = {"wave_size": 2**31 - 1, "iterations": 2**31 - 1, "seed": 2**64 - 1, "threads": 2**31 - 1,
                   "head_dim": 2**31 - 1, "tokens": 2**63 - 1, "block_size": 2**31 - 1, "heads": 2**31 - 1,
                   "kv_blocks": 2**31 - 1}
# Arguments whose largest values need no memory or time in proportion: the plan runs with them.
SIZE_FREE_ARGUMENTS = ("wave_size", "seed", "tokens", "head_dim")


@EXAMPLES
@given(st.sampled_from(sorted(PLAN_INT_LIMITS)), st.sampled_from(BIG_INTS))
def test_ints_past_their_cpp_type_are_refused_naming_the_argument(argument, value):
    """Past the C++ type: a ValueError naming the argument, never the binding's TypeError. Inside it: a plan,
    or a ValueError naming the argument where the value is out of its own range (a wave larger than the mask
    is fine; a negative seed is not)."""
    mask = np.ones((1, 2, 2), bool)
    if argument in ("heads", "kv_blocks"):
        block_mask = csr_of(mask)
        kwargs = {"heads": 1, "kv_blocks": 2, argument: value}
    else:
        block_mask, kwargs = mask, {argument: value}
    call = lambda: wavealign.plan(block_mask, skip="never", **kwargs)  # noqa: E731
    # heads that do not match row_ptr's length may be reported on row_ptr.
    named = (argument, "row_ptr") if argument == "heads" else (argument,)
    if value > PLAN_INT_LIMITS[argument] or value < 0:
        assert_refused(call, *named)
        return
    if argument not in SIZE_FREE_ARGUMENTS:
        return  # a huge count of KV blocks, heads or threads is a size, not a value to compute with here
    try:
        call()
    except ValueError as error:
        assert names(argument) in str(error)


@FEW
@given(attention_cases(), st.sampled_from(["q", "k", "v", "x", "o"]))
def test_inputs_that_require_grad_are_refused(case, argument):
    qkv, mask, block, batch = case
    q, k, v = (torch.from_numpy(x.astype(np.float32)) for x in qkv)
    plan = wavealign.plan(mask, skip="never", block_size=block)
    if argument in ("q", "k", "v"):
        operands = {"q": q, "k": k, "v": v}
        operands[argument] = operands[argument].requires_grad_()
        assert_refused(lambda: wavealign.sparse_attention(operands["q"], operands["k"], operands["v"], plan),
                       argument)
    elif argument == "x":
        assert_refused(lambda: plan.permute_rows(q.requires_grad_()), "x")
    else:
        permuted = plan.permute_rows(q).requires_grad_()
        assert_refused(lambda: plan.unpermute_rows(permuted), "o")


@FEW
@given(st.integers(1, 200), st.sampled_from([16, 32]), st.integers(2, 6))
def test_flex_masks_with_partial_blocks_run_exactly_or_are_refused(width, block, q_blocks):
    from torch.nn.attention.flex_attention import create_block_mask

    def band(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < width

    length = q_blocks * block
    block_mask = create_block_mask(band, 1, 2, length, length, device="cpu", BLOCK_SIZE=block)
    plan = wavealign.plan(block_mask, skip="never", wave_size=2)
    q, k, v = (torch.randn(1, 2, length, 8, generator=torch.Generator().manual_seed(seed)) for seed in range(3))
    try:
        o = wavealign.sparse_attention(q, k, v, plan)
    except ValueError as error:
        assert names("plan") in str(error)
        return
    positions = torch.arange(length)
    token_mask = (positions[:, None] - positions[None, :]).abs() < width
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                                attn_mask=token_mask)
    torch.testing.assert_close(o.double(), expected, atol=2e-5, rtol=1e-4)
