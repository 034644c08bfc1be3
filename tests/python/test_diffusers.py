"""wavealign.diffusers in a tiny random-weight diffusers WanTransformer3DModel (and WanPipeline).

CPU (float32 reference): a full mask equals diffusers' own processor within atol/rtol 1e-5; a sparse mask
equals dense SDPA on the expanded token mask within 1e-5 through the fused-path backend and FlexAttention;
dense calls and removal give diffusers' output bit for bit; WaveAlign order equals the original order bit for
bit; the pipeline's cache context drives the dense steps; torch.compile traces the model in one graph. On
CUDA (skipped without a device): the fused kernel in WaveAlign order equals the original order bit for bit
through the model, and stays within bf16 tolerance (2e-2 of the output's scale) of masked SDPA.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the diffusers tests are skipped")
pytest.importorskip("diffusers", reason="diffusers is not installed: the diffusers tests are skipped")

import wavealign  # noqa: E402
import wavealign.diffusers as wd  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import wan_t2v  # noqa: E402

BLOCK = 16
FRAMES, HEIGHT, WIDTH = 9, 128, 128          # 3 latent frames of 8 x 8 tokens: L = 192, 12 blocks of 16
FP32 = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def model():
    return wan_t2v.build_transformer(wan_t2v.TINY, torch.device("cpu"), torch.float32, seed=3)


@pytest.fixture(scope="module")
def inputs():
    generator = torch.Generator().manual_seed(5)
    latents = torch.randn(1, wan_t2v.TINY["in_channels"], (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8,
                          generator=generator)
    return latents, torch.tensor([700]), wan_t2v.text_embeddings(wan_t2v.TINY, torch.device("cpu"),
                                                                   torch.float32, seed=6, length=16)


def run(model, inputs):
    with torch.no_grad():
        return model(*inputs, return_dict=False)[0]


@pytest.fixture
def clean(model):
    """Every test leaves the model as it found it."""
    yield model
    if getattr(model, "_wavealign_sparse_attention", None) is not None:
        wd.remove(model)


class Counting:
    """A mask method that counts its calls: (q, k) -> `mask_of(q, k)`."""

    def __init__(self, mask_of):
        self.mask_of = mask_of
        self.calls = 0
        self.shapes = []

    def __call__(self, q, k):
        self.calls += 1
        self.shapes.append(tuple(q.shape))
        return self.mask_of(q, k)


def full_mask(q, k):
    blocks = -(-q.shape[-2] // BLOCK)
    return torch.ones(q.shape[0] * q.shape[1], blocks, blocks, dtype=torch.bool)


def sparse_mask(q, k):
    """The example's pooled top-k mask (content-dependent), with one empty row: O = 0 there."""
    mask = wan_t2v.PooledTopK(BLOCK, 0.25)(q, k)
    mask[0, 3] = False
    return mask


def test_full_mask_equals_the_stock_processor(clean, inputs):
    stock = run(clean, inputs)
    method = Counting(full_mask)
    handle = wd.apply(clean, method, block_size=BLOCK, timing=True)
    out = run(clean, inputs)
    assert method.calls == len(clean.blocks) and method.shapes[0] == (1, 2, 192, 32)
    (row,) = handle.step_times()
    assert row["sparse_calls"] == len(clean.blocks) and row["dense_calls"] == 0
    assert min(row["mask_ms"], row["plan_ms"], row["attention_ms"]) > 0
    torch.testing.assert_close(out, stock, **FP32)


def test_dense_calls_are_the_stock_attention_bit_for_bit(clean, inputs):
    stock = run(clean, inputs)
    wd.apply(clean, "dense")
    assert torch.equal(run(clean, inputs), stock)
    wd.remove(clean)
    method = Counting(full_mask)
    wd.apply(clean, method, dense_layers=len(clean.blocks), block_size=BLOCK)
    assert torch.equal(run(clean, inputs), stock) and method.calls == 0


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["wavealign", "flex"])
def test_sparse_mask_equals_masked_sdpa(clean, inputs, backend):
    stock = run(clean, inputs)
    wd.apply(clean, sparse_mask, backend="sdpa-masked", block_size=BLOCK)
    reference = run(clean, inputs)
    wd.remove(clean)
    wd.apply(clean, sparse_mask, backend=backend, block_size=BLOCK, skip="never", plan_options={"wave_size": 3})
    out = run(clean, inputs)
    assert (reference - stock).abs().max() > 1e-3          # the mask changes the model's output
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference, **FP32)


def test_removal_restores_the_stock_model_exactly(clean, inputs):
    stock_out = run(clean, inputs)
    processors = [(block.attn1.processor, block.attn2.processor) for block in clean.blocks]
    attributes = set(vars(clean))
    wd.apply(clean, sparse_mask, block_size=BLOCK)
    assert all(type(block.attn1.processor) is wd.WanSparseAttnProcessor for block in clean.blocks)
    assert all(block.attn2.processor is stock for block, (_, stock) in zip(clean.blocks, processors))
    run(clean, inputs)
    wd.remove(clean)
    assert [(block.attn1.processor, block.attn2.processor) for block in clean.blocks] == processors
    assert all(a is b for block, (stock, _) in zip(clean.blocks, processors) for a, b in [(block.attn1.processor, stock)])
    assert set(vars(clean)) == attributes
    assert torch.equal(run(clean, inputs), stock_out)


def test_wavealign_order_equals_the_original_order_bit_for_bit(clean, inputs):
    outputs, permutations = {}, {}
    for order in ("original", "wavealign"):
        plans = []
        wd.apply(clean, sparse_mask, order=order, block_size=BLOCK, skip="never", plan_options={"wave_size": 3},
                 on_plan=lambda layer, step, branch, plan: plans.append(plan))
        outputs[order] = run(clean, inputs)
        permutations[order] = [plan.permutation for plan in plans]
        wd.remove(clean)
    identity = torch.arange(12, dtype=torch.int32)
    assert all(torch.equal(p[h], identity) for p in permutations["original"] for h in range(2))
    assert any(not torch.equal(p[h], identity) for p in permutations["wavealign"] for h in range(2))
    assert torch.equal(outputs["wavealign"], outputs["original"])


def test_the_pipeline_cache_context_gives_step_and_branch(clean):
    method = Counting(sparse_mask)
    handle = wd.apply(clean, method, block_size=BLOCK, dense_steps=1, timing=True)
    pipe = wan_t2v.pipeline(clean, flow_shift=5.0)
    prompt, negative = (wan_t2v.text_embeddings(wan_t2v.TINY, torch.device("cpu"), torch.float32, seed, 16)
                        for seed in (1, 2))
    latents = pipe(prompt_embeds=prompt, negative_prompt_embeds=negative, height=HEIGHT, width=WIDTH,
                   num_frames=FRAMES, num_inference_steps=3, guidance_scale=5.0, output_type="latent",
                   generator=torch.Generator().manual_seed(0)).frames
    assert torch.isfinite(latents).all()
    layers = len(clean.blocks)
    rows = [(row["step"], row["branch"], row["sparse_calls"], row["dense_calls"]) for row in handle.step_times()]
    assert rows == [(0, "cond", 0, layers), (0, "uncond", 0, layers), (1, "cond", layers, 0),
                    (1, "uncond", layers, 0), (2, "cond", layers, 0), (2, "uncond", layers, 0)]
    assert method.calls == 4 * layers
    assert handle.position == (None, None)                # outside the context, and set_step was never called


def test_set_step_drives_dense_steps_without_a_pipeline(clean, inputs):
    stock = run(clean, inputs)
    method = Counting(sparse_mask)
    handle = wd.apply(clean, method, block_size=BLOCK, dense_steps=2)
    with pytest.raises(RuntimeError, match="need the denoising step"):
        run(clean, inputs)
    handle.set_step(1)
    assert torch.equal(run(clean, inputs), stock) and method.calls == 0
    handle.set_step(2, branch="cond")
    assert handle.position == (2, "cond")
    assert not torch.equal(run(clean, inputs), stock) and method.calls == len(clean.blocks)


def test_refresh_reuses_each_layers_mask_for_refresh_steps(clean, inputs):
    method = Counting(sparse_mask)
    handle = wd.apply(clean, method, block_size=BLOCK, dense_steps=1, refresh=2, timing=True)
    outputs = []
    for step in range(6):
        handle.set_step(step)
        outputs.append(run(clean, inputs))
    layers = len(clean.blocks)
    assert method.calls == 3 * layers                     # steps 1, 3, 5 make the masks; 2, 4 reuse them
    assert torch.equal(outputs[1], outputs[2])
    rows = handle.step_times()
    assert [row["mask_ms"] > 0 and row["plan_ms"] > 0 for row in rows[1:]] == [True, False, True, False, True]


def test_dense_layers_by_index(clean, inputs):
    method = Counting(sparse_mask)
    wd.apply(clean, method, block_size=BLOCK, dense_layers=[0])
    run(clean, inputs)
    assert method.calls == 1


def test_a_compiled_model_runs_in_one_graph(clean, inputs):
    handle = wd.apply(clean, sparse_mask, block_size=BLOCK, dense_steps=1, skip="never",
                      plan_options={"wave_size": 3})
    handle.set_step(1)
    eager_sparse = run(clean, inputs)
    handle.set_step(0)
    eager_dense = run(clean, inputs)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(clean)(*inputs, return_dict=False)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(clean, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        handle.set_step(1)
        assert torch.equal(compiled(*inputs, return_dict=False)[0], eager_sparse)
        handle.set_step(0)                                 # the step is read inside the op: no recompilation
        assert torch.equal(compiled(*inputs, return_dict=False)[0], eager_dense)
    torch._dynamo.reset()


def test_the_example_runs_on_the_cpu():
    result = subprocess.run([sys.executable, str(EXAMPLES / "wan_t2v.py"), "--device", "cpu", "--steps", "2",
                             "--dense-steps", "1", "--height", "128", "--width", "128"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "192 tokens" in result.stdout and "finite: True" in result.stdout
    assert "   1 " in result.stdout                        # a row for the second (sparse) step


@pytest.mark.parametrize("method", ["xattention", "flexprefill"])
def test_the_example_runs_a_named_method_on_the_cpu(method):
    result = subprocess.run([sys.executable, str(EXAMPLES / "wan_t2v.py"), "--device", "cpu", "--steps", "1",
                             "--method", method], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "finite: True" in result.stdout


@pytest.mark.parametrize("method", wd.METHODS)
def test_named_methods_make_masks_in_apply_s_blocks(clean, inputs, method):
    planned = []
    wd.apply(clean, method, block_size=BLOCK, skip="never",
             on_plan=lambda layer, step, branch, plan: planned.append((plan.q_blocks, plan.kv_blocks)))
    out = run(clean, inputs)
    assert planned == [(12, 12)] * len(clean.blocks) and torch.isfinite(out).all()


@pytest.mark.parametrize("arguments, name, words", [
    (dict(method_options={"stride": 32}), "stride", "must divide the block (16), got 32"),
    (dict(method_options={"block_size": 64}), "method_options", "block_size=64 differs from the block_size=16 argument"),
    (dict(method_options={"gamma": 0.5}), "method_options", "gamma"),
    (dict(block_size=(16, 32)), "block_size", "square blocks"),
])
def test_named_method_options_are_checked_when_applied(clean, arguments, name, words):
    with pytest.raises(ValueError, match=f"invalid argument '{name}'") as error:
        wd.apply(clean, "xattention", **dict(dict(block_size=BLOCK), **arguments))
    assert words in str(error.value)
    assert getattr(clean, "_wavealign_sparse_attention", None) is None


def test_the_e2e_benchmark_and_its_collector_run_on_a_tiny_model(tmp_path):
    bench = EXAMPLES.parent / "bench" / "gpu"
    log = tmp_path / "e2e.jsonl"
    result = subprocess.run([sys.executable, str(bench / "bench_e2e.py"), "--config", "tiny", "--device", "cpu",
                             "--frames", "9", "--height", "128", "--width", "128", "--layers", "2", "--block",
                             str(BLOCK), "--methods", "pooled", "--backends", "wavealign", "--profile", "",
                             "--out", str(log)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(row["method"], row["order"]) for row in rows] == [("dense", "original"), ("pooled", "original"),
                                                               ("pooled", "wavealign")]
    assert rows[0]["dense_calls"] == 2 and rows[1]["sparse_calls"] == 2 and rows[2]["bitwise_equal_to_original"]
    assert all(0.99 < row["cos_vs_dense"] <= 1.0 and row["cos_vs_native"] is None for row in rows[1:])
    assert all(row["extrapolated"] and row["step_ms_model"] > row["step_ms"] for row in rows)
    docs = tmp_path / "e2e.md"
    docs.write_text((EXAMPLES.parent / "docs" / "e2e.md").read_text())
    result = subprocess.run([sys.executable, str(bench / "collect_e2e.py"), str(log), "--out",
                             str(tmp_path / "e2e.json"), "--docs", str(docs)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((tmp_path / "e2e.json").read_text())
    assert record["rows"][0]["speedup_vs_dense"] == 1.0 and record["rows"][2]["speedup_vs_original"] > 0
    assert "| 9 | 192 | 2 | pooled | wavealign | wavealign |" in docs.read_text()


def test_the_e2e_benchmark_runs_the_8bit_rows_and_compares_them_with_bf16(tmp_path):
    bench = EXAMPLES.parent / "bench" / "gpu"
    log = tmp_path / "e2e.jsonl"
    result = subprocess.run([sys.executable, str(bench / "bench_e2e.py"), "--config", "tiny", "--head-dim", "128",
                             "--device", "cpu", "--frames", "9", "--height", "256", "--width", "256", "--layers",
                             "1", "--methods", "full", "--backends", "wavealign", "--profile", "",
                             "--precisions", "native,int8", "--out", str(log)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(row["method"], row.get("precision"), row["order"]) for row in rows] == [
        ("dense", None, "original"), ("full", "native", "original"), ("full", "native", "wavealign"),
        ("full", "int8", "original"), ("full", "int8", "wavealign")]
    assert rows[1]["density"] == 1.0 and rows[4]["bitwise_equal_to_original"]
    # The 8-bit arithmetic (emulated on the CPU) stays close to the float output but is not the same.
    assert all(0.99 < row["cos_vs_dense"] <= 1.0 for row in rows[1:])
    assert 0.99 < rows[3]["cos_vs_native"] < 1.0 and rows[1]["cos_vs_native"] is None
    result = subprocess.run([sys.executable, str(bench / "collect_e2e.py"), str(log), "--out",
                             str(tmp_path / "e2e.json")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| full | wavealign int8 | wavealign |" in result.stdout


def test_the_e2e_benchmark_passes_method_options_and_keeps_them_apart(tmp_path):
    bench = EXAMPLES.parent / "bench" / "gpu"
    base = [sys.executable, str(bench / "bench_e2e.py"), "--config", "tiny", "--device", "cpu", "--frames", "9",
            "--height", "128", "--width", "128", "--layers", "1", "--block", "64", "--methods", "xattention",
            "--backends", "wavealign", "--profile", "", "--no-dense", "--orders", "original"]
    log = tmp_path / "e2e.jsonl"
    for threshold in ("0.5", "0.95"):
        options = '{"xattention": {"threshold": %s, "stride": 4, "block_size": 64}}' % threshold
        result = subprocess.run(base + ["--method-options", options,
                                        "--out", str(log)], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["method_options"]["threshold"] for row in rows] == [0.5, 0.95]
    assert rows[0]["density"] < rows[1]["density"]  # the option reached the method
    result = subprocess.run([sys.executable, str(bench / "collect_e2e.py"), str(log), "--out",
                             str(tmp_path / "e2e.json")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(json.loads((tmp_path / "e2e.json").read_text())["rows"]) == 2  # options are part of the key
    wrong = subprocess.run(base + ["--method-options", '{"sparge": {}}'], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "--method-options: sparge not among --methods" in wrong.stderr


def wrong_size(q, k):
    return torch.ones(q.shape[1], 5, 5, dtype=torch.bool)


@pytest.mark.parametrize("arguments, name", [
    (dict(method=3), "method"),
    (dict(method="radial"), "method"),
    (dict(method=full_mask, backend="cudnn"), "backend"),
    (dict(method=full_mask, order="spiral"), "order"),
    (dict(method=full_mask, skip="maybe"), "skip"),
    (dict(method=full_mask, dense_steps=-1), "dense_steps"),
    (dict(method=full_mask, dense_layers=[0, 9]), "dense_layers"),
    (dict(method=full_mask, dense_layers="all"), "dense_layers"),
    (dict(method=full_mask, refresh=0), "refresh"),
    (dict(method=full_mask, block_size=(16, 0)), "block_size"),
    (dict(method=full_mask, method_options=[1]), "method_options"),
    (dict(method=full_mask, plan_options={"order": "s1"}), "plan_options"),
    (dict(method=full_mask, on_plan=5), "on_plan"),
    (dict(method="dense", method_options={"threshold": 0.9}), "method_options"),
])
def test_bad_arguments_name_the_argument(clean, arguments, name):
    with pytest.raises(ValueError, match=f"invalid argument '{name}'"):
        wd.apply(clean, **arguments)
    assert getattr(clean, "_wavealign_sparse_attention", None) is None


def test_bad_models_and_calls(clean, inputs):
    with pytest.raises(ValueError, match="invalid argument 'transformer'"):
        wd.apply(torch.nn.Linear(2, 2), full_mask)
    with pytest.raises(ValueError, match="invalid argument 'transformer'.*no wavealign processors"):
        wd.remove(clean)
    wd.apply(clean, wrong_size, block_size=BLOCK)
    with pytest.raises(ValueError, match="already has the wavealign processors"):
        wd.apply(clean, full_mask)
    with pytest.raises(ValueError, match=r"invalid argument 'method': returned a mask of 5 x 5 blocks at layer 0"):
        run(clean, inputs)
    wd.remove(clean)
    wd.apply(clean, wrong_size, backend="sdpa-masked", block_size=BLOCK)
    with pytest.raises(ValueError, match=r"invalid argument 'method': returned a mask of 5 x 5 blocks"):
        run(clean, inputs)


def test_method_names_resolve_from_wavealign_methods(clean):
    try:
        import wavealign.methods  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="invalid argument 'method': 'xattention' needs wavealign.methods"):
            wd.apply(clean, "xattention")
    else:
        wd.apply(clean, "xattention", block_size=BLOCK)
        wd.remove(clean)  # the backend check below applies to the same transformer
    try:
        import wavealign.fa4  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="invalid argument 'backend': 'fa4' needs wavealign.fa4"):
            wd.apply(clean, full_mask, backend="fa4")


# ---- CUDA ---------------------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
needs_kernel = pytest.mark.skipif(not wavealign.has_cuda, reason="wavealign was built without its CUDA kernels")
GPU_CONFIG = dict(wan_t2v.TINY, num_attention_heads=2, attention_head_dim=128, num_layers=2)
GPU_BLOCK = 128


@pytest.fixture(scope="module")
def gpu_model():
    return wan_t2v.build_transformer(GPU_CONFIG, torch.device("cuda"), torch.bfloat16, seed=3)


@pytest.fixture(scope="module")
def gpu_inputs():
    # 17 frames at 256 x 256: 5 latent frames of 16 x 16 tokens, L = 1280 = 10 blocks of 128
    generator = torch.Generator().manual_seed(5)
    latents = torch.randn(1, GPU_CONFIG["in_channels"], 5, 32, 32, generator=generator)
    embeddings = wan_t2v.text_embeddings(GPU_CONFIG, torch.device("cuda"), torch.bfloat16, seed=6, length=16)
    return latents.to("cuda", torch.bfloat16), torch.tensor([700], device="cuda"), embeddings


def gpu_sparse_mask(q, k):
    return wan_t2v.PooledTopK(GPU_BLOCK, 0.3)(q, k)


def gpu_outputs(model, inputs, backend, **options):
    outputs = {}
    for order in ("original", "wavealign"):
        wd.apply(model, gpu_sparse_mask, backend=backend, order=order, block_size=GPU_BLOCK, skip="never",
                 plan_options={"wave_size": 4}, **options)
        outputs[order] = run(model, inputs)
        wd.remove(model)
    return outputs


@needs_kernel
@needs_cuda
def test_gpu_fused_kernel_orders_are_bit_identical_through_the_model(gpu_model, gpu_inputs):
    outputs = gpu_outputs(gpu_model, gpu_inputs, "wavealign")
    assert torch.equal(outputs["wavealign"], outputs["original"])
    wd.apply(gpu_model, gpu_sparse_mask, backend="sdpa-masked", block_size=GPU_BLOCK)
    reference = run(gpu_model, gpu_inputs).float()
    wd.remove(gpu_model)
    error = (outputs["wavealign"].float() - reference).abs().max()
    assert error <= 2e-2 * reference.abs().max(), error


@needs_cuda
def test_gpu_fa4_orders_are_bit_identical_through_the_model(gpu_model, gpu_inputs):
    pytest.importorskip("wavealign.fa4", reason="wavealign.fa4 is not available")
    pytest.importorskip("flash_attn.cute", reason="FlashAttention-4 (flash_attn.cute) is not installed")
    outputs = gpu_outputs(gpu_model, gpu_inputs, "fa4")
    assert torch.equal(outputs["wavealign"], outputs["original"])


@needs_kernel
@needs_cuda
def test_gpu_timing_and_an_inductor_compiled_model(gpu_model, gpu_inputs):
    handle = wd.apply(gpu_model, gpu_sparse_mask, block_size=GPU_BLOCK, timing=True)
    eager = run(gpu_model, gpu_inputs)
    (row,) = handle.step_times(clear=True)
    assert row["sparse_calls"] == 2 and min(row["mask_ms"], row["plan_ms"], row["attention_ms"]) > 0
    compiled = torch.compile(gpu_model, fullgraph=True)
    with torch.no_grad():
        out = compiled(*gpu_inputs, return_dict=False)[0]
    wd.remove(gpu_model)
    torch._dynamo.reset()
    assert (out.float() - eager.float()).abs().max() <= 2e-2 * eager.float().abs().max()
