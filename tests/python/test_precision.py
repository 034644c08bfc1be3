"""precision="int8": the 8-bit path through every Python entrance. On the CPU it runs the 8-bit kernel's exact
emulation (the host quantizer, integer Q K^T, the FP8 roundings of P and V), so the path is testable without a
GPU; the CUDA kernel is compared with the same emulation in tests/cuda/test_attention_int8.cpp and, through
torch, here (skipped without a CUDA device and the CUDA build)."""

import numpy as np
import pytest

import wavealign
from wa_testing import random_mask

try:
    import torch
except ImportError:  # the torch cases skip (the suite's conftest fails the run when torch is missing)
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
needs_cuda_kernel = pytest.mark.skipif(
    torch is None or not (torch.cuda.is_available() and wavealign.has_cuda and
                          torch.cuda.get_device_capability() >= (9, 0)),
    reason="needs a Hopper GPU and wavealign's CUDA kernels")


@pytest.fixture
def rng():
    return np.random.default_rng(3)


def _cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def _problem(rng, heads=2, tokens=300, dim=128):
    q, k, v = (rng.standard_normal((heads, tokens, dim)).astype(np.float32) for _ in range(3))
    blocks = -(-tokens // 128)
    return q, k, v, random_mask(rng, heads, blocks, blocks, density=0.6)


def test_int8_on_the_cpu_is_close_to_the_native_reference(rng):
    q, k, v, mask = _problem(rng)
    plan = wavealign.plan(mask, skip="never", wave_size=2)
    native, native_lse = wavealign.sparse_attention(q, k, v, plan, return_lse=True)
    int8, int8_lse = wavealign.sparse_attention(q, k, v, plan, return_lse=True, precision="int8")
    assert int8.dtype == np.float32 and int8.shape == native.shape
    assert _cosine(int8, native) >= 0.999
    assert not np.array_equal(int8, native)  # the 8-bit arithmetic ran, not the fp32 one
    assert np.allclose(int8_lse, native_lse, atol=0.05)


def test_int8_output_does_not_depend_on_the_schedule(rng):
    q, k, v, mask = _problem(rng, heads=3)
    original = wavealign.sparse_attention(q, k, v, wavealign.plan(mask, order="original", skip="never"),
                                          precision="int8")
    reordered = wavealign.sparse_attention(q, k, v, wavealign.plan(mask, skip="never", wave_size=2),
                                           precision="int8")
    assert np.array_equal(original, reordered)


def test_int8_refuses_what_the_8bit_kernel_does_not_run(rng):
    q, k, v, mask = _problem(rng, dim=64)
    plan = wavealign.plan(mask, skip="never")
    with pytest.raises(ValueError, match="invalid argument 'head_dim'"):
        wavealign.sparse_attention(q, k, v, plan, precision="int8")
    with pytest.raises(ValueError, match="invalid argument 'precision': unknown value 'fp8'"):
        wavealign.sparse_attention(q, k, v, plan, precision="fp8")


@needs_torch
def test_int8_through_the_torch_op_and_the_module(rng):
    q, k, v, mask = _problem(rng)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    plan = wavealign.plan(torch.from_numpy(mask), skip="never", wave_size=2)
    expected = wavealign.sparse_attention(q, k, v, wavealign.plan(mask, skip="never", wave_size=2), precision="int8")
    assert np.array_equal(wavealign.sparse_attention(tq, tk, tv, plan, precision="int8").numpy(), expected)
    module = wavealign.nn.SparseAttention(precision="int8", skip="never", wave_size=2)
    assert np.array_equal(module(tq, tk, tv, torch.from_numpy(mask)).numpy(), expected)
    with pytest.raises(ValueError, match="invalid argument 'precision'"):
        wavealign.nn.SparseAttention(precision="int4")


@needs_cuda_kernel
def test_int8_on_cuda_matches_the_emulation_through_the_op_and_the_module(rng):
    q, k, v, mask = _problem(rng, tokens=1000)
    # The kernel reads bf16: the emulation gets the same bf16 values.
    tq, tk, tv = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (q, k, v))
    hq, hk, hv = (x.float().cpu().numpy() for x in (tq, tk, tv))
    host_plan = wavealign.plan(mask, skip="never", wave_size=2)
    expected, expected_lse = wavealign.sparse_attention(hq, hk, hv, host_plan, return_lse=True, precision="int8")
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), skip="never", wave_size=2)
    o, lse = wavealign.sparse_attention(tq, tk, tv, plan, return_lse=True, precision="int8")
    assert o.dtype == torch.bfloat16 and o.is_cuda
    # The emulation's exp2 and double P V sums against MUFU.EX2 and fp32 tensor-core sums, then O in bf16
    # (tests/cuda/test_attention_int8.cpp states the same bound).
    bound = 2e-3 * np.abs(expected).max() + 2 * 2.0 ** -8 * np.abs(expected).max()
    assert np.abs(o.float().cpu().numpy() - expected).max() <= bound
    assert np.abs(lse.cpu().numpy() - expected_lse).max() <= 1e-4
    module = wavealign.nn.SparseAttention(precision="int8", skip="never", wave_size=2)
    assert torch.equal(module(tq, tk, tv, torch.from_numpy(mask).cuda()), o)
