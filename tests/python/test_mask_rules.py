"""Property test of the mask rules through wavealign.plan: random shapes, index dtypes, strides, FlexAttention
widths and splits between the partial and full pair, and random corruptions. Each case either raises the
ValueError naming the argument of the first broken rule (an oracle that writes the rules of
wavealign/ingest.h out one by one) or gives the plan of the mask the arrays describe."""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

import wavealign
from test_plan import FlexArrays
from wa_testing import csr_of


def first_csr_violation(row_ptr, col_idx, heads, kv_blocks):
    """(argument the scan order of wavealign/ingest.h names first, None) or (None, the dense mask the arrays
    describe): the rules written out one by one."""
    rows = len(row_ptr) - 1
    if row_ptr[0] != 0:
        return "row_ptr", None
    if any(row_ptr[r] < row_ptr[r - 1] for r in range(1, rows + 1)):
        return "row_ptr", None
    if row_ptr[rows] != len(col_idx):
        return "col_idx", None
    dense = np.zeros((rows, kv_blocks), bool)
    for r in range(rows):
        for e in range(row_ptr[r], row_ptr[r + 1]):
            if not 0 <= col_idx[e] < kv_blocks or (e > row_ptr[r] and col_idx[e] <= col_idx[e - 1]):
                return "col_idx", None
            dense[r, col_idx[e]] = True
    return None, dense.reshape(heads, rows // heads, kv_blocks)


def first_flex_violation(pairs, kv_blocks):
    """Like first_csr_violation; pairs: [(counts [R, MB], indices [R, MB, W], counts name, indices name)],
    partial first."""
    rows, q_blocks = pairs[0][0].shape
    dense = np.zeros((rows, q_blocks, kv_blocks), bool)
    for r in range(rows):
        for i in range(q_blocks):
            for counts, indices, counts_name, indices_name in pairs:
                count = counts[r, i]
                if not 0 <= count <= indices.shape[-1]:
                    return counts_name, None
                for j in indices[r, i, :count]:
                    if not 0 <= j < kv_blocks or dense[r, i, j]:
                        return indices_name, None
                    dense[r, i, j] = True
    return None, dense


@st.composite
def corrupted_masks(draw):
    heads, q_blocks, kv_blocks = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 70))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    dense = rng.random((heads, q_blocks, kv_blocks)) < draw(st.floats(0.0, 1.0))
    form = draw(st.sampled_from(["csr", "flex"]))
    edits = draw(st.integers(0, 2))
    if form == "csr":
        row_ptr, col_idx = csr_of(dense)
        row_ptr = row_ptr.astype(draw(st.sampled_from([np.int64, np.int32])))
        col_idx = col_idx.astype(draw(st.sampled_from([np.int32, np.int64])))
        for _ in range(edits):
            target = row_ptr if draw(st.booleans()) or len(col_idx) == 0 else col_idx
            target[draw(st.integers(0, len(target) - 1))] += draw(st.integers(-3, 3))
        if draw(st.booleans()):  # strided views of larger arrays
            row_ptr, col_idx = (np.repeat(a, 2)[::2] for a in (row_ptr, col_idx))
        return dense, form, (row_ptr, col_idx, heads, kv_blocks)
    width = kv_blocks + draw(st.integers(0, 3))
    pairs = []
    split = rng.random(dense.shape) < 0.5
    for part, name in ((dense & split, ""), (dense & ~split, "full_")):
        counts = part.sum(-1).astype(np.int32)
        indices = np.full((heads, q_blocks, width), -1, np.int32)
        for h in range(heads):
            for i in range(q_blocks):
                blocks = rng.permutation(np.flatnonzero(part[h, i]))
                indices[h, i, :len(blocks)] = blocks
        pairs.append([counts, indices, f"{name}kv_num_blocks", f"{name}kv_indices"])
    for _ in range(edits):
        pair = pairs[draw(st.integers(0, 1))]
        h, i = draw(st.integers(0, heads - 1)), draw(st.integers(0, q_blocks - 1))
        if draw(st.booleans()):
            pair[0][h, i] += draw(st.integers(-2, 2))
        else:
            pair[1][h, i, draw(st.integers(0, width - 1))] = draw(st.integers(-2, kv_blocks + 1))
    return dense, form, (pairs, kv_blocks)


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True, database=None)
@hypothesis.given(corrupted_masks())
def test_random_corrupt_masks_are_refused_by_name_or_planned_like_the_mask_they_describe(case):
    # A ValueError naming the argument of the first broken rule, or the plan of the mask the arrays describe.
    dense, form, arrays = case
    if form == "csr":
        row_ptr, col_idx, heads, kv_blocks = arrays
        expected, described = first_csr_violation(row_ptr.tolist(), col_idx.tolist(), heads, kv_blocks)
        call = lambda: wavealign.plan((row_ptr, col_idx), heads=heads, kv_blocks=kv_blocks, wave_size=2,
                                      skip="never", block_size=16)
    else:
        pairs, kv_blocks = arrays
        expected, described = first_flex_violation(pairs, kv_blocks)
        flex = FlexArrays((pairs[0][0][None], pairs[0][1][None]), (pairs[1][0][None], pairs[1][1][None]))
        flex.seq_lengths = (dense.shape[1] * 16, kv_blocks * 16)
        call = lambda: wavealign.plan(flex, wave_size=2, skip="never")
    if expected is None:  # an edit may leave a valid mask: then the plan is that mask's
        plan = call()
        reference = wavealign.plan(described, wave_size=2, skip="never", block_size=16)
        assert np.array_equal(plan.permutation, reference.permutation)
        assert all(np.array_equal(a, b) for a, b in zip(plan.csr(), reference.csr()))
    else:
        with pytest.raises(ValueError, match=f"^invalid argument '{expected}': "):
            call()
