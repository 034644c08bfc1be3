"""GPU tests: the fused kernel against SDPA, FlexAttention in plan order, torch.compile on CUDA.

Tolerances (bf16/fp16 inputs, outputs compared with an fp32 SDPA on the same inputs): atol 2e-2 and rtol 2e-2
on O, 2e-2 on LSE; FlexAttention in plan order against FlexAttention in the original order: atol 2e-2.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the GPU tests are skipped")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import wavealign  # noqa: E402
from wa_testing import expand_mask, random_mask  # noqa: E402

needs_kernel = pytest.mark.skipif(not wavealign.has_cuda, reason="wavealign was built without its CUDA kernels")
ATOL = 2e-2


@pytest.fixture
def rng():
    return np.random.default_rng(17)


def sdpa_reference(q, k, v, token_mask, scale):
    """fp32 SDPA and LSE on the expanded mask [B or 1, H, L, L]."""
    q32, k32, v32 = (x.float() for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, attn_mask=token_mask, scale=scale)
    scores = (q32 @ k32.transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores.masked_fill(~token_mask, float("-inf")), dim=-1)
    return o, lse


def test_without_the_kernel_cuda_inputs_raise_a_clear_error(rng):
    if wavealign.has_cuda:
        pytest.skip("the CUDA kernels are built")
    plan = wavealign.plan(random_mask(rng, 1, 2, 2), block_size=128)
    q = torch.randn(1, 256, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="without its CUDA kernels"):
        wavealign.sparse_attention(q, q, q, plan)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim,block", [(128, 128), (64, 64), (128, 64)])
@pytest.mark.parametrize("traversal", ["ascending", "sawtooth"])
def test_fused_kernel_matches_sdpa(rng, dtype, head_dim, block, traversal):
    heads, length = 3, 1000
    q_blocks = -(-length // block)
    mask = random_mask(rng, heads, q_blocks, q_blocks, density=0.3)
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), wave_size=8, skip="never", block_size=block)
    q, k, v = (torch.randn(1, heads, length, head_dim, device="cuda", dtype=dtype) for _ in range(3))
    o, lse = wavealign.sparse_attention(q, k, v, plan, return_lse=True, traversal=traversal)
    token_mask = torch.from_numpy(expand_mask(mask, length, block, block)).cuda()[None]
    expected, expected_lse = sdpa_reference(q, k, v, token_mask, head_dim ** -0.5)
    assert o.dtype == dtype and o.shape == q.shape
    torch.testing.assert_close(o.float(), expected, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(lse, expected_lse, atol=ATOL, rtol=0)


@needs_kernel
@pytest.mark.parametrize("kernel", ["auto", "sm80"])
def test_batch_folding_strided_layouts_and_kernel_paths(rng, kernel):
    batch, heads, length, dim, block = 2, 2, 512, 128, 128
    mask = random_mask(rng, batch * heads, 4, 4)
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), wave_size=4, skip="never", block_size=block)
    projected = torch.randn(3, batch, length, heads, dim, device="cuda", dtype=torch.bfloat16)
    q, k, v = (x.transpose(1, 2) for x in projected)  # [B, H, L, d] views of a [B, L, H, d] buffer
    o = wavealign.sparse_attention(q, k, v, plan, kernel=kernel, head_order="concurrent-heads")
    token_mask = torch.from_numpy(expand_mask(mask, length, block, block)).cuda().view(batch, heads, length, length)
    expected, _ = sdpa_reference(q, k, v, token_mask, dim ** -0.5)
    torch.testing.assert_close(o.float(), expected, atol=ATOL, rtol=ATOL)
    contiguous = wavealign.sparse_attention(q.contiguous(), k.contiguous(), v.contiguous(), plan, kernel=kernel,
                                            head_order="concurrent-heads")
    assert torch.equal(contiguous, o)


@needs_kernel
def test_plan_order_does_not_change_the_kernel_output(rng):
    mask = random_mask(rng, 2, 8, 8)
    q, k, v = (torch.randn(2, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    original = wavealign.plan(mask, order="original")
    reordered = wavealign.plan(mask, wave_size=4, skip="never")
    o1, lse1 = wavealign.sparse_attention(q, k, v, original, return_lse=True)
    o2, lse2 = wavealign.sparse_attention(q, k, v, reordered, return_lse=True)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)


def test_cuda_masks_are_planned_on_the_host_and_returned_on_the_device(rng):
    mask = random_mask(rng, 2, 16, 16)
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), wave_size=4, skip="never")
    assert plan.permutation.device.type == "cuda" and plan.schedule().device.type == "cuda"
    assert np.array_equal(plan.permutation.cpu().numpy(), wavealign.plan(mask, wave_size=4, skip="never").permutation)
    x = torch.randn(2, 16 * 128, 8, device="cuda")
    assert torch.equal(plan.unpermute_rows(plan.permute_rows(x)), x)


def test_flex_attention_in_plan_order_equals_the_original_order(rng):
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    heads, length, dim, block = 4, 2048, 64, 128
    q_blocks = length // block
    mask = random_mask(rng, heads, q_blocks, q_blocks, density=0.3)
    mask_cuda = torch.from_numpy(mask).cuda()
    counts = mask_cuda.sum(-1).to(torch.int32)[None]
    indices = torch.argsort(mask_cuda.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)[None]
    original_mask = BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=block)
    plan = wavealign.plan(original_mask, wave_size=8, skip="never")
    q, k, v = (torch.randn(1, heads, length, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    attend = torch.compile(flex_attention)
    expected = attend(q, k, v, block_mask=original_mask)
    o_permuted = attend(plan.permute_rows(q), k, v, block_mask=wavealign.flex.block_mask(plan, length))
    torch.testing.assert_close(plan.unpermute_rows(o_permuted, seq_len=length), expected, atol=ATOL, rtol=ATOL)


@needs_kernel
def test_compile_fullgraph_on_cuda(rng):
    class Block(torch.nn.Module):
        def __init__(self, plan):
            super().__init__()
            self.plan = plan
            self.proj = torch.nn.Linear(128, 128, device="cuda", dtype=torch.bfloat16)

        def forward(self, q, k, v):
            o = wavealign.sparse_attention(q, k, v, self.plan)
            return self.proj(self.plan.unpermute_rows(self.plan.permute_rows(o)))

    plan = wavealign.plan(torch.from_numpy(random_mask(rng, 2, 4, 4)).cuda(), wave_size=2, skip="never")
    q, k, v = (torch.randn(1, 2, 512, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    block = Block(plan)
    compiled = torch.compile(block, fullgraph=True)
    traced = compiled(q, k, v)  # first: a plan of a torch mask needs no eager warm-up call
    torch.testing.assert_close(traced, block(q, k, v), atol=ATOL, rtol=ATOL)


@needs_kernel
def test_module_runs_the_kernel(rng):
    mask = torch.from_numpy(random_mask(rng, 2, 4, 4)).cuda()
    attention = wavealign.nn.SparseAttention(wave_size=2, skip="never")
    q, k, v = (torch.randn(1, 2, 512, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    o = attention(q, k, v, mask)
    assert torch.equal(o, wavealign.sparse_attention(q, k, v, attention.plan_for(mask)))
