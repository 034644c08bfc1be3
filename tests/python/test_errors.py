"""Every bad input raises ValueError whose message names the argument ("invalid argument '<name>'")."""

import numpy as np
import pytest

import wavealign
from wa_testing import FlexLike, csr_of, random_mask


def named(argument):
    return pytest.raises(ValueError, match=f"invalid argument '{argument}'")


@pytest.fixture
def mask():
    return random_mask(np.random.default_rng(5), 2, 8, 8)


@pytest.fixture
def plan(mask):
    return wavealign.plan(mask, wave_size=4, skip="never", block_size=16)


@pytest.mark.parametrize("kwargs,argument", [
    ({"order": "sideways"}, "order"),
    ({"skip": "sometimes"}, "skip"),
    ({"gpu": "h300"}, "gpu"),
    ({"wave_size": 0}, "wave_size"),
    ({"wave_size": 2.5}, "wave_size"),
    ({"iterations": 0}, "iterations"),
    ({"iterations": 5000}, "iterations"),
    ({"seed": -1}, "seed"),
    ({"block_size": 0}, "block_size"),
    ({"block_size": (16, 16, 16)}, "block_size"),
    ({"threads": -2}, "threads"),
    ({"head_dim": 0}, "head_dim"),
    ({"plan_reuse": 0}, "plan_reuse"),
    ({"planner": "tpu"}, "planner"),
    ({"planner": "gpu"}, "planner"),  # the GPU plan needs a mask on a CUDA device
    # Ints past the C++ type behind the argument (int, uint64 seed, int64 tokens).
    ({"wave_size": 2**31}, "wave_size"),
    ({"iterations": 2**40}, "iterations"),
    ({"seed": 2**64}, "seed"),
    ({"tokens": 2**70}, "tokens"),
    ({"threads": 2**31}, "threads"),
    ({"head_dim": 2**31}, "head_dim"),
    ({"block_size": 2**31}, "block_size"),
    ({"block_size": (16, 2**40)}, "block_size"),
])
def test_plan_options(mask, kwargs, argument):
    with named(argument):
        wavealign.plan(mask, **kwargs)


def test_the_largest_ints_of_each_type_are_accepted(mask):
    plan = wavealign.plan(mask, wave_size=4, seed=2**64 - 1, tokens=2**63 - 1, skip="never")
    assert plan.heads == 2


@pytest.mark.parametrize("bad", [
    np.zeros((2, 8, 8), np.float32),
    np.zeros((2, 8, 8), np.int64),
    np.zeros(8, bool),
    np.zeros((1, 2, 8, 8), bool),
    np.zeros((2, 0, 8), bool),
    None,
])
def test_dense_masks(bad):
    with named("block_mask"):
        wavealign.plan(bad)


def test_csr_masks(mask):
    row_ptr, col_idx = csr_of(mask)
    with named("kv_blocks"):
        wavealign.plan((row_ptr, col_idx), heads=2)
    with named("block_mask"):
        wavealign.plan((row_ptr, col_idx, col_idx), kv_blocks=8)
    with named("heads"):
        wavealign.plan((row_ptr, col_idx), heads=0, kv_blocks=8)
    with named("row_ptr"):
        wavealign.plan((row_ptr, col_idx), heads=3, kv_blocks=8)
    with named("row_ptr"):
        wavealign.plan((row_ptr.astype(np.float64), col_idx), heads=2, kv_blocks=8)
    with named("col_idx"):
        wavealign.plan((row_ptr, col_idx.astype(np.float32)), heads=2, kv_blocks=8)
    decreasing = row_ptr.copy()
    decreasing[3] = decreasing[4] + 1
    with named("row_ptr"):
        wavealign.plan((decreasing, col_idx), heads=2, kv_blocks=8)
    with named("col_idx"):
        wavealign.plan((row_ptr, col_idx + 8), heads=2, kv_blocks=8)
    with named("col_idx"):
        wavealign.plan((row_ptr, col_idx[:-1]), heads=2, kv_blocks=8)
    with named("heads"):
        wavealign.plan((row_ptr, col_idx), heads=2**40, kv_blocks=8)
    with named("kv_blocks"):
        wavealign.plan((row_ptr, col_idx), heads=2, kv_blocks=2**31)


def test_flex_masks(mask):
    flex = FlexLike(mask, 16, 128)
    flex.kv_num_blocks = flex.kv_num_blocks.copy()
    flex.kv_num_blocks[0, 0, 0] = 9
    with named("kv_num_blocks"):
        wavealign.plan(flex)
    flex = FlexLike(mask, 16, 128)
    flex.kv_indices = flex.kv_indices + 8
    with named("kv_indices"):
        wavealign.plan(flex)
    flex = FlexLike(mask, 16, 128)
    flex.kv_indices = flex.kv_indices.astype(np.int64)
    with named("kv_indices"):
        wavealign.plan(flex)
    flex = FlexLike(mask, 16, 128)
    flex.kv_num_blocks = flex.kv_num_blocks[0]
    with named("kv_num_blocks"):
        wavealign.plan(flex)
    flex = FlexLike(mask, 16, 128)
    flex.full_kv_num_blocks = flex.kv_num_blocks
    with named("full_kv_indices"):
        wavealign.plan(flex)


def qkv(shape, dtype=np.float32):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(3))


def test_attention_arguments(plan):
    q, k, v = qkv((2, 128, 8))
    with named("plan"):
        wavealign.sparse_attention(q, k, v, "not a plan")
    with named("q"):
        wavealign.sparse_attention(q[0], k[0], v[0], plan)
    with named("k"):
        wavealign.sparse_attention(q, k[:, :64], v, plan)
    with named("v"):
        wavealign.sparse_attention(q, k, v[:1], plan)
    short = qkv((2, 96, 8))
    with named("q"):
        wavealign.sparse_attention(*short, plan)
    three_heads = qkv((3, 128, 8))
    with named("q"):
        wavealign.sparse_attention(*three_heads, plan)
    with named("q"):
        wavealign.sparse_attention(*qkv((2, 128, 8), np.int32), plan)
    for scale in (-1.0, 0.0, float("nan"), "big"):
        with named("scale"):
            wavealign.sparse_attention(q, k, v, plan, scale=scale)
    with named("traversal"):
        wavealign.sparse_attention(q, k, v, plan, traversal="zigzag")
    with named("head_order"):
        wavealign.sparse_attention(q, k, v, plan, head_order="random")
    with named("kernel"):
        wavealign.sparse_attention(q, k, v, plan, kernel="sm70")


def test_plug_in_arguments(plan):
    x = np.zeros((2, 128, 4), np.float32)
    with named("x"):
        plan.permute_rows(np.zeros((2, 100, 4), np.float32))
    with named("x"):
        plan.permute_rows(np.zeros((3, 128, 4), np.float32))
    with named("x"):
        plan.permute_rows(np.zeros(128, np.float32))
    with named("o"):
        plan.unpermute_rows(np.zeros((2, 120, 4), np.float32))
    with named("seq_len"):
        plan.unpermute_rows(x, seq_len=100)
    with named("seq_len"):
        plan.unpermute_rows(x, seq_len="all")
    with named("head_order"):
        plan.schedule("backwards")


def test_extension_errors_are_value_errors_naming_the_argument():
    core = wavealign._core
    with named("block_mask"):
        core.mask_from_dense(np.zeros((2, 3), np.float32))
    with named("kv_blocks"):
        core.mask_from_csr(np.zeros(2, np.int64), np.zeros(0, np.int32), 1, 0)
    with named("order"):
        core.make_plan(core.mask_from_dense(np.ones((1, 2, 2), bool)), "bad", "h200", 0, 10, 0, "never", 0, 128, 2,
                       128, 1.0)
    q = np.zeros((1, 16, 4), np.float32)
    with named("q"):
        core.reference_attention(q.astype(np.float64), q, q, q.copy(), np.zeros((1, 16), np.float32),
                                 np.array([0, 1], np.int64), np.array([0], np.int32), 16, 16, 1.0)
    with named("o"):
        core.reference_attention(q, q, q, np.zeros((1, 16, 4), np.float64), np.zeros((1, 16), np.float32),
                                 np.array([0, 1], np.int64), np.array([0], np.int32), 16, 16, 1.0)
    with named("row_ptr"):
        core.reference_attention(q, q, q, q.copy(), np.zeros((1, 16), np.float32),
                                 np.array([0, 1, 1], np.int64), np.array([0], np.int32), 16, 16, 1.0)


def test_row_ops_take_only_a_valid_permutation():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch op checks are skipped")
    wavealign.ops.register()
    permute, unpermute = torch.ops.wavealign.permute_rows, torch.ops.wavealign.unpermute_rows
    x = torch.randn(2, 40, 4)  # 5 query blocks of 8
    good = torch.tensor([[2, 0, 1, 4, 3], [0, 1, 2, 3, 4]], dtype=torch.int32)
    assert torch.equal(unpermute(permute(x, good, 8), good.argsort(dim=1).int(), 8, 40), x)
    duplicate, far, negative = good.clone(), good.clone(), good.clone()
    duplicate[0, 1] = 2
    far[1, 4] = 1000  # used to wrap modulo L
    negative[0, 0] = -1
    for bad in (duplicate, far, negative, good.long(), good[0], good.float()):
        with named("permutation"):
            permute(x, bad, 8)
        with named("inverse"):
            unpermute(x, bad, 8, 40)
    for block in (0, -8, 2**40):
        with named("block"):
            permute(x, good, block)
        with named("block"):
            unpermute(x, good, block, 40)
    with named("x"):
        permute(torch.randn(2, 100, 4), good, 8)
    with named("x"):
        permute(torch.randn(3, 40, 4), good, 8)  # 3 heads against a 2-head permutation
    with named("x"):
        unpermute(torch.randn(2, 36, 4), good, 8, 36)
    with named("seq_len"):
        unpermute(x, good, 8, 20)
