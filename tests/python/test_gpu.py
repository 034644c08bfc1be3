"""GPU tests: the GPU plan against the CPU plan, the fused kernel against SDPA, FlexAttention in plan order,
CUDA-graph capture of the plan, torch.compile on CUDA.

Tolerances (bf16/fp16 inputs, outputs compared with an fp32 SDPA on the same inputs): atol 2e-2 and rtol 2e-2
on O, 2e-2 on LSE; FlexAttention in plan order against FlexAttention in the original order: atol 2e-2. The GPU
plan is compared with the CPU plan for equality (permutations, statistics, decisions, kernel output bit for bit).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the GPU tests are skipped")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import wavealign  # noqa: E402
from test_plan import CSR_CASES, FLEX_CASES, batch_schedule_oracle  # noqa: E402
from wa_testing import csr_of, expand_mask, flex_of, random_mask  # noqa: E402

needs_kernel = pytest.mark.skipif(not wavealign.has_cuda, reason="wavealign was built without its CUDA kernels")
needs_gpu_plan = pytest.mark.skipif(not wavealign._core.has_gpu_plan,
                                    reason="wavealign was built without its CUDA code (no GPU plan)")
ATOL = 2e-2
INDEX_ORDERS = ["com", "span"]  # the further orders with a GPU plan
ORDERS = ["wavealign", "s1", "s2", "original", "shuffled"] + INDEX_ORDERS
STATISTICS = ["nnz", "density", "adjacent_jaccard", "kv_working_set_bytes", "wave_working_set_bytes",
              "usable_l2_bytes"]


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
@pytest.mark.parametrize("length", [16384, 20000])  # 20,000 = 156 blocks of 128 and a partial block of 32
def test_long_sequences_within_twice_the_bf16_error_of_sdpa(rng, length):
    """At L = 16K-32K against an fp32 SDPA on the expanded token mask: the kernel's bf16 output may err by at
    most twice what a bf16 SDPA with the same mask errs against that reference (max |error| over all outputs),
    its LSE agrees within 2e-2, and nothing is NaN."""
    heads, dim, block = 2, 128, 128
    q_blocks = -(-length // block)
    mask = torch.from_numpy(random_mask(rng, heads, q_blocks, q_blocks, density=0.3)).cuda()
    plan = wavealign.plan(mask, skip="never", block_size=block)
    q, k, v = (torch.randn(1, heads, length, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = wavealign.sparse_attention(q, k, v, plan, return_lse=True)
    token_mask = mask.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)[None, :, :length, :length]
    expected, expected_lse = sdpa_reference(q, k, v, token_mask, dim ** -0.5)
    bf16_sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=token_mask, scale=dim ** -0.5)
    ours = (o.float() - expected).abs().max().item()
    theirs = (bf16_sdpa.float() - expected).abs().max().item()
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert ours <= 2 * theirs, f"max |error| {ours:.3g} against bf16 SDPA's {theirs:.3g}"
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


@pytest.mark.parametrize("planner", ["cpu", "auto"])
def test_cuda_masks_give_plans_on_the_device(rng, planner):
    mask = random_mask(rng, 2, 16, 16)
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), wave_size=4, skip="never", planner=planner)
    expected_planner = "gpu" if planner == "auto" and wavealign._core.has_gpu_plan else "cpu"
    assert plan.planner == expected_planner
    assert plan.permutation.device.type == "cuda" and plan.schedule().device.type == "cuda"
    assert np.array_equal(plan.permutation.cpu().numpy(), wavealign.plan(mask, wave_size=4, skip="never").permutation)
    x = torch.randn(2, 16 * 128, 8, device="cuda")
    assert torch.equal(plan.unpermute_rows(plan.permute_rows(x)), x)


def structured_mask(rng, heads, q_blocks, kv_blocks):
    """Band around the diagonal, a few global columns and sparse random blocks: the shape of video masks."""
    rows = np.arange(q_blocks)[:, None] * kv_blocks // q_blocks
    columns = np.arange(kv_blocks)[None, :]
    mask = np.zeros((heads, q_blocks, kv_blocks), bool)
    for h in range(heads):
        width = 2 + 3 * h
        mask[h] = (np.abs(rows - columns) <= width) | (columns < 2) | (rng.random((q_blocks, kv_blocks)) < 0.05)
    return mask


def cuda_csr(mask):
    row_ptr, col_idx = csr_of(mask)
    return torch.from_numpy(row_ptr).cuda(), torch.from_numpy(col_idx).cuda()


@needs_gpu_plan
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kind", ["random", "structured"])
def test_gpu_plan_equals_the_cpu_plan(rng, order, kind):
    heads, q_blocks, kv_blocks = 3, 200, 160
    if kind == "random":
        mask = random_mask(rng, heads, q_blocks, kv_blocks, density=0.25)
    else:
        mask = structured_mask(rng, heads, q_blocks, kv_blocks)
    options = dict(order=order, wave_size=24, iterations=7, seed=3, skip="never")
    expected = wavealign.plan(mask, **options)
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), **options)
    assert plan.planner == "gpu" and plan.permutation.dtype == torch.int32
    assert np.array_equal(plan.permutation.cpu().numpy(), expected.permutation)
    assert np.array_equal(plan.inverse.cpu().numpy(), expected.inverse)
    for head_order in ("sequential", "concurrent-heads"):
        assert np.array_equal(plan.schedule(head_order).cpu().numpy(), expected.schedule(head_order))
    from_csr = wavealign.plan(cuda_csr(mask), heads=heads, kv_blocks=kv_blocks, **options)
    assert from_csr.planner == "gpu"
    assert torch.equal(from_csr.permutation, plan.permutation)


@needs_gpu_plan
@pytest.mark.parametrize("order", INDEX_ORDERS)
def test_index_orders_plan_on_the_gpu_like_the_cpu(rng, order):
    """com and span under planner="auto" plan a CUDA mask on the device, equal to planner="cpu": empty rows,
    full rows, an all-empty head, one-row heads, ties (6 KV blocks); dense, CSR and FlexAttention inputs."""
    from torch.nn.attention.flex_attention import BlockMask

    heads, q_blocks, block = 3, 100, 128
    mask = structured_mask(rng, heads, q_blocks, q_blocks)
    mask[0, ::5] = False
    mask[0, 3::7] = True
    mask[1] = False
    options = dict(order=order, wave_size=16, skip="never")
    expected = wavealign.plan(mask, planner="cpu", **options)
    counts, indices = flex_of(mask)
    flex_mask = BlockMask.from_kv_blocks(torch.from_numpy(counts).cuda(), torch.from_numpy(indices).cuda(),
                                         BLOCK_SIZE=block)
    plans = {"dense": wavealign.plan(torch.from_numpy(mask).cuda(), **options),
             "csr": wavealign.plan(cuda_csr(mask), heads=heads, kv_blocks=q_blocks, **options),
             "flex": wavealign.plan(flex_mask, **options)}
    for name, plan in plans.items():
        assert plan.planner == "gpu" and plan.stats["order"] == order, name
        assert np.array_equal(plan.permutation.cpu().numpy(), expected.permutation), name
        assert np.array_equal(plan.inverse.cpu().numpy(), expected.inverse), name
    for small in (random_mask(rng, 4, 1, 70), random_mask(rng, 2, 300, 6, density=0.4)):
        on_device = wavealign.plan(torch.from_numpy(small).cuda(), **options)
        assert on_device.planner == "gpu"
        assert np.array_equal(on_device.permutation.cpu().numpy(), wavealign.plan(small, **options).permutation)


@needs_gpu_plan
def test_an_order_without_a_gpu_plan_names_the_order_and_plans_on_the_cpu_on_request(rng):
    mask = random_mask(rng, 2, 40, 40)
    with pytest.raises(ValueError, match="invalid argument 'order': 'hilbert' has no GPU plan"):
        wavealign.plan(torch.from_numpy(mask).cuda(), order="hilbert", skip="never")
    on_cpu = wavealign.plan(torch.from_numpy(mask).cuda(), order="hilbert", skip="never", planner="cpu")
    assert on_cpu.planner == "cpu"
    expected = wavealign.plan(mask, order="hilbert", skip="never")
    assert np.array_equal(on_cpu.permutation.cpu().numpy(), expected.permutation)


@needs_gpu_plan
def test_dense_csr_and_flex_inputs_on_cuda_give_the_same_gpu_plan(rng):
    from torch.nn.attention.flex_attention import BlockMask

    heads, q_blocks, block = 2, 24, 128
    mask = random_mask(rng, heads, q_blocks, q_blocks, density=0.3)
    options = dict(wave_size=8, skip="never")
    expected = wavealign.plan(mask, **options)
    dense = wavealign.plan(torch.from_numpy(mask).cuda(), **options)
    uint8 = wavealign.plan(torch.from_numpy(mask.astype(np.uint8) * 3).cuda(), **options)
    two_d = wavealign.plan(torch.from_numpy(mask[0]).cuda(), **options)
    csr = wavealign.plan(cuda_csr(mask), heads=heads, kv_blocks=q_blocks, **options)
    counts, indices = flex_of(mask)
    flex_mask = BlockMask.from_kv_blocks(torch.from_numpy(counts).cuda(), torch.from_numpy(indices).cuda(),
                                         BLOCK_SIZE=block)
    flex = wavealign.plan(flex_mask, **options)
    for plan in (dense, uint8, csr, flex):
        assert plan.planner == "gpu" and plan.permutation.device.type == "cuda"
        assert np.array_equal(plan.permutation.cpu().numpy(), expected.permutation)
        row_ptr, col_idx = plan.csr()
        assert np.array_equal(row_ptr.cpu().numpy(), expected.csr()[0])
        assert np.array_equal(col_idx.cpu().numpy(), expected.csr()[1])
    assert np.array_equal(two_d.permutation.cpu().numpy(), wavealign.plan(mask[0], **options).permutation)

    permuted = dense.permuted_mask()
    assert permuted.dtype == torch.bool and permuted.device.type == "cuda"
    assert np.array_equal(permuted.cpu().numpy(), expected.permuted_mask())
    assert uint8.permuted_mask().dtype == torch.uint8
    assert two_d.permuted_mask().shape == (q_blocks, q_blocks)
    csr_row_ptr, csr_col_idx = csr.permuted_mask()
    expected_row_ptr, expected_col_idx = csr_of(expected.permuted_mask())
    assert np.array_equal(csr_row_ptr.cpu().numpy(), expected_row_ptr)
    assert np.array_equal(csr_col_idx.cpu().numpy(), expected_col_idx)
    flex_permuted = wavealign.flex.block_mask(flex, q_blocks * block)
    # Without a mask_mod every kept block is a full block of the plug-in mask.
    assert torch.equal(flex_permuted.full_kv_num_blocks.cpu(), torch.from_numpy(flex_of(expected.permuted_mask())[0]))
    assert np.array_equal(flex_permuted.to_dense()[0].bool().cpu().numpy(), expected.permuted_mask())


@needs_gpu_plan
@pytest.mark.parametrize("order", ["wavealign"] + INDEX_ORDERS)
def test_gpu_skip_decisions_equal_the_cpu_statistics_decisions(rng, order):
    # 512 KiB of K/V per block (head_dim 1024) against 30 MiB of usable L2 on the H200 preset: head 0's 20
    # columns fit, head 1 is below the minimum density, head 2 repeats one row (adjacent Jaccard 1), head 3
    # is random at density 0.3 and passes every statistics test.
    q_blocks, kv_blocks = 256, 256
    mask = np.zeros((4, q_blocks, kv_blocks), bool)
    mask[0, :, :20] = True
    mask[1, np.arange(q_blocks)[:, None], rng.integers(0, kv_blocks, (q_blocks, 2))] = True
    mask[2, :, rng.permutation(kv_blocks)[:128]] = True
    mask[3] = rng.random((q_blocks, kv_blocks)) < 0.3
    options = dict(order=order, wave_size=32, head_dim=1024, gpu="h200", profile="none")
    cpu = wavealign.plan(mask, skip="auto", **options)
    never = wavealign.plan(mask, skip="never", **options)
    gpu = wavealign.plan(torch.from_numpy(mask).cuda(), skip="auto", **options)
    assert gpu.planner == "gpu" and "skipped=" not in repr(gpu)
    for name in STATISTICS:
        assert gpu.stats[name] == cpu.stats[name], name
    assert np.isnan(gpu.stats["total_plan_ms"]) and gpu.stats["order"] == cpu.stats["order"]
    assert gpu.skipped == [True, True, True, False]
    assert gpu.stats["skipped_heads"] == 3
    for h in range(3):  # decided by the statistics on both sides: the same reason, the identity
        assert cpu.skipped[h] and gpu.reason[h] == cpu.reason[h]
        assert np.array_equal(gpu.permutation[h].cpu().numpy(), np.arange(q_blocks))
    assert "reordering can pay" in gpu.reason[3] and "statistics only" in gpu.reason[3]
    assert np.array_equal(gpu.permutation[3].cpu().numpy(), never.permutation[3])

    for skip in ("never", "always"):
        expected = wavealign.plan(mask, skip=skip, **options)
        plan = wavealign.plan(torch.from_numpy(mask).cuda(), skip=skip, **options)
        assert plan.skipped == expected.skipped and plan.reason == expected.reason
        assert np.array_equal(plan.permutation.cpu().numpy(), expected.permutation)


@needs_gpu_plan
@needs_kernel
@pytest.mark.parametrize("head_order", ["sequential", "concurrent-heads"])
def test_fused_kernel_with_a_gpu_plan_equals_the_cpu_plan_bit_for_bit(rng, head_order):
    batch, heads, length, dim, block = 2, 2, 1000, 128, 128
    q_blocks = -(-length // block)
    for mask_heads in (heads, batch * heads):
        mask = torch.from_numpy(random_mask(rng, mask_heads, q_blocks, q_blocks, density=0.4)).cuda()
        gpu_plan = wavealign.plan(mask, wave_size=4, skip="never")
        cpu_plan = wavealign.plan(mask, wave_size=4, skip="never", planner="cpu")
        assert gpu_plan.planner == "gpu" and cpu_plan.planner == "cpu"
        q, k, v = (torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o_gpu, lse_gpu = wavealign.sparse_attention(q, k, v, gpu_plan, return_lse=True, head_order=head_order)
        o_cpu, lse_cpu = wavealign.sparse_attention(q, k, v, cpu_plan, return_lse=True, head_order=head_order)
        assert torch.equal(o_gpu, o_cpu) and torch.equal(lse_gpu, lse_cpu)
        assert torch.equal(gpu_plan.permute_rows(q), cpu_plan.permute_rows(q))
        o_permuted = gpu_plan.permute_rows(q)
        assert torch.equal(gpu_plan.unpermute_rows(o_permuted, seq_len=length), q)


@needs_gpu_plan
def test_cuda_graph_capture_of_the_plan_replays_on_new_masks(rng):
    heads, q_blocks = 2, 96
    options = dict(wave_size=16, skip="never")
    static = torch.from_numpy(random_mask(rng, heads, q_blocks, q_blocks)).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wavealign.plan(static, **options)  # warm-up: creates and prepares the planner of this shape (one sync)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = wavealign.plan(static, **options)
    for _ in range(2):
        mask = random_mask(rng, heads, q_blocks, q_blocks, density=0.35)
        static.copy_(torch.from_numpy(mask))
        graph.replay()
        torch.cuda.synchronize()
        expected = wavealign.plan(mask, **options)
        assert np.array_equal(captured.permutation.cpu().numpy(), expected.permutation)
        assert np.array_equal(captured.inverse.cpu().numpy(), expected.inverse)
    assert captured.skipped == [False] * heads



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
    if plan.planner == "gpu":
        # A GPU-built plan derives the kernel's CSR of the mask on first use (a data-dependent size), so one
        # eager call comes first; a CPU-built plan of a torch mask needs none.
        block(q, k, v)
    traced = compiled(q, k, v)
    torch.testing.assert_close(traced, block(q, k, v), atol=ATOL, rtol=ATOL)


@needs_kernel
def test_module_runs_the_kernel(rng):
    mask = torch.from_numpy(random_mask(rng, 2, 4, 4)).cuda()
    attention = wavealign.nn.SparseAttention(wave_size=2, skip="never")
    q, k, v = (torch.randn(1, 2, 512, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    o = attention(q, k, v, mask)
    assert torch.equal(o, wavealign.sparse_attention(q, k, v, attention.plan_for(mask)))
    # A CUDA mask without mask_key is planned at every call: an edit that its version counter does not see
    # (through .data) is planned too.
    mask.data[1] = True
    edited = wavealign.plan(mask.clone(), wave_size=2, skip="never")
    assert torch.equal(attention(q, k, v, mask), wavealign.sparse_attention(q, k, v, edited))


# ---- the GPU planner refuses what the CPU planner refuses (device validation, read at the first host access) ---


def cuda_flex(flex):
    """The duck-typed BlockMask of test_plan with its arrays on the GPU, in 16 x 8-token blocks (2 query and
    4 KV blocks over L = 32 tokens, so that sparse_attention's shapes fit the plan)."""
    from types import SimpleNamespace

    arrays = {name: None if getattr(flex, name) is None else torch.from_numpy(getattr(flex, name)).cuda()
              for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")}
    return SimpleNamespace(**arrays, BLOCK_SIZE=(16, 8), seq_lengths=(32, 32))


def expect_refused_at_first_host_access(plan, message):
    """An invalid mask's GPU plan: no error at plan() (no host synchronization), the identity permutation on
    the device, then the CPU plan's ValueError at check() and at every host access after it."""
    assert plan.planner == "gpu"
    torch.cuda.synchronize()
    assert np.array_equal(plan.permutation.cpu().numpy(), np.tile(np.arange(plan.q_blocks), (plan.heads, 1)))
    for access in (plan.check, lambda: plan.skipped, lambda: plan.reason, lambda: plan.stats, plan.csr,
                   plan.permuted_mask):
        with pytest.raises(ValueError) as raised:
            access()
        assert str(raised.value) == message
    q = torch.randn(1, plan.heads, plan.q_blocks * plan.block_size[0], 64, device="cuda", dtype=torch.bfloat16)
    assert plan.kv_blocks * plan.block_size[1] == q.shape[2]  # the shapes fit: the mask's error is what raises
    with pytest.raises(ValueError) as raised:
        wavealign.sparse_attention(q, q, q, plan)
    assert str(raised.value) == message


@needs_gpu_plan
@pytest.mark.parametrize("label,row_ptr,col_idx,message", CSR_CASES, ids=[c[0] for c in CSR_CASES])
def test_gpu_plan_refuses_the_csr_masks_the_cpu_plan_refuses(label, row_ptr, col_idx, message):
    pair = (torch.from_numpy(row_ptr).cuda(), torch.from_numpy(col_idx).cuda())
    with pytest.raises(ValueError) as raised:
        wavealign.plan(pair, heads=2, kv_blocks=4, block_size=(16, 8), planner="cpu")
    assert str(raised.value) == message
    expect_refused_at_first_host_access(
        wavealign.plan(pair, heads=2, kv_blocks=4, block_size=(16, 8), skip="never"), message)


@needs_gpu_plan
@pytest.mark.parametrize("label,flex,message", FLEX_CASES, ids=[c[0] for c in FLEX_CASES])
def test_gpu_plan_refuses_the_flex_masks_the_cpu_plan_refuses(label, flex, message):
    with pytest.raises(ValueError) as raised:
        wavealign.plan(cuda_flex(flex), planner="cpu")
    assert str(raised.value) == message
    expect_refused_at_first_host_access(wavealign.plan(cuda_flex(flex), skip="never"), message)


@needs_gpu_plan
def test_a_valid_gpu_plan_checks_clean_and_keeps_its_own_csr(rng):
    mask = random_mask(rng, 2, 20, 20)
    row_ptr, col_idx = cuda_csr(mask)
    plan = wavealign.plan((row_ptr, col_idx), heads=2, kv_blocks=20, wave_size=4, skip="never")
    launch = plan._launch_tensors(row_ptr.device, 1, 2, "sequential")
    assert launch[3] is not None and launch[3].dtype == torch.int32  # the record, not yet read on the host
    plan.check()
    assert plan._launch_tensors(row_ptr.device, 1, 2, "sequential")[3] is None
    col_idx.fill_(0)  # the plan validated and kept its own copy: later writes to the input do not reach it
    assert np.array_equal(plan.csr()[1].cpu().numpy(), csr_of(mask)[1])


@needs_gpu_plan
@pytest.mark.parametrize("batch,shared", [(3, True), (3, False)])
@pytest.mark.parametrize("head_order", ["sequential", "concurrent-heads"])
def test_gpu_launch_schedules_equal_the_host_layout(rng, batch, shared, head_order):
    heads, q_blocks = 2, 17
    mask = random_mask(rng, heads if shared else batch * heads, q_blocks, 13)
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), wave_size=4, skip="never")
    row_ptr, col_idx, schedule, _ = plan._launch_tensors(torch.device("cuda", torch.cuda.current_device()), batch,
                                                         heads, head_order)
    expected = batch_schedule_oracle(plan.permutation.cpu().numpy(), batch, heads, head_order)
    assert np.array_equal(schedule.cpu().numpy(), expected)
    nnz = int(row_ptr[-1])
    assert np.array_equal(row_ptr.cpu().numpy(), csr_of(mask)[0])
    assert np.array_equal(col_idx[:nnz].cpu().numpy(), csr_of(mask)[1])
