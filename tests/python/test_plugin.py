"""The plug-in path on numpy: permute_rows, unpermute_rows and permuted_mask around any attention kernel."""

import numpy as np
import pytest

import wavealign
from wa_testing import dense_attention, expand_mask, random_mask


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def test_round_trip_is_the_identity_with_a_partial_block(rng):
    block = 16
    mask = random_mask(rng, 3, 10, 10)
    plan = wavealign.plan(mask, wave_size=4, skip="never", block_size=block)
    length = 9 * block + 5
    x = rng.standard_normal((2, 3, length, 8)).astype(np.float32)
    permuted = plan.permute_rows(x)
    assert permuted.shape == (2, 3, 10 * block, 8)
    assert np.array_equal(plan.unpermute_rows(permuted, seq_len=length), x)
    padded = plan.unpermute_rows(permuted)
    assert padded.shape == (2, 3, 10 * block, 8)
    assert np.array_equal(padded[..., :length, :], x) and not padded[..., length:, :].any()


def test_permuted_blocks_follow_the_permutation(rng):
    block = 8
    mask = random_mask(rng, 2, 12, 12)
    plan = wavealign.plan(mask, wave_size=4, skip="never", block_size=block)
    x = rng.standard_normal((2, 12 * block, 4))
    permuted = plan.permute_rows(x)
    for h in range(2):
        for p in range(12):
            source = plan.permutation[h, p]
            assert np.array_equal(permuted[h, p * block:(p + 1) * block], x[h, source * block:(source + 1) * block])


def test_heads_fold_from_batch_or_broadcast(rng):
    block = 4
    x = rng.standard_normal((2, 3, 6 * block, 5))
    folded = wavealign.plan(random_mask(rng, 6, 6, 6), wave_size=2, skip="never", block_size=block)
    out = folded.permute_rows(x)
    for b in range(2):
        for h in range(3):
            source = folded.permutation[b * 3 + h, 0]
            assert np.array_equal(out[b, h, :block], x[b, h, source * block:(source + 1) * block])
    assert np.array_equal(folded.unpermute_rows(out), x)
    one_head = wavealign.plan(random_mask(rng, 1, 6, 6), order="shuffled", seed=5, block_size=block)
    out = one_head.permute_rows(x)
    source = one_head.permutation[0, 0]
    assert np.array_equal(out[:, :, :block], x[:, :, source * block:(source + 1) * block])


def test_attention_in_plan_order_equals_attention_in_the_original_order(rng):
    """What a user's kernel sees on the plug-in path: permuted queries and the permuted mask, K/V in place."""
    block, q_blocks, heads, dim = 8, 9, 2, 16
    length = q_blocks * block - 3
    mask = random_mask(rng, heads, q_blocks, q_blocks, density=0.4)
    plan = wavealign.plan(mask, wave_size=4, skip="never", block_size=block)
    q, k, v = (rng.standard_normal((heads, length, dim)) for _ in range(3))
    expected, _ = dense_attention(q, k, v, expand_mask(mask, length, block, block), 0.25)

    permuted_mask = plan.permuted_mask()
    token_mask = np.repeat(np.repeat(permuted_mask, block, axis=-2), block, axis=-1)[..., :length]
    o_permuted, _ = dense_attention(plan.permute_rows(q), k, v, token_mask, 0.25)
    assert np.allclose(plan.unpermute_rows(o_permuted, seq_len=length), expected, atol=1e-12)


def test_reordering_does_not_change_the_fused_result(rng):
    """The design's invariant: every row's arithmetic depends on that row only, so any plan gives the same bits."""
    block, q_blocks = 16, 12
    mask = random_mask(rng, 2, q_blocks, q_blocks)
    q, k, v = (rng.standard_normal((2, q_blocks * block, 32)).astype(np.float32) for _ in range(3))
    original = wavealign.plan(mask, order="original", block_size=block)
    reordered = wavealign.plan(mask, wave_size=4, skip="never", block_size=block)
    assert not np.array_equal(original.permutation, reordered.permutation)
    o1, lse1 = wavealign.sparse_attention(q, k, v, original, return_lse=True)
    o2, lse2 = wavealign.sparse_attention(q, k, v, reordered, return_lse=True, head_order="concurrent-heads")
    assert np.array_equal(o1, o2) and np.array_equal(lse1, lse2)
