"""wavealign with PyTorch CPU tensors: framework round trips, custom ops, FlexAttention masks, nn, torch.compile."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch integration tests are skipped")

import wavealign  # noqa: E402
from wa_testing import csr_of, expand_mask, random_mask  # noqa: E402


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
    plan = wavealign.plan(random_mask(rng, 2, 4, 4), wave_size=2, skip="never", block_size=8)
    x = torch.randn(2, 30, 8)
    permutation, inverse = (torch.from_numpy(a) for a in (plan.permutation, plan.inverse))
    torch.library.opcheck(torch.ops.wavealign.permute_rows.default, (x, permutation, 8))
    torch.library.opcheck(torch.ops.wavealign.unpermute_rows.default, (torch.randn(2, 32, 8), inverse, 8, 30))
    q, k, v = (torch.randn(1, 2, 32, 8) for _ in range(3))
    row_ptr, col_idx, schedule, _ = plan._launch_tensors(q.device, 1, 2, "sequential")
    torch.library.opcheck(torch.ops.wavealign.sparse_attention.default,
                          (q, k, v, row_ptr, col_idx, schedule[None], 8, 8, 0.35, "ascending", "auto"))


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


def test_module_caches_plans_by_identity_version_or_key(rng):
    mask = torch.from_numpy(random_mask(rng, 2, 8, 8))
    attention = wavealign.nn.SparseAttention(block_size=16, wave_size=4, skip="never")
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    o = attention(q, k, v, mask)
    first = attention.plan_for(mask)
    assert attention.plan_for(mask) is first
    assert torch.equal(o, wavealign.sparse_attention(q, k, v, first))
    mask[0, 0, 7] = ~mask[0, 0, 7]
    assert attention.plan_for(mask) is not first
    keyed = attention.plan_for(mask, mask_key="layer0")
    assert attention.plan_for(None, mask_key="layer0") is keyed
    with pytest.raises(ValueError, match="block_mask"):
        attention(q, k, v, None, mask_key="unknown")


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
