"""wavealign.methods: the four mask generators and the adapters from the methods' own formats.

CPU: numpy and torch CPU inputs give one mask in their framework, shapes fold [B, H] into the mask's heads,
masks feed wavealign.plan and sparse_attention directly, options reach the C++ generators (hand-checked
XAttention case), bad arguments raise ValueError naming them. Adapters: SpargeAttn's 64x128 map OR-reduced,
XAttention's mask repeated to 64-token blocks, MInference's index lists as blocks, each against numpy.
NaN and inf in q or k are refused naming the tensor and the first such value; the Python defaults are the C++
ones. GPU (skipped without a CUDA device): bf16 CUDA inputs give a CUDA bool mask equal to the CPU reference on
the same bf16 values, up to near-ties of the fp32 scores (at most 0.2 % of the blocks, docs/methods.md), that
plans on the GPU and runs the kernel; NaN gives an empty mask whose record the plan and check() raise.
"""

import inspect

import numpy as np
import pytest

import wavealign
from wavealign import methods

METHODS = [methods.xattention, methods.sparge, methods.minference, methods.flexprefill]


def clustered(batch, heads, tokens, dim, seed=0):
    """Runs of 24 tokens share one of 6 directions in Q and K (content-dependent attention), plus noise."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(rng.integers(0, 6, size=(batch, heads, -(-tokens // 24))), 24, axis=-1)[..., :tokens]
    directions = rng.standard_normal((batch, heads, 6, dim))
    shared = np.take_along_axis(directions, labels[..., None].repeat(dim, axis=-1), axis=2)
    q = (shared + rng.standard_normal(shared.shape)).astype(np.float32)
    k = (shared + rng.standard_normal(shared.shape)).astype(np.float32)
    return q, k


@pytest.mark.parametrize("generate", METHODS, ids=lambda f: f.__name__)
def test_numpy_and_torch_cpu_give_one_mask(generate):
    torch = pytest.importorskip("torch")
    q, k = clustered(2, 2, 700, 32)
    mask = generate(q, k, block_size=64)
    assert isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (4, 11, 11)
    assert 0 < mask.mean() <= 1
    same = generate(torch.from_numpy(q), torch.from_numpy(k), block_size=64)
    assert isinstance(same, torch.Tensor) and same.dtype == torch.bool
    assert (same.numpy() == mask).all()
    three_d = generate(q[0], k[0], block_size=64)
    assert three_d.shape == (2, 11, 11) and (three_d == mask[:2]).all()


def test_masks_feed_plan_and_sparse_attention():
    q, k = clustered(1, 2, 512, 32)
    v = np.random.default_rng(1).standard_normal(q.shape).astype(np.float32)
    for generate in METHODS:
        mask = generate(q, k, block_size=64)
        plan = wavealign.plan(mask, block_size=64, skip="never")
        out = wavealign.sparse_attention(q, k, v, plan)
        assert plan.heads == 2 and out.shape == q.shape and np.isfinite(out).all()


def test_xattention_uniform_scores_keep_the_lower_blocks_of_a_tie():
    # Q = 0: every block holds a quarter of each row; threshold 0.5 keeps blocks 0 and 1 (C++ reference test).
    q = np.zeros((1, 64, 4), np.float32)
    mask = methods.xattention(q, q, threshold=0.5, stride=4, block_size=16, force_first_kblock=False)
    assert (mask[0] == np.array([[1, 1, 0, 0]] * 4, bool)).all()
    dense = methods.xattention(q, q, threshold=0.5, stride=4, block_size=16, force_dense=True)
    assert dense.all()


def test_xattention_int8_estimate_is_close_to_the_exact_one_and_ignores_a_key_offset():
    # The INT8 rule on the CPU reference (C++ tests: its formula): K minus its mean, so an offset common to all
    # keys, which the softmax ignores, does not move the codes' scales; the mask stays close to the exact one.
    q, k = clustered(1, 2, 2000, 64, seed=7)
    exact = methods.xattention(q, k, block_size=64)
    int8 = methods.xattention(q, k, block_size=64, int8_estimate=True)
    both, either = np.logical_and(exact, int8).sum(), np.logical_or(exact, int8).sum()
    assert both / either >= 0.95 and int8.sum() < int8.size
    shifted = methods.xattention(q, k + 4.0, block_size=64, int8_estimate=True)
    assert np.logical_and(shifted, int8).sum() / np.logical_or(shifted, int8).sum() >= 0.95
    with pytest.raises(Exception, match="int8_estimate"):
        methods.xattention(q, k, block_size=64, int8_estimate="yes")


def test_per_head_options_and_parity_flags_change_the_mask():
    q, k = clustered(1, 2, 900, 32, seed=2)
    low_high = methods.xattention(q, k, threshold=[0.3, 0.99], block_size=64, force_first_kblock=False)
    assert low_high[0].sum() < low_high[1].sum()
    plain = methods.sparge(q, k, simthreshd1=0.5, cdfthreshd=0.5, block_size=128, native_block=(128, 128),
                           smooth_k=False)
    parity = methods.sparge(q, k, simthreshd1=0.5, cdfthreshd=0.5, block_size=128, native_block=(128, 128),
                            smooth_k=False, nan_dense_partial_blocks=True)
    assert parity[:, -1, :].all() and parity.sum() >= plain.sum()
    topk = methods.sparge(q, k, simthreshd1=-1, topk=0.25, block_size=64, native_block=(64, 64))
    assert (topk.sum(axis=-1) >= 3).all()  # floor(0.25 x 15) = 3 per row


def test_table1_preset_sets_its_options_and_given_ones_win():
    q, k = clustered(1, 2, 900, 32, seed=3)
    assert (methods.sparge(q, k, preset="table1") == methods.sparge(q, k, simthreshd1=-1, cdfthreshd=0.96)).all()
    assert (methods.sparge(q, k, preset="table1", cdfthreshd=0.5)
            == methods.sparge(q, k, simthreshd1=-1, cdfthreshd=0.5)).all()
    assert (methods.minference(q, k, preset="table1", block_size=64)
            == methods.minference(q, k, vertical_size=200, slash_size=2000, block_size=64)).all()
    assert (methods.flexprefill(q, k, preset="table1", block_size=64)
            == methods.flexprefill(q, k, gamma=0.965, block_size=64)).all()
    assert (methods.flexprefill(q, k, preset="table1", block_size=64, min_budget=0).sum()
            > methods.flexprefill(q, k, block_size=64, min_budget=0).sum())
    assert (methods.flexprefill(q, k, preset="default", block_size=64)
            == methods.flexprefill(q, k, gamma=0.6, block_size=64)).all()
    assert (methods.xattention(q, k, preset="table1") == methods.xattention(q, k)).all()


def test_bad_arguments_name_themselves():
    q, k = clustered(1, 2, 256, 16)
    cases = [
        (lambda: methods.xattention(q, k, stride=3), "stride"),
        (lambda: methods.xattention(q, k, stride="8"), "stride"),
        (lambda: methods.xattention(q, k, threshold=[0.9, 0.9, 0.9]), "threshold"),
        (lambda: methods.xattention(q, k, threshold="high"), "threshold"),
        (lambda: methods.xattention(q, k, block_size=96), "block_size"),
        (lambda: methods.sparge(q, k, topk=1.5), "topk"),
        (lambda: methods.sparge(q, k, native_block=(64,)), "native_block"),
        (lambda: methods.sparge(q, k, smooth_k=1), "smooth_k"),
        (lambda: methods.minference(q, k, query_sample="first"), "query_sample"),
        (lambda: methods.minference(q, k, sampled_queries=0), "sampled_queries"),
        (lambda: methods.flexprefill(q, k, gamma=0), "gamma"),
        (lambda: methods.flexprefill(q, k, scale=float("nan")), "scale"),
        (lambda: methods.flexprefill(q, k[:, :, :100]), "k"),
        (lambda: methods.flexprefill(q[0, 0], k[0, 0]), "q"),
        (lambda: methods.sparge(q.astype(np.int32), k.astype(np.int32)), "q"),
        (lambda: methods.flexprefill(q, k, preset="paper"), "preset"),
        (lambda: methods.xattention(q, k, preset=1), "preset"),
    ]
    for call, argument in cases:
        with pytest.raises(ValueError, match=f"invalid argument '{argument}'"):
            call()


@pytest.mark.parametrize("generate", METHODS, ids=lambda f: f.__name__)
def test_nan_or_inf_in_q_or_k_is_refused_naming_the_first_one(generate):
    torch = pytest.importorskip("torch")
    q, k = clustered(1, 2, 300, 16, seed=8)
    k[0, 1, 250, 9] = -np.inf
    k[0, 1, 37, 5] = np.nan
    for framework in (np.asarray, torch.from_numpy):
        with pytest.raises(ValueError, match="invalid argument 'k': holds NaN at head 1, token 37, channel 5"):
            generate(framework(q), framework(k), block_size=64)
    q[0, 0, 299, 15] = np.inf  # a query that no method samples
    with pytest.raises(ValueError, match="invalid argument 'q': holds \\+inf at head 0, token 299, channel 15"):
        generate(q, k, block_size=64)
    assert generate(q, k, block_size=64, force_dense=True).all()  # reads no value


@pytest.mark.parametrize("name", methods.METHODS)
def test_python_defaults_are_the_cpp_defaults(name):
    cpp = methods.defaults(name)
    set_by_presets = {option for option, _ in wavealign._core.method_preset_options(name, "table1")}
    parameters = inspect.signature(getattr(methods, name)).parameters
    python = {keyword: parameter.default for keyword, parameter in parameters.items()
              if keyword not in ("q", "k", "preset")}
    assert python.keys() == cpp.keys()
    for keyword, default in python.items():
        assert default == (None if keyword in set_by_presets else cpp[keyword]), keyword
    # A call without options (preset "default") hands C++ its own defaults.
    resolved = getattr(methods, name)(methods._RESOLVE_ONLY, methods._RESOLVE_ONLY)
    assert wavealign._core.method_options(name, resolved) == wavealign._core.method_defaults(name)


def test_check_options_refuses_what_no_q_and_k_can_fix():
    methods.check_options("xattention", block_size=16, threshold=[0.9, 0.8, 0.7])  # counts need the heads
    methods.check_options("sparge", preset="table1", block_size=64)
    with pytest.raises(ValueError, match="invalid argument 'stride': must divide the block \\(16\\), got 32"):
        methods.check_options("xattention", block_size=16, stride=32)
    with pytest.raises(ValueError, match="invalid argument 'preset'"):
        methods.check_options("flexprefill", preset="paper")
    with pytest.raises(ValueError, match="invalid argument 'method'"):
        methods.check_options("dense")
    with pytest.raises(TypeError, match="stride"):
        methods.check_options("sparge", stride=8)


def test_from_sparge_or_reduces_its_native_map():
    rng = np.random.default_rng(3)
    seq_len = 700  # 11 query blocks of 64, 6 key blocks of 128
    native = rng.random((2, 3, 11, 6)) < 0.2
    mask = methods.from_sparge(native, seq_len=seq_len, native_block=(64, 128), block_size=128)
    assert mask.shape == (6, 6, 6)
    folded = native.reshape(6, 11, 6)
    expected = np.zeros((6, 6, 6), bool)
    for row in range(6):
        expected[:, row, :] = folded[:, 2 * row:2 * row + 2, :].any(axis=1)
    assert (mask == expected).all()
    fine = methods.from_sparge(native.astype(np.int8), seq_len=seq_len, native_block=(64, 128), block_size=64)
    assert (fine == np.repeat(folded, 2, axis=-1)[..., :11]).all()
    with pytest.raises(ValueError, match="invalid argument 'block_map'"):
        methods.from_sparge(native, seq_len=5000)


def test_from_xattention_keeps_or_repeats_its_blocks():
    rng = np.random.default_rng(4)
    mask = rng.random((1, 2, 4, 4)) < 0.5
    assert (methods.from_xattention(mask) == mask[0]).all()
    fine = methods.from_xattention(mask, seq_len=450, block_size=64)
    expected = np.repeat(np.repeat(mask[0], 2, axis=1), 2, axis=2)[:, :8, :8]
    assert fine.shape == (2, 8, 8) and (fine == expected).all()
    with pytest.raises(ValueError, match="invalid argument 'seq_len'"):
        methods.from_xattention(mask, block_size=64)


def test_from_minference_blocks_the_index_lists():
    vertical = np.array([[[[20]]]])       # [B, H, 1, v]: key 20 -> key block 1
    slash = np.array([[[0, 8, -40]]])     # [B, H, s]: offsets q - k
    mask = methods.from_minference(vertical, slash, seq_len=64, block_size=16)
    expected = np.array([[1, 1, 1, 1], [1, 1, 0, 1], [0, 1, 1, 0], [0, 1, 1, 1]], bool)
    assert (mask[0] == expected).all()
    with pytest.raises(ValueError, match="invalid argument 'vertical_indices'"):
        methods.from_minference(np.array([[[64]]]), slash, seq_len=64, block_size=16)
    with pytest.raises(ValueError, match="invalid argument 'slash_indices'"):
        methods.from_minference(vertical, np.array([[[0.5]]]), seq_len=64, block_size=16)


# ---- GPU ----------------------------------------------------------------------------------------------------

def _cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not getattr(wavealign._core, "has_mask_generators", False):
        pytest.skip("wavealign was built without its CUDA code (no GPU generators)")
    return torch


@pytest.mark.parametrize("generate", METHODS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gpu_generator_matches_the_cpu_reference(generate, dtype):
    torch = _cuda()
    q, k = clustered(2, 2, 1000, 64, seed=5)
    q_cuda = torch.from_numpy(q).to("cuda", getattr(torch, dtype))
    k_cuda = torch.from_numpy(k).to("cuda", getattr(torch, dtype))
    mask = generate(q_cuda, k_cuda, block_size=128)
    assert mask.is_cuda and mask.dtype == torch.bool and mask.shape == (4, 8, 8)
    reference = generate(q_cuda.float().cpu().numpy(), k_cuda.float().cpu().numpy(), block_size=128)
    differing = int((mask.cpu().numpy() != reference).sum())
    assert differing <= max(2, int(0.002 * reference.size)), f"{differing} of {reference.size} blocks differ"


def test_gpu_mask_plans_on_the_gpu_and_runs_the_kernel():
    torch = _cuda()
    q, k = clustered(1, 2, 1024, 128, seed=6)
    q_cuda = torch.from_numpy(q).to("cuda", torch.bfloat16)
    k_cuda = torch.from_numpy(k).to("cuda", torch.bfloat16)
    v_cuda = torch.randn_like(q_cuda)
    mask = methods.xattention(q_cuda, k_cuda)
    plan = wavealign.plan(mask)
    assert plan.planner == ("gpu" if wavealign._core.has_gpu_plan else "cpu")
    out = wavealign.sparse_attention(q_cuda, k_cuda, v_cuda, plan)
    assert out.shape == q_cuda.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("generate", METHODS, ids=lambda f: f.__name__)
def test_gpu_nan_gives_an_empty_mask_whose_record_every_consumer_raises(generate):
    torch = _cuda()
    q, k = clustered(1, 2, 1024, 64, seed=7)
    k[0, 1, 500, 3] = np.nan
    q_cuda, k_cuda = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (q, k))
    message = "invalid argument 'k': holds NaN at head 1, token 500, channel 3"
    mask = generate(q_cuda, k_cuda)
    with pytest.raises(ValueError, match=message):
        methods.check(mask)
    assert not mask.any(), "a mask of non-finite inputs keeps nothing"
    with pytest.raises(ValueError, match=message):
        wavealign.plan(mask, planner="cpu")
    if wavealign._core.has_gpu_plan:
        plan = wavealign.plan(mask)
        out = wavealign.sparse_attention(q_cuda, k_cuda, torch.randn_like(q_cuda), plan)
        assert torch.isnan(out).all(), "the kernel computes nothing from the plan of such a mask"
        with pytest.raises(ValueError, match=message):
            plan.check()
    methods.check(generate(q_cuda, q_cuda))  # finite inputs: nothing to raise


def test_gpu_rejects_float32_and_mixed_devices():
    torch = _cuda()
    q = torch.randn(2, 256, 64, device="cuda")
    with pytest.raises(ValueError, match="invalid argument 'q'"):
        methods.sparge(q, q)
    with pytest.raises(ValueError, match="invalid argument 'k'"):
        methods.sparge(q.to(torch.bfloat16), q.cpu())
