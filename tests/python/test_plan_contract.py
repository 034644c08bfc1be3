"""The plan/run contract that C++ owns, as Python sees it: one buffer layout for both planners, one rule for
a call against its plan (and for a one-head plan's broadcast), plans that pickle and deep-copy, and the argument
errors the entry points give."""

import copy
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import wavealign
from wavealign import _core
from wa_testing import csr_of, random_mask

try:
    import torch
except ImportError:  # the torch cases skip (the suite's conftest fails the run when torch is missing)
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


@pytest.fixture
def rng():
    return np.random.default_rng(11)


# ---- one buffer layout, decided in C++ -------------------------------------------------------------------------

def test_the_layout_reserves_what_each_mask_format_can_hold(rng):
    mask = random_mask(rng, 3, 20, 17)
    dense = _core.plan_layout(_core.dense_view(mask))
    assert (dense["heads"], dense["q_blocks"], dense["kv_blocks"]) == (3, 20, 17)
    assert dense["csr_capacity"] == 3 * 20 * 17 and dense["permuted_capacity"] == 0
    row_ptr, col_idx = csr_of(mask)
    csr = _core.plan_layout(_core.csr_view(row_ptr, col_idx, 3, 17))
    assert csr["csr_capacity"] == csr["permuted_capacity"] == col_idx.size
    regions = csr["regions"]
    assert regions["record"] == (0, 40) and csr["host_block_bytes"] == 40 + 3 * _core.gpu_plan_stats_bytes + 3
    ends = sorted((offset, offset + size) for offset, size in regions.values())
    assert all(end <= next_start for (_, end), (next_start, _) in zip(ends, ends[1:]))  # no two regions overlap
    assert all(offset % 256 == 0 for name, (offset, _) in regions.items() if name not in ("stats", "skip"))
    assert ends[-1][1] <= csr["bytes"]


def test_a_cpu_plan_is_one_buffer_of_that_layout(rng):
    mask = random_mask(rng, 2, 30, 30, density=0.2)
    plan = wavealign.plan(mask, wave_size=8, skip="never")
    host = plan._handle.host()
    assert host.buffer.dtype == np.uint8 and host.buffer.ndim == 1
    assert np.shares_memory(plan.permutation, host.buffer) and np.shares_memory(plan.inverse, host.buffer)
    assert np.array_equal(plan.schedule(), host.schedule())
    row_ptr, col_idx = plan.csr()
    assert np.array_equal(row_ptr, csr_of(mask)[0]) and np.array_equal(col_idx, csr_of(mask)[1])
    permuted = plan.permuted_mask()
    assert np.array_equal(permuted, mask[np.arange(2)[:, None], plan.permutation])


@needs_torch
def test_a_torch_plan_puts_its_buffer_on_the_device_in_one_copy(rng):
    mask = torch.from_numpy(random_mask(rng, 2, 12, 12))
    plan = wavealign.plan(mask, wave_size=4, skip="never")
    permutation, inverse, schedule, row_ptr, _ = plan._views(mask.device)
    base = permutation.untyped_storage().data_ptr()
    assert inverse.untyped_storage().data_ptr() == base and schedule.untyped_storage().data_ptr() == base
    assert row_ptr.untyped_storage().data_ptr() == base


# ---- one rule for a call against its plan, one broadcast of a one-head plan ------------------------------------

def test_every_entrance_words_a_length_mismatch_alike(rng):
    plan = wavealign.plan(random_mask(rng, 2, 4, 4), block_size=16, skip="never")
    q = rng.standard_normal((2, 70, 8)).astype(np.float32)  # 70 tokens = 5 blocks of 16, the plan has 4
    expected = "invalid argument 'q': has 70 tokens = 5 query blocks of 16, the plan has 4"
    with pytest.raises(ValueError, match=expected):
        wavealign.sparse_attention(q, q, q, plan)
    with pytest.raises(ValueError, match="invalid argument 'x': has 70 tokens = 5 query blocks of 16, the plan has 4"):
        plan.permute_rows(q)
    if torch is not None:
        with pytest.raises(ValueError, match=expected):
            wavealign.sparse_attention(torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(q), plan)
        with pytest.raises(ValueError, match="invalid argument 'x': has 70 tokens"):
            plan.permute_rows(torch.from_numpy(q))


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_a_one_head_plan_serves_every_head_in_sparse_attention_and_permute_rows(rng, framework):
    if framework == "torch" and torch is None:
        pytest.skip("PyTorch is not installed")
    one = random_mask(rng, 1, 5, 5, density=0.4)
    batch, heads, length, dim = 2, 3, 70, 8
    q, k, v = (rng.standard_normal((batch, heads, length, dim)).astype(np.float32) for _ in range(3))
    broadcast = wavealign.plan(one, block_size=16, skip="never", wave_size=2)
    repeated = wavealign.plan(np.repeat(one, heads, axis=0), block_size=16, skip="never", wave_size=2)
    if framework == "torch":
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    o_broadcast, lse_broadcast = wavealign.sparse_attention(q, k, v, broadcast, return_lse=True)
    o_repeated, lse_repeated = wavealign.sparse_attention(q, k, v, repeated, return_lse=True)
    assert np.array_equal(np.asarray(o_broadcast), np.asarray(o_repeated))
    assert np.array_equal(np.asarray(lse_broadcast), np.asarray(lse_repeated))
    # permute_rows moves every head's blocks by the one head's order.
    expected = wavealign._rows.permute_numpy(np.asarray(q), np.repeat(np.asarray(broadcast.permutation), heads, 0),
                                            16, "x")
    assert np.array_equal(np.asarray(broadcast.permute_rows(q)), expected)


def test_a_plan_of_other_heads_is_refused_naming_q(rng):
    plan = wavealign.plan(random_mask(rng, 4, 4, 4), block_size=16, skip="never")
    q = rng.standard_normal((2, 3, 64, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"invalid argument 'q': has 3 heads and batch 2; the plan's mask has 4 heads "
                                         r"\(expected H = 3, B\*H = 6 or 1\)"):
        wavealign.sparse_attention(q, q, q, plan)


# ---- pickle and deep copy -------------------------------------------------------------------------------------

def _same_plan(a, b):
    assert (a.heads, a.q_blocks, a.kv_blocks, a.wave_size, a.order, a.block_size, a.planner) == \
           (b.heads, b.q_blocks, b.kv_blocks, b.wave_size, b.order, b.block_size, b.planner)
    assert a.skipped == b.skipped and a.reason == b.reason
    assert np.array_equal(np.asarray(a.permutation), np.asarray(b.permutation))
    assert np.array_equal(np.asarray(a.schedule()), np.asarray(b.schedule()))
    for x, y in zip(a.csr(), b.csr()):
        assert np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("source", ["dense", "csr"])
def test_a_plan_pickles_and_deep_copies(rng, source):
    mask = random_mask(rng, 2, 8, 8, density=0.4)
    block_mask = mask if source == "dense" else csr_of(mask)
    extra = {} if source == "dense" else {"heads": 2, "kv_blocks": 8}
    plan = wavealign.plan(block_mask, block_size=16, skip="never", wave_size=3, **extra)
    for copied in (pickle.loads(pickle.dumps(plan)), copy.deepcopy(plan)):
        _same_plan(copied, plan)
        got, expected = copied.permuted_mask(), plan.permuted_mask()
        pairs = zip(got, expected) if source == "csr" else [(got, expected)]
        assert all(np.array_equal(x, y) for x, y in pairs)
        q = rng.standard_normal((2, 128, 8)).astype(np.float32)
        assert np.array_equal(wavealign.sparse_attention(q, q, q, copied), wavealign.sparse_attention(q, q, q, plan))


@needs_torch
def test_a_module_holding_a_torch_plan_deep_copies(rng):
    mask = torch.from_numpy(random_mask(rng, 2, 8, 8))
    module = torch.nn.Module()
    module.plan = wavealign.plan(mask, block_size=16, skip="never", wave_size=3)
    twin = copy.deepcopy(module)
    _same_plan(twin.plan, module.plan)
    q = torch.randn(2, 128, 8)
    assert torch.equal(wavealign.sparse_attention(q, q, q, twin.plan), wavealign.sparse_attention(q, q, q, module.plan))
    assert isinstance(twin.plan.permutation, torch.Tensor)


# ---- arguments accepted silently or with the wrong words before ------------------------------------------------

def test_contradicting_shape_arguments_of_a_dense_mask_are_refused(rng):
    mask = random_mask(rng, 2, 6, 6)
    with pytest.raises(ValueError, match="invalid argument 'heads': is for a CSR mask"):
        wavealign.plan(mask, heads=5)
    with pytest.raises(ValueError, match="invalid argument 'kv_blocks': is for a CSR mask"):
        wavealign.plan(mask, kv_blocks=7)


def test_a_nested_list_is_a_dense_mask_not_a_csr_pair():
    rows = [[True, False, True], [False, True, True], [True, True, False]]
    plan = wavealign.plan([rows], skip="never", wave_size=2)
    assert (plan.heads, plan.q_blocks, plan.kv_blocks) == (1, 3, 3)
    assert np.array_equal(wavealign.plan(np.array([rows]), skip="never", wave_size=2).permutation, plan.permutation)


def test_an_int8_mask_is_named_by_its_dtype():
    with pytest.raises(ValueError, match="has dtype int8, expected bool or uint8"):
        wavealign.plan(np.ones((1, 2, 2), np.int8))


@needs_torch
def test_a_meta_device_mask_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="invalid argument 'block_mask': is on the meta device"):
        wavealign.plan(torch.ones(1, 2, 2, dtype=torch.bool, device="meta"))


def test_sparse_attention_arguments_are_checked_as_given(rng):
    plan = wavealign.plan(random_mask(rng, 2, 4, 4), block_size=16, skip="never")
    q = rng.standard_normal((2, 64, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="invalid argument 'return_lse': must be a bool, got str 'yes'"):
        wavealign.sparse_attention(q, q, q, plan, return_lse="yes")
    with pytest.raises(ValueError, match=r"invalid argument 'scale': must be at most 3.402823e\+38 .* got 1e\+308"):
        wavealign.sparse_attention(q, q, q, plan, scale=1e308)
    with pytest.raises(ValueError, match=r"invalid argument 'scale': must be finite and > 0 \(None = 1/sqrt"):
        wavealign.sparse_attention(q, q, q, plan, scale=0)
    with pytest.raises(ValueError, match="invalid argument 'k': has dtype float32, q has float64"):
        wavealign.sparse_attention(q.astype(np.float64), q, q, plan)
    with pytest.raises(ValueError, match="invalid argument 'kernel': unknown value 'sm70'"):
        wavealign.sparse_attention(q, q, q, plan, kernel="sm70")


@needs_torch
def test_the_torch_op_checks_traversal_and_kernel(rng):
    plan = wavealign.plan(torch.from_numpy(random_mask(rng, 2, 4, 4)), block_size=16, skip="never")
    q = torch.randn(1, 2, 64, 8)
    row_ptr, col_idx, schedule, error = plan._launch_tensors(q.device, 1, 2, "sequential")
    call = torch.ops.wavealign.sparse_attention
    with pytest.raises(ValueError, match="invalid argument 'traversal': unknown value 'zig'"):
        call(q, q, q, row_ptr, col_idx, schedule, error, 16, 16, 0.5, "zig", "auto")
    with pytest.raises(ValueError, match="invalid argument 'kernel': unknown value 'fast'"):
        call(q, q, q, row_ptr, col_idx, schedule, error, 16, 16, 0.5, "ascending", "fast")


@needs_torch
def test_the_torch_op_checks_a_csr_by_the_ingest_rules(rng):
    plan = wavealign.plan(torch.from_numpy(random_mask(rng, 2, 4, 4)), block_size=16, skip="never")
    q = torch.randn(1, 2, 64, 8)
    row_ptr, col_idx, schedule, error = plan._launch_tensors(q.device, 1, 2, "sequential")
    broken = col_idx.clone()
    broken[0] = 4  # outside the 4 KV blocks
    with pytest.raises(ValueError) as op_error:
        torch.ops.wavealign.sparse_attention(q, q, q, row_ptr, broken, schedule, error, 16, 16, 0.5, "ascending",
                                             "auto")
    with pytest.raises(ValueError) as plan_error:
        wavealign.plan((row_ptr.numpy(), broken.numpy()), heads=2, kv_blocks=4)
    assert str(op_error.value) == str(plan_error.value)
    assert "invalid argument 'col_idx'" in str(op_error.value)


@needs_torch
def test_a_compiled_permute_leaves_no_extension_object_behind(tmp_path):
    # torch.compile keeps the plan it traced alive past the end of the program; a plan holds no extension
    # object, so the extension finds none alive when the interpreter exits (nanobind reports leaks then).
    script = tmp_path / "compiled.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, torch, wavealign
        plan = wavealign.plan(torch.from_numpy(np.eye(4, dtype=bool)[None]), block_size=8, skip="never")
        q = torch.randn(1, 32, 4)
        out = torch.compile(lambda x: plan.permute_rows(x), fullgraph=True, backend="eager")(q)
        assert torch.equal(out, plan.permute_rows(q))
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert "leaked" not in result.stderr, result.stderr


@needs_torch
def test_the_layout_decision_is_the_cpp_check(rng):
    # [B, L, H, d] memory viewed as [B, H, L, d] (diffusers' layout) runs in place; an odd start or a strided
    # head_dim needs a contiguous copy; a call the kernel cannot run at all names its argument.
    base = torch.zeros(2, 64, 3, 16, dtype=torch.bfloat16).transpose(1, 2)
    layout = wavealign.ops._layout_of
    o = torch.empty_like(base)
    ok, copy, _, _ = _core.attention_layout(2, 3, 64, 16, 16, 16, 3, 0.25, tuple(layout(x) for x in (base,) * 3 + (o,)))
    assert ok and not copy
    shifted = torch.zeros(2 * 64 * 3 * 16 + 1, dtype=torch.bfloat16)[1:].view(2, 64, 3, 16).transpose(1, 2)
    ok, copy, argument, reason = _core.attention_layout(2, 3, 64, 16, 16, 16, 3, 0.25,
                                                        tuple(layout(x) for x in (shifted, base, base, o)))
    assert not ok and copy and argument == "q" and "16-byte aligned" in reason
    ok, copy, argument, _ = _core.attention_layout(2, 3, 64, 16, 16, 16, 4, 0.25, tuple(layout(x) for x in (base,) * 4))
    assert not ok and not copy and argument == "mask_heads"
    q = torch.randn(2, 3, 64, 16)
    out, _, needs_copy = wavealign.ops.output_like(q, q, q, 16, 16, 3, 0.25)
    assert not needs_copy and out.stride() == q.stride()
