"""wavealign with PyTorch CPU tensors: framework round trips, custom ops, FlexAttention masks, nn, torch.compile."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch integration tests are skipped")

import wavealign  # noqa: E402
from wa_testing import csr_of, dense_attention, expand_mask, random_mask  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(13)


def test_torch_masks_give_torch_plans(rng):
    mask = random_mask(rng, 2, 24, 24)
    reference = wavealign.plan(mask, wave_size=4, skip="never")
    for tensor in (torch.from_numpy(mask), torch.from_numpy(mask.astype(np.uint8))):
        plan = wavealign.plan(tensor, wave_size=4, skip="never")
        assert isinstance(plan.permutation, torch.Tensor) and plan.permutation.dtype == torch.int32
        assert torch.equal(plan.permutation, torch.from_numpy(reference.permutation))
        assert torch.equal(plan.inverse, torch.from_numpy(reference.inverse))
        assert torch.equal(plan.schedule(), torch.from_numpy(reference.schedule()))
        permuted = plan.permuted_mask()
        assert permuted.dtype == tensor.dtype
        assert np.array_equal(permuted.numpy().astype(bool), reference.permuted_mask())
    row_ptr, col_idx = csr_of(mask)
    plan = wavealign.plan((torch.from_numpy(row_ptr), torch.from_numpy(col_idx)), heads=2, kv_blocks=24, wave_size=4,
                          skip="never")
    permuted_row_ptr, permuted_col_idx = plan.permuted_mask()
    assert permuted_row_ptr.dtype == torch.int64 and permuted_col_idx.dtype == torch.int32
    assert np.array_equal(permuted_col_idx.numpy(), csr_of(reference.permuted_mask())[1])


def test_permute_rows_matches_numpy_and_round_trips(rng):
    plan = wavealign.plan(random_mask(rng, 3, 6, 6), wave_size=2, skip="never", block_size=8)
    x = rng.standard_normal((2, 3, 45, 4)).astype(np.float32)
    permuted = plan.permute_rows(torch.from_numpy(x))
    assert permuted.shape == (2, 3, 48, 4)
    assert np.array_equal(permuted.numpy(), plan.permute_rows(x))
    assert torch.equal(plan.unpermute_rows(permuted, seq_len=45), torch.from_numpy(x))
    bf16 = torch.from_numpy(x).to(torch.bfloat16)
    assert torch.equal(plan.unpermute_rows(plan.permute_rows(bf16), seq_len=45), bf16)


def test_permute_rows_keeps_the_input_layout_and_reads_any_strides(rng):
    plan = wavealign.plan(random_mask(rng, 3, 6, 6), wave_size=2, skip="never", block_size=8)
    x = torch.from_numpy(rng.standard_normal((2, 45, 3, 4)).astype(np.float32))  # [B, L, H, d] memory
    view = x.transpose(1, 2)  # its [B, H, L, d] view
    expected = plan.permute_rows(view.contiguous())
    permuted = plan.permute_rows(view)
    assert torch.equal(permuted, expected)
    assert permuted.transpose(1, 2).is_contiguous()  # laid out like x: [B, MB*block, H, d] in memory
    restored = plan.unpermute_rows(permuted, seq_len=45)
    assert torch.equal(restored, view) and restored.transpose(1, 2).is_contiguous()
    # Memory that is not a dense layout of [..., L, d] rows: an expanded batch, every other head, d strided.
    for odd in (view[:1].expand(2, -1, -1, -1), torch.from_numpy(rng.standard_normal((2, 6, 45, 4)).astype(
            np.float32))[:, ::2], view.transpose(-1, -2).contiguous().transpose(-1, -2)):
        assert torch.equal(plan.permute_rows(odd), plan.permute_rows(odd.contiguous()))
    wavealign.ops.register()
    permutation, inverse = plan._views(x.device)[:2]
    torch.library.opcheck(torch.ops.wavealign.permute_rows.default, (view, permutation, 8))
    torch.library.opcheck(torch.ops.wavealign.unpermute_rows.default, (permuted, inverse, 8, 45))
    # The fake kernels promise the same layout (a compiled graph plans its buffers from them).
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in (view, permutation, permuted, inverse)]
        fake_permuted = torch.ops.wavealign.permute_rows(fakes[0], fakes[1], 8)
        fake_restored = torch.ops.wavealign.unpermute_rows(fakes[2], fakes[3], 8, 45)
    assert fake_permuted.stride() == permuted.stride() and fake_restored.stride() == restored.stride()


def test_sparse_attention_on_cpu_tensors_runs_the_reference(rng):
    mask = random_mask(rng, 4, 8, 8)
    plan = wavealign.plan(mask, wave_size=4, skip="never", block_size=16)
    q, k, v = (rng.standard_normal((2, 2, 128, 16)).astype(np.float32) for _ in range(3))
    expected, expected_lse = wavealign.sparse_attention(q, k, v, plan, return_lse=True)
    o, lse = wavealign.sparse_attention(*(torch.from_numpy(x) for x in (q, k, v)), plan, return_lse=True)
    assert np.array_equal(o.numpy(), expected) and np.array_equal(lse.numpy(), expected_lse)
    o16 = wavealign.sparse_attention(*(torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v)), plan)
    assert o16.dtype == torch.bfloat16
    assert torch.allclose(o16.float(), o, atol=3e-2, rtol=3e-2)


def test_custom_ops_are_registered_with_consistent_fake_kernels(rng):
    wavealign.ops.register()
    plan = wavealign.plan(random_mask(rng, 2, 4, 4), wave_size=2, skip="never", block_size=8)
    x = torch.randn(2, 30, 8)
    permutation, inverse = plan._views(x.device)[:2]
    torch.library.opcheck(torch.ops.wavealign.permute_rows.default, (x, permutation, 8))
    torch.library.opcheck(torch.ops.wavealign.unpermute_rows.default, (torch.randn(2, 32, 8), inverse, 8, 30))
    for batch in (1, 3):
        q, k, v = (torch.randn(batch, 2, 32, 8) for _ in range(3))
        row_ptr, col_idx, schedule, error = plan._launch_tensors(q.device, batch, 2, "sequential")
        assert schedule.shape == (batch * 2 * 4, 2)
        torch.library.opcheck(torch.ops.wavealign.sparse_attention.default,
                              (q, k, v, row_ptr, col_idx, schedule, error, 8, 8, 0.35, "ascending", "auto"))


def flex_block_mask(mask, block, seq_len):
    from torch.nn.attention.flex_attention import BlockMask

    counts = torch.from_numpy(mask.sum(-1).astype(np.int32))[None]
    indices = torch.from_numpy(np.argsort(~mask, axis=-1, kind="stable").astype(np.int32))[None]
    return BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=block, seq_lengths=(seq_len, seq_len))


def test_flex_block_masks_in_and_out(rng):
    mask = random_mask(rng, 2, 6, 6)
    flex_in = flex_block_mask(mask, 16, 96)
    plan = wavealign.plan(flex_in, wave_size=2, skip="never")
    assert np.array_equal(plan.permutation.numpy(), wavealign.plan(mask, wave_size=2, skip="never").permutation)
    assert plan.block_size == (16, 16)
    permuted = wavealign.flex.block_mask(plan, 96)
    assert permuted.BLOCK_SIZE == (16, 16)
    dense = permuted.to_dense()[0].bool().numpy()
    expected = np.stack([mask[h][plan.permutation[h].numpy()] for h in range(2)])
    assert np.array_equal(dense, expected)
    assert np.array_equal(plan.permuted_mask().to_dense()[0].bool().numpy(), expected)


def test_flex_masks_with_full_blocks_and_mask_mod(rng):
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    block_mask = create_block_mask(causal, 1, 2, 128, 128, device="cpu", BLOCK_SIZE=16)
    plan = wavealign.plan(block_mask, order="shuffled", seed=1)
    dense = block_mask.to_dense()[0].bool().numpy()
    assert np.array_equal(plan.permuted_mask().to_dense()[0].bool().numpy(),
                          np.stack([dense[h][plan.permutation[h].numpy()] for h in range(2)]))
    assert int(plan.csr()[0][-1]) == int(dense.sum())


def test_module_caches_plans_by_content_or_key(rng):
    mask = torch.from_numpy(random_mask(rng, 2, 8, 8))
    attention = wavealign.nn.SparseAttention(block_size=16, wave_size=4, skip="never")
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    o = attention(q, k, v, mask)
    first = attention.plan_for(mask)
    assert attention.plan_for(mask) is first
    assert attention.plan_for(mask.clone()) is first  # the same content
    assert torch.equal(o, wavealign.sparse_attention(q, k, v, first))
    mask[0, 0, 7] = ~mask[0, 0, 7]
    assert attention.plan_for(mask) is not first
    keyed = attention.plan_for(mask, mask_key="layer0")
    assert attention.plan_for(None, mask_key="layer0") is keyed
    with pytest.raises(ValueError, match="block_mask"):
        attention(q, k, v, None, mask_key="unknown")


@pytest.mark.parametrize("make", [torch.from_numpy, np.copy], ids=["torch", "numpy"])
def test_module_replans_a_mask_edited_through_a_view(rng, make):
    # The same mask object, its version counter untouched: the edit goes through a numpy view.
    def view_of(mask):
        return mask.numpy() if isinstance(mask, torch.Tensor) else mask

    mask = make(random_mask(rng, 2, 8, 8))
    attention = wavealign.nn.SparseAttention(block_size=16, wave_size=4, skip="never")
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    before = attention(q, k, v, mask)
    view_of(mask)[1] = True
    edited = wavealign.plan(np.array(view_of(mask)), block_size=16, wave_size=4, skip="never")
    after = attention(q, k, v, mask)
    assert not torch.equal(after, before)
    assert torch.equal(after, wavealign.sparse_attention(q, k, v, edited))


class PlugInBlock(torch.nn.Module):
    """Attention through the custom ops: permute queries, attend in plan order, unpermute."""

    def __init__(self, plan, seq_len):
        super().__init__()
        self.plan = plan
        self.seq_len = seq_len

    def forward(self, q, k, v):
        o = wavealign.sparse_attention(q * 2, k, v, self.plan)
        permuted = self.plan.permute_rows(o)
        return self.plan.unpermute_rows(permuted + 1, seq_len=self.seq_len)


def test_compile_fullgraph_traces_the_ops(rng):
    plan = wavealign.plan(torch.from_numpy(random_mask(rng, 2, 4, 4)), wave_size=2, skip="never", block_size=8)
    q, k, v = (torch.randn(1, 2, 30, 8) for _ in range(3))
    module = PlugInBlock(plan, 30)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    traced = compiled(q, k, v)  # first: a plan of a torch mask needs no eager warm-up call
    assert torch.equal(traced, module(q, k, v))


def test_expanded_mask_oracle_matches_sdpa_on_cpu(rng):
    """The GPU tests compare the kernel with SDPA on the expanded mask; check that oracle once here."""
    mask = random_mask(rng, 2, 4, 4)
    plan = wavealign.plan(mask, wave_size=2, skip="never", block_size=8)
    q, k, v = (torch.randn(1, 2, 32, 8, dtype=torch.float64) for _ in range(3))
    token_mask = torch.from_numpy(expand_mask(mask, 32, 8, 8))[None]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=token_mask)
    assert torch.allclose(wavealign.sparse_attention(q, k, v, plan), expected, atol=1e-5)


def test_a_batch_runs_in_one_call_with_shared_and_per_batch_masks(rng, monkeypatch):
    batch, heads, length, dim, block = 3, 2, 120, 16, 16  # 8 query blocks, the last one partial
    q, k, v = (rng.standard_normal((batch, heads, length, dim)).astype(np.float32) for _ in range(3))
    calls = []
    reference = wavealign._core.reference_attention
    monkeypatch.setattr(wavealign._core, "reference_attention", lambda *args: calls.append(1) or reference(*args))
    for mask in (random_mask(rng, heads, 8, 8), random_mask(rng, batch * heads, 8, 8)):
        plan = wavealign.plan(torch.from_numpy(mask), wave_size=4, skip="never", block_size=block)
        token_mask = expand_mask(mask, length, block, block)
        token_mask = token_mask[None] if len(mask) == heads else token_mask.reshape(batch, heads, length, length)
        expected, expected_lse = dense_attention(q, k, v, token_mask, dim ** -0.5)
        for head_order in ("sequential", "concurrent-heads"):
            calls.clear()
            o, lse = wavealign.sparse_attention(*(torch.from_numpy(x) for x in (q, k, v)), plan, return_lse=True,
                                                head_order=head_order)
            assert len(calls) == 1  # the whole batch in one call of the reference (one launch on CUDA)
            assert o.shape == (batch, heads, length, dim) and lse.shape == (batch, heads, length)
            assert np.allclose(o.numpy(), expected, atol=2e-5, rtol=1e-4)
            assert np.allclose(lse.numpy(), expected_lse, atol=2e-5)
        # One schedule over all B*H entries, batch-major: entry b*H + h, every query block once.
        _, _, schedule, _ = plan._launch_tensors(torch.device("cpu"), batch, heads, "sequential")
        assert np.array_equal(schedule[:, 0].numpy(), np.repeat(np.arange(batch * heads), 8))
        for entry in range(batch * heads):
            assert sorted(schedule[schedule[:, 0] == entry, 1].tolist()) == list(range(8))


def test_inputs_that_require_grad_are_refused_up_front(rng):
    plan = wavealign.plan(torch.from_numpy(random_mask(rng, 2, 4, 4)), wave_size=2, skip="never", block_size=8)
    inputs = [torch.randn(1, 2, 32, 8) for _ in range(3)]
    for i, name in enumerate("qkv"):
        args = list(inputs)
        args[i] = args[i].clone().requires_grad_()
        with pytest.raises(ValueError, match=f"invalid argument '{name}': requires grad.*torch.no_grad"):
            wavealign.sparse_attention(*args, plan)
        with torch.no_grad():
            assert wavealign.sparse_attention(*args, plan).grad_fn is None
        with torch.inference_mode():
            assert torch.equal(wavealign.sparse_attention(*args, plan), wavealign.sparse_attention(*inputs, plan))
    module = wavealign.nn.SparseAttention(block_size=8, wave_size=2, skip="never")
    with pytest.raises(ValueError, match="invalid argument 'q': requires grad"):
        module(inputs[0].clone().requires_grad_(), inputs[1], inputs[2], plan.permuted_mask())
    x = torch.randn(2, 30, 8, requires_grad=True)
    with pytest.raises(ValueError, match="invalid argument 'x': requires grad"):
        plan.permute_rows(x)
    with pytest.raises(ValueError, match="invalid argument 'o': requires grad"):
        plan.unpermute_rows(torch.randn(2, 32, 8, requires_grad=True))
    # The ops called directly refuse it too, before returning anything that would record a backward.
    permutation, inverse = plan._views(x.device)[:2]
    with pytest.raises(ValueError, match="invalid argument 'x': requires grad"):
        torch.ops.wavealign.permute_rows(x, permutation, 8)
    with pytest.raises(ValueError, match="invalid argument 'x': requires grad"):
        torch.ops.wavealign.unpermute_rows(torch.randn(2, 32, 8, requires_grad=True), inverse, 8, 30)
    launch = plan._launch_tensors(x.device, 1, 2, "sequential")
    with pytest.raises(ValueError, match="invalid argument 'v': requires grad"):
        torch.ops.wavealign.sparse_attention(inputs[0], inputs[1], inputs[2].clone().requires_grad_(), *launch, 8, 8,
                                             0.3, "ascending", "auto")
    with torch.no_grad():
        torch.ops.wavealign.permute_rows(x, permutation, 8)


def test_plan_tensors_are_trusted_until_written_in_place(rng):
    plan = wavealign.plan(torch.from_numpy(random_mask(rng, 2, 6, 6)), wave_size=2, skip="never", block_size=8)
    row_ptr, col_idx, schedule, _ = plan._launch_tensors(torch.device("cpu"), 2, 2, "concurrent-heads")
    for tensor in (plan.permutation, plan.inverse, row_ptr, col_idx, schedule):
        assert wavealign.ops.is_trusted(tensor)
        assert not wavealign.ops.is_trusted(tensor.clone())
    permutation = plan.permutation
    permutation[0, :1] = permutation[0, :1]  # an in-place write through a view, even of the same values
    assert not wavealign.ops.is_trusted(permutation)


def test_attention_op_checks_its_schedule_csr_and_record(rng):
    plan = wavealign.plan(torch.from_numpy(random_mask(rng, 2, 4, 4)), wave_size=2, skip="never", block_size=8)
    q, k, v = (torch.randn(1, 2, 32, 8) for _ in range(3))
    row_ptr, col_idx, schedule, error = plan._launch_tensors(q.device, 1, 2, "sequential")
    good = {"row_ptr": row_ptr, "col_idx": col_idx, "schedule": schedule, "mask_error": error, "q_block": 8,
            "kv_block": 8}

    def call(**changes):
        args = {**good, **changes}
        return torch.ops.wavealign.sparse_attention(q, k, v, args["row_ptr"], args["col_idx"], args["schedule"],
                                                    args["mask_error"], args["q_block"], args["kv_block"], 0.3,
                                                    "ascending", "auto")

    repeated, outside = schedule.clone(), schedule.clone()
    repeated[1] = repeated[0]
    outside[0, 0] = 2
    decreasing = row_ptr.clone()
    decreasing[2] = decreasing[3] + 1
    descending = col_idx.clone()
    descending[:2] = col_idx[:2].flip(0)
    assert row_ptr[1] >= 2  # row 0 has two blocks, so the flip breaks its order
    for changes, argument in [({"schedule": repeated}, "schedule"), ({"schedule": outside}, "schedule"),
                              ({"schedule": schedule[:-1]}, "schedule"), ({"schedule": schedule.long()}, "schedule"),
                              ({"row_ptr": decreasing}, "row_ptr"), ({"row_ptr": row_ptr.int()}, "row_ptr"),
                              ({"row_ptr": row_ptr[:-1]}, "row_ptr"), ({"col_idx": col_idx + 4}, "col_idx"),
                              ({"col_idx": descending}, "col_idx"), ({"mask_error": torch.zeros(1)}, "mask_error"),
                              ({"q_block": 0}, "q_block"), ({"kv_block": 2**40}, "kv_block")]:
        with pytest.raises(ValueError, match=f"invalid argument '{argument}'"):
            call(**changes)
    o, lse = call()
    assert torch.equal(o, wavealign.sparse_attention(q, k, v, plan, scale=0.3))
    o, lse = call(mask_error=torch.ones(1, dtype=torch.int32))  # an invalid mask's record: nothing computed
    assert o.isnan().all() and lse.isnan().all()


def band(b, h, q_idx, kv_idx):  # the mask_mod of the docs' FlexAttention example
    return (q_idx - kv_idx).abs() < 200


def test_flex_masks_with_token_masking_are_refused_and_kept_by_the_plug_in_path():
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

    length = 1024
    block_mask = create_block_mask(band, 1, 4, length, length, device="cpu")
    plan = wavealign.plan(block_mask, wave_size=4, skip="never")
    assert plan.source_block_mask is block_mask
    q, k, v = (torch.randn(1, 4, length, 64) for _ in range(3))
    positions = torch.arange(length)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=band(0, 0, positions[:, None], positions[None, :]))
    with pytest.raises(ValueError, match="invalid argument 'plan'.*mask_mod.*wavealign.flex.block_mask"):
        wavealign.sparse_attention(q, k, v, plan)
    # The plug-in path keeps the mask_mod: FlexAttention in plan order equals SDPA on the token-level mask.
    o_perm = flex_attention(plan.permute_rows(q), k, v, block_mask=wavealign.flex.block_mask(plan, length))
    torch.testing.assert_close(plan.unpermute_rows(o_perm, seq_len=length), expected, atol=1e-5, rtol=1e-5)
    # What the refusal prevents: the same blocks computed in full miss the band by far.
    whole = BlockMask.from_kv_blocks(block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
                                     block_mask.full_kv_indices)
    assert (wavealign.sparse_attention(q, k, v, wavealign.plan(whole, skip="never")) - expected).abs().max() > 0.1
    # A mask_mod whose blocks are all full masks no token inside a block: that plan runs, exactly.
    block_causal = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx // 128 >= kv_idx // 128, 1, 4, length, length,
                                     device="cpu")
    assert not block_causal.kv_num_blocks.any()
    o = wavealign.sparse_attention(q, k, v, wavealign.plan(block_causal, wave_size=4, skip="never"))
    causal = positions[:, None] // 128 >= positions[None, :] // 128
    torch.testing.assert_close(o, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal),
                               atol=1e-5, rtol=1e-5)


# ---- on a CUDA device (skipped without one) ---------------------------------------------------------------------

needs_cuda_kernel = pytest.mark.skipif(not (torch.cuda.is_available() and wavealign.has_cuda),
                                       reason="no CUDA device, or wavealign was built without its CUDA kernels")


@needs_cuda_kernel
@pytest.mark.parametrize("per_batch", [False, True])
def test_cuda_batch_in_one_launch_equals_a_call_per_entry(rng, monkeypatch, per_batch):
    batch, heads, length, dim, block = 3, 2, 1000, 128, 128  # 8 query blocks, the last one partial
    mask = random_mask(rng, batch * heads if per_batch else heads, 8, 8, density=0.4)
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), wave_size=4, skip="never", block_size=block)
    q = torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(batch, 2, heads, length, dim, device="cuda", dtype=torch.bfloat16)
    k, v = kv[:, 0], kv[:, 1]  # batch stride 2*H*L*d, q's is H*L*d: each tensor keeps its own
    launches = []
    launch = wavealign._core.cuda_sparse_attention
    monkeypatch.setattr(wavealign._core, "cuda_sparse_attention", lambda *args: launches.append(1) or launch(*args))
    o, lse = wavealign.sparse_attention(q, k, v, plan, return_lse=True, head_order="concurrent-heads")
    assert len(launches) == 1
    for b in range(batch):
        entry_mask = mask[b * heads:(b + 1) * heads] if per_batch else mask
        entry_plan = wavealign.plan(torch.from_numpy(entry_mask).cuda(), order="original", block_size=block)
        o_b, lse_b = wavealign.sparse_attention(q[b], k[b], v[b], entry_plan, return_lse=True)
        assert torch.equal(o[b], o_b) and torch.equal(lse[b], lse_b)  # every row's arithmetic is its own
    token_mask = torch.from_numpy(expand_mask(mask, length, block, block)).cuda()
    token_mask = token_mask.view(batch, heads, length, length) if per_batch else token_mask[None]
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=token_mask)
    torch.testing.assert_close(o.float(), expected, atol=2e-2, rtol=2e-2)


@needs_cuda_kernel
def test_cuda_ops_check_untrusted_permutations_and_schedules_on_the_device(rng):
    plan = wavealign.plan(torch.from_numpy(random_mask(rng, 2, 8, 8)).cuda(), wave_size=4, skip="never",
                          block_size=128)
    x = torch.randn(1, 2, 1000, 128, device="cuda", dtype=torch.bfloat16)
    permuted = plan.permute_rows(x)
    copy = plan.permutation.clone()  # valid, but not the plan's: checked on the device (one sync)
    assert not wavealign.ops.is_trusted(copy)
    assert torch.equal(torch.ops.wavealign.permute_rows(x, copy, 128), permuted)
    copy[1, 3] = copy[1, 4]
    with pytest.raises(ValueError, match="invalid argument 'permutation'"):
        torch.ops.wavealign.permute_rows(x, copy, 128)
    with pytest.raises(ValueError, match="invalid argument 'inverse'"):
        torch.ops.wavealign.unpermute_rows(permuted, copy, 128, 1000)
    row_ptr, col_idx, schedule, error = plan._launch_tensors(x.device, 1, 2, "sequential")
    repeated = schedule.clone()
    repeated[5] = repeated[6]
    with pytest.raises(ValueError, match="invalid argument 'schedule'"):
        torch.ops.wavealign.sparse_attention(x, x, x, row_ptr, col_idx, repeated, error, 128, 128, 0.1, "ascending",
                                             "auto")
    o, lse = torch.ops.wavealign.sparse_attention(x, x, x, row_ptr, col_idx, schedule, torch.ones(1, dtype=torch.int32,
                                                  device="cuda"), 128, 128, 0.1, "ascending", "auto")
    assert o.isnan().all() and lse.isnan().all()  # the invalid-mask record: the kernel computes nothing


@pytest.mark.parametrize("source", ["dense", "flex"])
def test_eager_flex_attention_on_the_plugin_mask_keeps_only_the_plan_blocks(rng, source):
    # torch's eager flex_attention evaluates mask_mod over the whole score matrix and ignores the block lists:
    # the plug-in BlockMask's mask_mod must itself keep only the listed blocks, or eager runs dense attention.
    from torch.nn.attention.flex_attention import flex_attention

    mask = random_mask(rng, 2, 6, 6, density=0.3)
    plan = wavealign.plan(mask if source == "dense" else flex_block_mask(mask, 16, 96), wave_size=2,
                          skip="never", block_size=16)
    q, k, v = (torch.randn(1, 2, 96, 32, dtype=torch.float64) for _ in range(3))
    out = plan.unpermute_rows(flex_attention(plan.permute_rows(q), k, v, block_mask=wavealign.flex.block_mask(plan, 96)),
                              seq_len=96)
    expected, _ = dense_attention(q[0].numpy(), k[0].numpy(), v[0].numpy(), expand_mask(mask, 96, 16, 16),
                                  32 ** -0.5)
    assert np.abs(out[0].numpy() - expected).max() < 1e-10
