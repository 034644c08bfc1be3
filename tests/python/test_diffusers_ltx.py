"""wavealign.diffusers in a tiny random-weight diffusers LTXVideoTransformer3DModel (CPU, float32 reference).

The LTX processor mirrors diffusers' LTXVideoAttnProcessor (q/k norms across heads, LTX's RoPE on the flattened
heads): a full mask equals the stock processor within atol/rtol 1e-5, dense calls and removal give the stock
output bit for bit, a sparse mask equals dense SDPA on the expanded token mask within 1e-5, the WaveAlign order
equals the original order bit for bit, and the cross-attention keeps its processor.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the diffusers tests are skipped")
diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed: the diffusers tests are skipped")

import wavealign.diffusers as wd  # noqa: E402

BLOCK = 16
FRAMES, HEIGHT, WIDTH = 3, 8, 8  # latent tokens: L = 192, 12 blocks of 16
FP32 = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(11)
    return diffusers.LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2,
                                                attention_head_dim=32, cross_attention_dim=64, num_layers=2,
                                                caption_channels=16).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def inputs():
    generator = torch.Generator().manual_seed(12)
    return {"hidden_states": torch.randn(1, FRAMES * HEIGHT * WIDTH, 8, generator=generator),
            "encoder_hidden_states": torch.randn(1, 7, 16, generator=generator),
            "timestep": torch.tensor([500]), "encoder_attention_mask": torch.ones(1, 7),
            "num_frames": FRAMES, "height": HEIGHT, "width": WIDTH}


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


@pytest.fixture
def clean(model):
    yield model
    if getattr(model, "_wavealign_sparse_attention", None) is not None:
        wd.remove(model)


def full_mask(q, k):
    blocks = -(-q.shape[-2] // BLOCK)
    return torch.ones(q.shape[0] * q.shape[1], blocks, blocks, dtype=torch.bool)


def sparse_mask(q, k):
    """Per head the query/key blocks whose mean q . k is in the top quarter of its row, diagonal kept; one
    empty row (O = 0 there)."""
    pooled_q = q.unflatten(-2, (-1, BLOCK)).mean(-2)
    pooled_k = k.unflatten(-2, (-1, BLOCK)).mean(-2)
    scores = (pooled_q @ pooled_k.transpose(-1, -2)).flatten(0, 1)
    keep = scores >= scores.quantile(0.75, dim=-1, keepdim=True)
    keep |= torch.eye(keep.shape[-1], dtype=torch.bool)
    keep[0, 3] = False
    return keep


def test_the_processor_goes_on_attn1_only_and_a_full_mask_equals_the_stock_model(clean, inputs):
    stock = run(clean, inputs)
    cross = [block.attn2.processor for block in clean.transformer_blocks]
    wd.apply(clean, full_mask, block_size=BLOCK)
    assert all(type(block.attn1.processor) is wd.LtxSparseAttnProcessor for block in clean.transformer_blocks)
    assert [block.attn2.processor for block in clean.transformer_blocks] == cross
    torch.testing.assert_close(run(clean, inputs), stock, **FP32)


def test_dense_calls_and_removal_give_the_stock_output_bit_for_bit(clean, inputs):
    stock = run(clean, inputs)
    wd.apply(clean, "dense")
    assert torch.equal(run(clean, inputs), stock)
    wd.remove(clean)
    wd.apply(clean, sparse_mask, block_size=BLOCK)
    run(clean, inputs)
    wd.remove(clean)
    assert torch.equal(run(clean, inputs), stock)


def test_a_sparse_mask_equals_masked_sdpa_and_the_orders_agree_bit_for_bit(clean, inputs):
    stock = run(clean, inputs)
    wd.apply(clean, sparse_mask, backend="sdpa-masked", block_size=BLOCK)
    reference = run(clean, inputs)
    wd.remove(clean)
    outputs, plans = {}, []
    for order in ("original", "wavealign"):
        wd.apply(clean, sparse_mask, order=order, block_size=BLOCK, skip="never", plan_options={"wave_size": 3},
                 on_plan=lambda layer, step, branch, plan: plans.append(plan))
        outputs[order] = run(clean, inputs)
        wd.remove(clean)
    identity = torch.arange(FRAMES * HEIGHT * WIDTH // BLOCK)
    assert any(not torch.equal(torch.as_tensor(row), identity) for plan in plans if plan.order == "wavealign"
               for row in plan.permutation)  # the rows did run in another order
    assert (reference - stock).abs().max() > 1e-3  # the mask changes the model's output
    torch.testing.assert_close(outputs["original"], reference, **FP32)
    assert torch.equal(outputs["wavealign"], outputs["original"])


def test_models_without_self_attention_blocks_are_refused_by_name(clean):
    with pytest.raises(ValueError, match="invalid argument 'transformer'.*LTXVideoTransformer3DModel"):
        wd.apply(torch.nn.Linear(2, 2), full_mask)
