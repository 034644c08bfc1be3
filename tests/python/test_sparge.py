"""wavealign.sparge: SpargeAttn's 8-bit block-sparse kernel in WaveAlign order.

On any machine: mask_id is the plan's permuted mask with each plan block repeated over SpargeAttn's mask entries
(64 query rows x 128 keys on sm_90, 128 x 64 before), in the [B, H, rows, columns] shapes its kernel reads, for
every head layout (H, B*H, one head) and a partial last block; bad arguments are refused naming them. On an
sm_90 GPU with spas_sage_attn (built from thu-ml/SpargeAttn; it is not on the package index): SpargeAttn in
WaveAlign order, unpermuted, equals SpargeAttn in the original order bit for bit, and stays within its 8-bit
accuracy of SDPA with the token-level mask (cosine >= 0.995 per head).
"""

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the SpargeAttn plug-in tests are skipped")

import wavealign  # noqa: E402
from wavealign import sparge  # noqa: E402
from wa_testing import expand_mask, random_mask  # noqa: E402


def named(argument):
    return pytest.raises(ValueError, match=f"invalid argument '{argument}'")


def expected_entries(plan, seq_len, block):
    """The permuted dense mask repeated over SpargeAttn's entries, by numpy on the host."""
    rows, keys = block
    q_block, kv_block = plan.block_size
    dense = np.asarray(plan.permuted_mask(), dtype=np.int32)
    if dense.ndim == 2:
        dense = dense[None]
    entries = np.repeat(np.repeat(dense, q_block // rows, axis=1), kv_block // keys, axis=2)
    return entries[:, :, :-(-seq_len // keys)]


@pytest.mark.parametrize("block", [sparge.SM90_BLOCK, sparge.SM80_BLOCK])
@pytest.mark.parametrize("length", [9 * 128, 9 * 128 - 50, 8 * 128 + 1])
def test_mask_id_is_the_permuted_mask_on_sparges_entries(block, length):
    blocks = -(-length // 128)
    mask = random_mask(np.random.default_rng(length), 3, blocks, blocks, density=0.4)
    plan = wavealign.plan(mask, skip="never", wave_size=4)
    assert not np.array_equal(plan.permutation, np.tile(np.arange(blocks), (3, 1)))
    entries = sparge.mask_id(plan, length, block=block)
    assert entries.dtype == torch.int32 and entries.is_contiguous() and entries.device.type == "cpu"
    rows, keys = block
    assert entries.shape == (1, 3, blocks * 128 // rows, -(-length // keys))
    np.testing.assert_array_equal(entries[0].numpy(), expected_entries(plan, length, block))
    assert sparge.mask_id(plan, length, block=block) is entries  # made once per plan and shape


def test_mask_id_of_batch_heads_one_head_and_csr_masks():
    rng = np.random.default_rng(5)
    mask = random_mask(rng, 6, 7, 7, density=0.3)
    plan = wavealign.plan(mask, skip="never", wave_size=2)
    entries = sparge.mask_id(plan, 7 * 128, heads=3)
    assert entries.shape == (2, 3, 14, 7)
    np.testing.assert_array_equal(entries.reshape(6, 14, 7).numpy(), expected_entries(plan, 7 * 128,
                                                                                        sparge.SM90_BLOCK))
    one = wavealign.plan(mask[0], skip="never", wave_size=2)
    shared = sparge.mask_id(one, 7 * 128, heads=4)
    assert shared.shape == (1, 4, 14, 7) and all(torch.equal(shared[0, h], shared[0, 0]) for h in range(4))
    row_ptr = np.concatenate([[0], np.cumsum(mask[:2].reshape(-1, 7).sum(1))]).astype(np.int32)
    col_idx = np.concatenate([np.flatnonzero(row) for row in mask[:2].reshape(-1, 7)]).astype(np.int32)
    csr = wavealign.plan((row_ptr, col_idx), heads=2, kv_blocks=7, skip="never", wave_size=2)
    dense = wavealign.plan(mask[:2], skip="never", wave_size=2)
    assert torch.equal(sparge.mask_id(csr, 7 * 128), sparge.mask_id(dense, 7 * 128))


def test_bad_arguments_are_refused():
    mask = random_mask(np.random.default_rng(1), 4, 6, 6)
    plan = wavealign.plan(mask, skip="never")
    with named("seq_len"):
        sparge.mask_id(plan, 5 * 128)
    with named("heads"):
        sparge.mask_id(plan, 6 * 128, heads=3)
    with named("block"):
        sparge.mask_id(plan, 6 * 128, block=64)
    small = wavealign.plan(random_mask(np.random.default_rng(2), 1, 12, 12), block_size=64, skip="never")
    with named("plan") as error:
        sparge.mask_id(small, 12 * 64, block=sparge.SM90_BLOCK)
    assert "64 x 64 blocks" in str(error.value)
    with named("plan"):
        sparge.mask_id(mask, 6 * 128)
    q = torch.zeros(1, 4, 6 * 128, 128, dtype=torch.bfloat16)
    with named("q") as error:
        sparge.sparse_attention(q, q, q, plan)
    assert "CUDA" in str(error.value)


def test_flex_plans_with_partial_blocks_are_refused():
    from torch.nn.attention.flex_attention import create_block_mask

    def band(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < 200

    partial = wavealign.plan(create_block_mask(band, 2, 3, 1024, 1024, device="cpu"), wave_size=4, skip="never")
    with named("plan") as error:
        sparge.mask_id(partial, 1024)
    assert "SpargeAttn gets every kept block in full" in str(error.value)

    def everything(b, h, q_idx, kv_idx):
        return q_idx >= 0

    full = wavealign.plan(create_block_mask(everything, 2, 3, 1024, 1024, device="cpu"), wave_size=4, skip="never")
    entries = sparge.mask_id(full, 1024)
    assert entries.shape == (2, 3, 16, 8) and bool((entries == 1).all())


def test_importing_wavealign_sparge_does_not_import_spas_sage_attn():
    code = "import sys, wavealign.sparge; print('spas_sage_attn' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def _sparge_gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device: the SpargeAttn kernel runs on the GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return "SpargeAttn's sm_90 kernel needs an sm_90 GPU (H100/H200)"
    try:
        import spas_sage_attn  # noqa: F401
    except ImportError as error:
        return f"spas_sage_attn is not importable (built from thu-ml/SpargeAttn, bench/gpu/peers_8bit.sh): {error}"
    return None


needs_sparge_gpu = pytest.mark.skipif(_sparge_gpu_skip_reason() is not None, reason=_sparge_gpu_skip_reason() or "")


def bits(x):
    return x.contiguous().view(torch.int16)


@needs_sparge_gpu
@pytest.mark.parametrize("batch,heads,mask_heads,length", [(1, 4, 4, 4096), (2, 2, 4, 3000), (1, 3, 1, 1100)])
def test_sparge_in_wavealign_order_equals_sparge_in_the_original_order(batch, heads, mask_heads, length):
    from spas_sage_attn import block_sparse_sage2_attn_cuda

    rng = np.random.default_rng(batch * 10 + heads)
    blocks = -(-length // 128)
    mask = random_mask(rng, mask_heads, blocks, blocks, density=0.3)
    generator = torch.Generator(device="cuda").manual_seed(length)
    q, k, v = (torch.randn(batch, heads, length, 128, device="cuda", dtype=torch.bfloat16, generator=generator)
               for _ in range(3))
    device_mask = torch.from_numpy(mask).cuda()
    reordered = wavealign.plan(device_mask, skip="never", wave_size=8)
    original = wavealign.plan(device_mask, order="original", skip="never")
    assert not torch.equal(reordered.permutation, original.permutation)
    o = sparge.sparse_attention(q, k, v, reordered)
    assert o.shape == q.shape and o.dtype == q.dtype
    # SpargeAttn called directly in the original order, on the unpadded queries.
    entries = sparge.mask_id(original, length, heads=heads, device=q.device)[:, :, :-(-length // 64)]
    direct = block_sparse_sage2_attn_cuda(q, k, v, mask_id=entries.expand(batch, -1, -1, -1).contiguous(),
                                          tensor_layout="HND")
    assert torch.equal(bits(o), bits(direct))

    token_mask = torch.from_numpy(expand_mask(mask, length, 128, 128)).cuda()
    token_mask = token_mask.view(-1 if mask_heads not in (1, heads) else 1, mask_heads if mask_heads == 1 else heads,
                                 length, length)
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                attn_mask=token_mask)
    cosine = torch.nn.functional.cosine_similarity(o.float().flatten(2), expected.flatten(2), dim=-1)
    assert (cosine >= 0.995).all(), cosine


@needs_sparge_gpu
def test_hand_written_plug_in_path_equals_the_convenience_call():
    from spas_sage_attn import block_sparse_sage2_attn_cuda

    mask = random_mask(np.random.default_rng(7), 4, 16, 16, density=0.3)
    q, k, v = (torch.randn(1, 4, 2048, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    plan = wavealign.plan(torch.from_numpy(mask).cuda(), skip="never", wave_size=8)
    o_perm = block_sparse_sage2_attn_cuda(plan.permute_rows(q), k, v, mask_id=sparge.mask_id(plan, 2048, heads=4),
                                          tensor_layout="HND")
    assert torch.equal(bits(plan.unpermute_rows(o_perm, seq_len=2048)), bits(sparge.sparse_attention(q, k, v, plan)))
