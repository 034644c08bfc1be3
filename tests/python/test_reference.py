"""wavealign.sparse_attention on numpy inputs (the CPU reference, float32) against a float64 dense oracle.

Tolerance: the reference accumulates in float32 with an online softmax, so against float64 its error is a few
float32 ulps of |O| ~ 1: atol 2e-5, rtol 1e-4 on O and atol 2e-5 on LSE (observed: < 3e-6).
"""

import numpy as np
import pytest

import wavealign
from wa_testing import csr_of, dense_attention, expand_mask, random_mask, transposed_layout

ATOL = 2e-5
RTOL = 1e-4


@pytest.fixture
def rng():
    return np.random.default_rng(3)


def inputs(rng, shape):
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


@pytest.mark.parametrize("length,block", [(256, 32), (250, 32), (96, 16)])
def test_three_dim_inputs_match_dense_attention(rng, length, block):
    heads, dim = 3, 32
    q_blocks = -(-length // block)
    mask = random_mask(rng, heads, q_blocks, q_blocks)
    plan = wavealign.plan(mask, wave_size=4, skip="never", block_size=block)
    q, k, v = inputs(rng, (heads, length, dim))
    o, lse = wavealign.sparse_attention(q, k, v, plan, return_lse=True)
    assert o.shape == q.shape and o.dtype == np.float32 and lse.shape == (heads, length)
    expected, expected_lse = dense_attention(q, k, v, expand_mask(mask, length, block, block), dim ** -0.5)
    assert np.allclose(o, expected, atol=ATOL, rtol=RTOL)
    assert np.allclose(lse, expected_lse, atol=ATOL)


def test_batch_with_shared_and_per_batch_masks(rng):
    batch, heads, length, dim, block = 2, 2, 128, 16, 16
    q, k, v = inputs(rng, (batch, heads, length, dim))
    shared = random_mask(rng, heads, 8, 8)
    o = wavealign.sparse_attention(q, k, v, wavealign.plan(shared, wave_size=4, skip="never", block_size=block))
    expected, _ = dense_attention(q, k, v, expand_mask(shared, length, block, block)[None], dim ** -0.5)
    assert np.allclose(o, expected, atol=ATOL, rtol=RTOL)

    per_batch = random_mask(rng, batch * heads, 8, 8)
    plan = wavealign.plan(per_batch, wave_size=4, skip="never", block_size=block)
    o = wavealign.sparse_attention(q, k, v, plan, scale=0.3)
    token_mask = expand_mask(per_batch, length, block, block).reshape(batch, heads, length, length)
    expected, _ = dense_attention(q, k, v, token_mask, 0.3)
    assert np.allclose(o, expected, atol=ATOL, rtol=RTOL)
    strided = wavealign.sparse_attention(*(transposed_layout(x) for x in (q, k, v)), plan, scale=0.3)
    assert np.array_equal(strided, o)


def test_rectangular_blocks(rng):
    length, dim = 200, 8
    mask = random_mask(rng, 1, 13, 7)  # 16-token query blocks, 32-token KV blocks
    plan = wavealign.plan(mask, wave_size=4, skip="never", block_size=(16, 32))
    q, k, v = inputs(rng, (1, length, dim))
    o = wavealign.sparse_attention(q, k, v, plan)
    expected, _ = dense_attention(q, k, v, expand_mask(mask, length, 16, 32), dim ** -0.5)
    assert np.allclose(o, expected, atol=ATOL, rtol=RTOL)


def test_empty_rows_give_zero_output_and_minus_infinity_lse(rng):
    mask = np.zeros((1, 4, 4), bool)
    mask[0, 0, :2] = True
    mask[0, 2, 3] = True
    plan = wavealign.plan(mask, order="original", block_size=8)
    q, k, v = inputs(rng, (1, 32, 8))
    o, lse = wavealign.sparse_attention(q, k, v, plan, return_lse=True)
    assert not np.isnan(o).any()
    assert not o[0, 8:16].any() and np.all(lse[0, 8:16] == -np.inf)
    assert not o[0, 24:].any() and np.all(np.isfinite(lse[0, :8]))


def test_output_keeps_the_input_dtype_and_traversal_is_accepted(rng):
    mask = random_mask(rng, 1, 4, 4)
    plan = wavealign.plan(mask, order="original", block_size=8)
    q, k, v = (x.astype(np.float64) for x in inputs(rng, (1, 32, 8)))
    o = wavealign.sparse_attention(q, k, v, plan, traversal="sawtooth")
    assert o.dtype == np.float64
    expected, _ = dense_attention(q, k, v, expand_mask(mask, 32, 8, 8), 8 ** -0.5)
    assert np.allclose(o, expected, atol=ATOL, rtol=RTOL)


def test_a_mask_shared_by_the_batch_equals_its_copy_per_entry(rng):
    """The reference reads mask head e % mask_heads for entry e = b*H + h, the kernels' rule."""
    batch, heads, length, dim, block = 3, 2, 64, 8, 16
    q, k, v = inputs(rng, (batch, heads, length, dim))
    mask = random_mask(rng, heads, 4, 4)
    shared = wavealign.ops.reference(q, k, v, *csr_of(mask), None, (block, block), 0.5)
    tiled = wavealign.ops.reference(q, k, v, *csr_of(np.tile(mask, (batch, 1, 1))), None, (block, block), 0.5)
    assert np.array_equal(shared[0], tiled[0]) and np.array_equal(shared[1], tiled[1])
    with pytest.raises(ValueError, match="invalid argument 'row_ptr'"):  # neither H nor B*H mask heads
        wavealign.ops.reference(q, k, v, *csr_of(np.tile(mask, (2, 1, 1))), None, (block, block), 0.5)
