"""wavealign.fa4: FlashAttention-4's block-sparse forward in WaveAlign order.

On any machine (FA4's Python package imports without a GPU): the block-sparse tensors hold the permuted mask
(counts and ascending indices of row permutation[h, p] at row p) in the shapes FA4's own shape rules accept,
the FA4-layout helpers are Plan.permute_rows/unpermute_rows on the [B, H, L, d] view (exact round trips), and
bad arguments are refused naming them. On a GPU with FA4's sm_90 kernels (q, k, v [B, H, L, d] as for
wavealign.sparse_attention): FA4 in WaveAlign order, unpermuted,
equals FA4 in the original order bit for bit (O and LSE), and both equal SDPA with the token-level mask within
the bf16 tolerance of test_gpu.py (atol/rtol 2e-2; empty rows: O = 0, LSE = -inf).
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the FlashAttention-4 tests are skipped")
pytest.importorskip("flash_attn.cute", reason="FlashAttention-4 (flash-attn-4) is not installed")

import wavealign  # noqa: E402
import wavealign.bench  # noqa: E402
from wavealign import fa4  # noqa: E402
from wa_testing import expand_mask, random_mask  # noqa: E402


def named(argument):
    return pytest.raises(ValueError, match=f"invalid argument '{argument}'")


def rows_of(mask):
    """Per (head, row) the ascending list of kept KV blocks."""
    return [[list(np.flatnonzero(row)) for row in head] for head in mask]


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_block_sparse_tensors_hold_the_permuted_mask(framework):
    mask = random_mask(np.random.default_rng(3), 3, 11, 9, density=0.4)
    mask[1, 4] = False  # an empty row
    plan = wavealign.plan(mask if framework == "numpy" else torch.from_numpy(mask), wave_size=4, skip="never",
                          block_size=128)
    tensors = fa4.block_sparse_tensors(plan, 9 * 128 - 50)
    permutation = np.asarray(plan.permutation)
    assert tensors.block_size == (128, 128)
    assert tensors.mask_block_cnt.shape == (1, 3, 11) and not tensors.mask_block_cnt.any()
    counts, indices = tensors.full_block_cnt, tensors.full_block_idx
    assert counts.dtype == indices.dtype == torch.int32
    assert counts.shape == (1, 3, 11) and indices.shape == (1, 3, 11, int(mask.sum(-1).max()))
    original = rows_of(mask)
    for h in range(3):
        for p in range(11):
            kept = original[h][permutation[h, p]]
            assert counts[0, h, p] == len(kept)
            assert indices[0, h, p, :len(kept)].tolist() == kept
    assert fa4.block_sparse_tensors(plan, 9 * 128 - 50) is tensors  # made once per plan and shape


def test_block_sparse_tensors_read_the_kernels_csr_not_a_host_copy(monkeypatch):
    """The tensors come from the CSR the fused kernel reads (on a GPU plan's device: no copy through the host),
    not from Plan.csr(), which makes the user a host copy (a 76 MB round trip per plan at 9.5 M blocks)."""
    mask = random_mask(np.random.default_rng(5), 2, 7, 6, density=0.5)
    plan = wavealign.plan(torch.from_numpy(mask), wave_size=3, skip="never", block_size=128)
    expected = fa4.permuted_block_lists(plan, "cpu")

    def refuse(*args, **kwargs):
        raise AssertionError("Plan.csr() called")

    fresh = wavealign.plan(torch.from_numpy(mask), wave_size=3, skip="never", block_size=128)
    monkeypatch.setattr(type(fresh), "csr", refuse)
    counts, indices = fa4.permuted_block_lists(fresh, "cpu")
    assert torch.equal(counts, expected[0]) and torch.equal(indices, expected[1])


def test_block_sparse_tensors_pass_fa4_shape_rules():
    from flash_attn.cute.block_sparsity import infer_block_sparse_expected_shapes

    mask = random_mask(np.random.default_rng(4), 8, 6, 6)
    plan = wavealign.plan(mask, wave_size=2, skip="never")
    for heads, batch in ((8, 1), (4, 2)):  # a mask shared by the batch, and one per batch entry
        tensors = fa4.block_sparse_tensors(plan, 6 * 128 - 1, heads=heads)
        assert tensors.full_block_cnt.shape == (batch, heads, 6)
        count_shape, index_shape, q_subtile = infer_block_sparse_expected_shapes(
            tensors, batch_size=batch, num_head=heads, seqlen_q=6 * 128, seqlen_k=6 * 128 - 1, m_block_size=128,
            n_block_size=128, q_stage=1, context="", sparse_block_size_q=128, sparse_block_size_kv=128)
        assert count_shape == (batch, heads, 6) and index_shape == (batch, heads, 6, 6) and q_subtile == 1


def test_flex_plan_batch_and_heads_and_partial_blocks():
    from torch.nn.attention.flex_attention import create_block_mask

    def band(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < 200

    partial = wavealign.plan(create_block_mask(band, 2, 3, 1024, 1024, device="cpu"), wave_size=4, skip="never")
    with named("plan"):
        fa4.block_sparse_tensors(partial, 1024)

    def everything(b, h, q_idx, kv_idx):
        return q_idx >= 0

    full = wavealign.plan(create_block_mask(everything, 2, 3, 1024, 1024, device="cpu"), wave_size=4, skip="never")
    tensors = fa4.block_sparse_tensors(full, 1024)
    assert tensors.full_block_cnt.shape == (2, 3, 8) and (tensors.full_block_cnt == 8).all()


def test_fa4_layout_helpers_are_the_plan_methods():
    mask = random_mask(np.random.default_rng(5), 2, 5, 5)
    plan = wavealign.plan(mask, wave_size=2, skip="never", block_size=16)
    x = torch.randn(3, 70, 2, 8)  # [B, L, H, d], a partial last block
    permuted = fa4.permute_rows(plan, x)
    assert permuted.shape == (3, 80, 2, 8)
    assert torch.equal(permuted, plan.permute_rows(x.transpose(1, 2)).transpose(1, 2))
    assert torch.equal(fa4.unpermute_rows(plan, permuted, seq_len=70), x)
    with named("x"):
        fa4.permute_rows(plan, x[0])
    with named("o"):
        fa4.unpermute_rows(plan, np.zeros((3, 80, 2, 8)))


@pytest.mark.parametrize("mask_heads", [1, 2, 6])  # broadcast over batch and heads, per head, per (batch, head)
@pytest.mark.parametrize("length", [80, 70])  # whole blocks, a partial last block
def test_fa4_layout_gather_equals_the_plan_methods_on_every_head_layout(mask_heads, length):
    mask = random_mask(np.random.default_rng(mask_heads), mask_heads, 5, 5)
    plan = wavealign.plan(mask, wave_size=2, skip="never", block_size=16)
    x = torch.randn(3, length, 2, 8)  # [B, L, H, d], contiguous: the gather in FA4's layout
    permuted = fa4.permute_rows(plan, x)
    assert permuted.is_contiguous() and permuted.shape == (3, 80, 2, 8)
    assert torch.equal(permuted, plan.permute_rows(x.transpose(1, 2)).transpose(1, 2))
    o = torch.randn(3, 80, 2, 8)
    assert torch.equal(fa4.unpermute_rows(plan, o, seq_len=length),
                       plan.unpermute_rows(o.transpose(1, 2), seq_len=length).transpose(1, 2))
    # A non-contiguous input takes the [B, H, L, d] path and gives the same tokens.
    strided = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert not strided.is_contiguous() and torch.equal(fa4.permute_rows(plan, strided), permuted)
    with named("o"):
        fa4.unpermute_rows(plan, torch.zeros(3, 64, 2, 8))
    if mask_heads > 1:  # a one-head mask is broadcast over any heads
        with named("x"):
            fa4.permute_rows(plan, torch.zeros(3, 70, 4, 8))  # 4 heads for a 2-head (or 6 = 3 x 2) mask
    with named("x"):
        fa4.permute_rows(plan, x.clone().requires_grad_())


def test_bad_arguments_are_refused():
    mask = random_mask(np.random.default_rng(6), 2, 4, 4)
    plan = wavealign.plan(mask, wave_size=2, skip="never")
    with named("plan"):
        fa4.block_sparse_tensors(mask, 512)
    with named("seq_len"):
        fa4.block_sparse_tensors(plan, 1000)
    with named("seq_len"):
        fa4.block_sparse_tensors(plan, "512")
    with named("heads"):
        fa4.block_sparse_tensors(plan, 512, heads=3)
    q = torch.zeros(1, 2, 512, 64, dtype=torch.bfloat16)
    with named("q"):
        fa4.sparse_attention(q, q, q, plan)  # a CPU tensor
    with named("q"):
        fa4.sparse_attention(np.zeros((1, 2, 512, 64), np.float32), q, q, plan)


def test_importing_wavealign_fa4_does_not_import_flash_attn():
    code = "import sys, wavealign, wavealign.fa4; print('flash_attn' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


# ---- on the GPU ---------------------------------------------------------------------------------------------

def _fa4_gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() < (9, 0):
        return "FlashAttention-4's block-sparse forward needs sm_90 or newer"
    return None


needs_fa4_gpu = pytest.mark.skipif(_fa4_gpu_skip_reason() is not None, reason=_fa4_gpu_skip_reason() or "")


def _case(batch, heads, mask_heads, length, seed):
    rng = np.random.default_rng(seed)
    blocks = -(-length // 128)
    mask = random_mask(rng, mask_heads, blocks, blocks, density=0.3)
    mask[0, 1] = False  # an empty row
    generator = torch.Generator(device="cuda").manual_seed(seed)
    # [B, H, L, d] views of [B, L, H, d] projections, as wavealign.sparse_attention takes them.
    q, k, v = (torch.randn(batch, length, heads, 128, device="cuda", dtype=torch.bfloat16, generator=generator)
               .transpose(1, 2) for _ in range(3))
    return mask, q, k, v


@needs_fa4_gpu
@pytest.mark.parametrize("batch,heads,mask_heads,length", [(1, 4, 4, 4096), (2, 2, 4, 3000), (2, 3, 3, 1100)])
def test_fa4_in_wavealign_order_equals_fa4_in_the_original_order_and_sdpa(batch, heads, mask_heads, length):
    mask, q, k, v = _case(batch, heads, mask_heads, length, seed=batch * 10 + heads)
    device_mask = torch.from_numpy(mask).cuda()
    reordered = wavealign.plan(device_mask, skip="never", wave_size=8)
    original = wavealign.plan(device_mask, order="original", skip="never")
    assert not torch.equal(reordered.permutation, original.permutation)
    o, lse = fa4.sparse_attention(q, k, v, reordered, return_lse=True)
    o_original, lse_original = fa4.sparse_attention(q, k, v, original, return_lse=True)
    assert o.shape == q.shape and lse.shape == (batch, heads, length)
    assert torch.equal(o, o_original) and torch.equal(lse, lse_original)

    token_mask = torch.from_numpy(expand_mask(mask, length, 128, 128)).cuda()
    token_mask = token_mask.view(-1 if mask_heads != heads else 1, heads, length, length)
    q32, k32, v32 = (x.float() for x in (q, k, v))
    scores = (q32 @ k32.transpose(-1, -2)) / 128 ** 0.5
    expected_lse = torch.logsumexp(scores.masked_fill(~token_mask, float("-inf")), dim=-1)
    weights = torch.softmax(scores.masked_fill(~token_mask, float("-inf")), dim=-1).nan_to_num(0.0)
    expected = weights @ v32
    empty = torch.isinf(expected_lse)
    assert empty.any() and torch.isinf(lse[empty]).all() and (lse[empty] < 0).all()
    assert (o[empty] == 0).all()
    torch.testing.assert_close(o.float(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[~empty], expected_lse[~empty], atol=2e-2, rtol=2e-2)
    o3 = fa4.sparse_attention(q[0], k[0], v[0], wavealign.plan(device_mask[:heads], skip="never", wave_size=8))
    assert o3.shape == q[0].shape


@needs_fa4_gpu
def test_hand_written_plug_in_path_equals_the_convenience_call():
    from flash_attn.cute import flash_attn_func

    mask, q, k, v = _case(1, 4, 4, 2048, seed=7)
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), skip="never", wave_size=8)
    tensors = fa4.block_sparse_tensors(plan, 2048, device=q.device)
    q_fa4, k_fa4, v_fa4 = (x.transpose(1, 2) for x in (q, k, v))  # [B, L, H, d]
    o_perm, _ = flash_attn_func(fa4.permute_rows(plan, q_fa4), k_fa4, v_fa4, block_sparse_tensors=tensors)
    assert torch.equal(fa4.unpermute_rows(plan, o_perm, seq_len=2048).transpose(1, 2),
                       fa4.sparse_attention(q, k, v, plan))


def test_benchmark_skips_fa4_rows_with_a_reason_without_flash_attn():
    """wavealign.bench (and bench/gpu/bench_peers.py through it): without flash_attn.cute the FA4 rows are
    skipped, saying why."""
    bench = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"
    code = ("import sys; sys.modules['flash_attn'] = None; sys.path.insert(0, sys.argv[1]); import bench_peers; "
            "fa4, reason = bench_peers.fa4_or_reason(); print(fa4 is None, reason)")
    result = subprocess.run([sys.executable, "-c", code, str(bench)], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("True flash_attn.cute is not importable")
    assert wavealign.bench.fa4_or_reason()[1] is None  # here it imports


def run_bench_module(*args):
    return subprocess.run([sys.executable, "-m", "wavealign.bench", *map(str, args)], capture_output=True, text=True)


def test_bench_module_without_a_gpu_says_so_and_checks_its_arguments(tmp_path):
    mask = random_mask(np.random.default_rng(8), 2, 6, 6)
    np.save(tmp_path / "mask.npy", mask)
    plan = wavealign.plan(mask, skip="never", wave_size=2)
    np.save(tmp_path / "perm.npy", plan.permutation)
    np.save(tmp_path / "bad-perm.npy", np.zeros((2, 6), np.int32))
    good = ["--mask", tmp_path / "mask.npy", "--perm", "original", "--perm", f"wavealign={tmp_path / 'perm.npy'}"]
    result = run_bench_module(*good)
    assert result.returncode == 0, result.stderr
    if not torch.cuda.is_available():
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        assert rows == [{"skipped": impl, "reason": "no CUDA device"} for impl in wavealign.bench.IMPLS]
    for bad, message in (([f"--perm=bad={tmp_path / 'bad-perm.npy'}"], "argument --perm: "),
                         (["--perm", "original"], "argument --perm: 'original' needs a new order name"),
                         (["--impls", "fa3"], "argument --impls: "), (["--warmup-ms", "nan"], "argument --warmup-ms: "),
                         (["--iters", "0"], "argument --iters: ")):
        result = run_bench_module(*good, *bad)
        assert result.returncode == 2 and message in result.stderr, (bad, result.stderr)
    assert "must hold one permutation" in run_bench_module(*good[:2], f"--perm=bad={tmp_path / 'bad-perm.npy'}").stderr
    np.save(tmp_path / "float-mask.npy", mask.astype(np.float32))
    result = run_bench_module("--mask", tmp_path / "float-mask.npy")
    assert result.returncode == 2 and "argument --mask" in result.stderr


def test_clock_sampler_reports_its_fields_with_or_without_nvml():
    sampler = wavealign.bench.ClockSampler()
    assert sampler.stop() == dict.fromkeys(wavealign.bench.ClockSampler.FIELDS)  # never started
    sampler.start(0)
    stats = sampler.stop()
    assert set(stats) == set(wavealign.bench.ClockSampler.FIELDS)
    assert all(value is None or value >= 0 for value in stats.values())


@needs_fa4_gpu
def test_bench_module_times_fa4_and_flex_in_each_order_on_the_gpu(tmp_path):
    mask = random_mask(np.random.default_rng(9), 2, 16, 16, density=0.3)
    np.save(tmp_path / "mask.npy", mask)
    np.save(tmp_path / "perm.npy", wavealign.plan(mask, skip="never", wave_size=8).permutation)
    result = run_bench_module("--mask", tmp_path / "mask.npy", "--perm", "original",
                              "--perm", f"wavealign={tmp_path / 'perm.npy'}", "--warmup-ms", "0", "--iters", "2")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    timings = [row for row in rows if "ms" in row]
    # SpargeAttn is built from source, so it is timed where spas_sage_attn imports and reported skipped elsewhere.
    sparge_skipped = [row for row in rows if row.get("skipped") == "spargeattn"]
    assert len(sparge_skipped) == (wavealign.bench.sparge_or_reason()[0] is None)
    impls = [impl for impl in wavealign.bench.IMPLS if not (impl == "spargeattn" and sparge_skipped)]
    assert [(row["impl"], row["order"]) for row in timings] == [
        (impl, order) for impl in impls for order in ("original", "wavealign")]
    assert all(row["ms"] > 0 and row["tflops"] > 0 and row["nnz_blocks"] == int(mask.sum()) for row in timings)
    checks = [row for row in rows if "check" in row]
    assert len(checks) == len(impls) and all(row["bitwise_equal"] for row in checks), checks
