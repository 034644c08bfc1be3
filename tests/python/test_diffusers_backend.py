"""wavealign as a diffusers attention backend: the registration, the three routes a user takes, on the CPU.

A tiny random-weight WanTransformer3DModel (float32 CPU reference; the 8-bit kernel's CPU emulation for
precision="int8"): the name "wavealign" is registered the way diffusers' dispatcher reads it and survives a
second registration; `attention_backend("wavealign")` with `BackendOptions` (a named mask method, a callable,
the 8-bit kernel) gives apply()'s output bit for bit and runs the mask method on self-attention only;
`set_attention_backend` with `set_backend_options`; apply's processors call the registered backend; bad
arguments name the argument as the caller wrote it; a compiled model runs the backend in one graph and reads
the options when it runs. Context parallelism: diffusers' own
`enable_parallelism(ContextParallelConfig(ulysses_degree=2))` on 2 gloo processes gives the one-process output
bit for bit, through the backend and through apply, enabled before or after it (the mask method sees the
rank's head over the whole sequence), ring is refused naming ring_degree, and
examples/wan_context_parallel.py (WanPipeline, torchrun) gives the one-process latents. On CUDA (skipped
without one): the fused kernel and FA4 through the backend equal apply's output bit for bit.
"""

from __future__ import annotations

import datetime
import pathlib
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the diffusers backend tests are skipped")
pytest.importorskip("diffusers", reason="diffusers is not installed: the diffusers backend tests are skipped")
dist = pytest.importorskip("torch.distributed", reason="this PyTorch has no torch.distributed")

from diffusers.models.attention_dispatch import (AttentionBackendName, _AttentionBackendRegistry,  # noqa: E402
                                                 attention_backend, dispatch_attention_fn)

import wavealign  # noqa: E402
import wavealign.diffusers as wd  # noqa: E402
from wa_testing import launch_processes  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import wan_t2v  # noqa: E402

BLOCK = 16
LATENT = (3, 16, 16)                  # latent frames, height, width: L = 3 x 8 x 8 = 192 tokens, 12 blocks of 16
SPARSE = dict(block_size=BLOCK, skip="never", plan_options={"wave_size": 3})
# The 8-bit kernel runs head_dim 128 in 128 x 128 blocks: a model with 2 heads of 128 and L = 256 (2 blocks).
INT8_CONFIG = dict(wan_t2v.TINY, attention_head_dim=128)
INT8_LATENT = (4, 16, 16)
INT8_BLOCK = 128
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
LAUNCH_TIMEOUT_S = 300                # the whole 2-process launch; ~30 s on 2 busy cores


def build(config=wan_t2v.TINY):
    return wan_t2v.build_transformer(config, torch.device("cpu"), torch.float32, seed=3)


def inputs_for(config=wan_t2v.TINY, latent=LATENT):
    generator = torch.Generator().manual_seed(5)
    latents = torch.randn(1, config["in_channels"], *latent, generator=generator)
    return latents, torch.tensor([700]), wan_t2v.text_embeddings(config, torch.device("cpu"), torch.float32,
                                                                   seed=6, length=16)


def run(model, inputs):
    with torch.no_grad():
        return model(*inputs, return_dict=False)[0]


class Recording:
    """A mask method that records the shape of every q it is called with: (q, k) -> `mask_of(q, k)`."""

    def __init__(self, mask_of):
        self.mask_of = mask_of
        self.shapes = []
        self.__name__ = getattr(mask_of, "__name__", "recording")

    def __call__(self, q, k):
        self.shapes.append(tuple(q.shape))
        return self.mask_of(q, k)


def pooled(q, k):
    """The example's pooled top-k mask (content-dependent, [B*H, MB, NB]): a quarter of each row's blocks."""
    return wan_t2v.PooledTopK(BLOCK, 0.25)(q, k)


def int8_pooled(q, k):
    return wan_t2v.PooledTopK(INT8_BLOCK, 0.5)(q, k)


@pytest.fixture(scope="module")
def model():
    return build()


@pytest.fixture(scope="module")
def inputs():
    return inputs_for()


@pytest.fixture
def clean(model):
    """Every test leaves the model, the active backend and the default options as it found them."""
    active = _AttentionBackendRegistry._active_backend
    yield model
    if getattr(model, "_wavealign_sparse_attention", None) is not None:
        wd.remove(model)
    model.reset_attention_backend()
    _AttentionBackendRegistry.set_active_backend(active)
    wd.set_backend_options(None)


def applied(model, inputs, method, **options):
    """The output of apply(model, method, **options), the model restored afterwards."""
    wd.apply(model, method, **options)
    try:
        return run(model, inputs)
    finally:
        wd.remove(model)


# ---- registration ------------------------------------------------------------------------------------------

def test_wavealign_is_registered_the_way_the_dispatcher_reads_it():
    member = AttentionBackendName(wd.BACKEND_NAME)
    assert member is AttentionBackendName["WAVEALIGN"] and member == "wavealign" and member.value == "wavealign"
    assert isinstance(member, AttentionBackendName)
    assert "wavealign" in {name.value for name in AttentionBackendName.__members__.values()}
    assert _AttentionBackendRegistry._backends[member] is wd._wavealign_attention
    assert _AttentionBackendRegistry._is_context_parallel_available(member)
    arguments = _AttentionBackendRegistry._supported_arg_names[member]
    assert {"query", "key", "value", "scale", "_parallel_config"} <= arguments
    # diffusers' own members are untouched: iterating the enum lists them alone, and they still resolve
    assert member not in list(AttentionBackendName)
    assert AttentionBackendName("native") is AttentionBackendName.NATIVE
    backends = dict(_AttentionBackendRegistry._backends)
    assert wd.register_backend() is member and _AttentionBackendRegistry._backends == backends


def test_registration_finds_a_member_diffusers_lists_itself(monkeypatch):
    """A diffusers release whose enum lists "wavealign" keeps its own member: the registration adds none."""
    listed = AttentionBackendName(wd.BACKEND_NAME)
    monkeypatch.setattr(wd, "_backend_member", None)
    monkeypatch.setattr(_AttentionBackendRegistry, "_backends", {
        name: function for name, function in _AttentionBackendRegistry._backends.items() if name != listed})
    names = dict(AttentionBackendName._member_map_)
    assert wd.register_backend() is listed
    assert AttentionBackendName._member_map_ == names
    assert _AttentionBackendRegistry._backends[listed] is wd._wavealign_attention


# ---- route 2: the backend with attention_backend(...) ------------------------------------------------------

def test_attention_backend_with_a_callable_equals_apply_bit_for_bit(clean, inputs):
    stock = run(clean, inputs)
    method = Recording(pooled)
    with attention_backend("wavealign"), wd.BackendOptions(method, **SPARSE) as options:
        assert wd.active_backend_options() is options
        out = run(clean, inputs)
    assert wd.active_backend_options() is None
    # the self-attention of each block, never the cross-attention (whose keys are the 16 text tokens)
    assert method.shapes == [(1, 2, 192, 32)] * len(clean.blocks)
    assert (out - stock).abs().max() > 1e-3                      # the mask changed the output
    assert torch.equal(out, applied(clean, inputs, pooled, **SPARSE))


def test_a_named_method_through_attention_backend_equals_apply(clean, inputs):
    with attention_backend("wavealign"), wd.BackendOptions("xattention", method_options={"threshold": 0.5},
                                                           **SPARSE):
        out = run(clean, inputs)
    reference = applied(clean, inputs, "xattention", method_options={"threshold": 0.5}, **SPARSE)
    assert torch.isfinite(out).all() and torch.equal(out, reference)
    assert not torch.equal(out, run(clean, inputs))


def test_the_8bit_kernel_through_attention_backend_equals_apply():
    model, inputs = build(INT8_CONFIG), inputs_for(INT8_CONFIG, INT8_LATENT)
    options = dict(block_size=INT8_BLOCK, skip="never")
    with attention_backend("wavealign"), wd.BackendOptions(int8_pooled, precision="int8", **options):
        int8 = run(model, inputs)
    with attention_backend("wavealign"), wd.BackendOptions(int8_pooled, **options):
        native = run(model, inputs)
    assert torch.isfinite(int8).all() and not torch.equal(int8, native)   # the 8-bit arithmetic ran
    assert torch.equal(int8, applied(model, inputs, int8_pooled, precision="int8", **options))


def test_nested_options_and_set_attention_backend_with_default_options(clean, inputs):
    full = wd.BackendOptions("dense")
    sparse = wd.BackendOptions(pooled, **SPARSE)
    with attention_backend("wavealign"), sparse:
        expected = run(clean, inputs)
        with full:
            assert wd.active_backend_options() is full
            dense = run(clean, inputs)
        assert wd.active_backend_options() is sparse
    stock = run(clean, inputs)
    assert torch.equal(dense, stock)                    # method "dense": diffusers' native attention
    clean.set_attention_backend("wavealign")
    assert all(block.attn1.processor._attention_backend is AttentionBackendName("wavealign")
               for block in clean.blocks)
    wd.set_backend_options(sparse)
    assert torch.equal(run(clean, inputs), expected)


def test_a_compiled_model_runs_the_backend_in_one_graph_with_the_options_of_each_call(clean, inputs):
    with attention_backend("wavealign"):
        with wd.BackendOptions(pooled, **SPARSE):
            eager = run(clean, inputs)
            torch._dynamo.reset()
            explanation = torch._dynamo.explain(clean)(*inputs, return_dict=False)
        assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons
        compiled = torch.compile(clean, backend="aot_eager", fullgraph=True)
        with torch.no_grad():
            with wd.BackendOptions(pooled, **SPARSE):
                assert torch.equal(compiled(*inputs, return_dict=False)[0], eager)
            with wd.BackendOptions("dense"):       # read when the op runs: the same graph, dense calls
                assert torch.equal(compiled(*inputs, return_dict=False)[0], run(clean, inputs))
    torch._dynamo.reset()


def test_a_call_without_options_says_how_to_give_them(clean, inputs):
    with attention_backend("wavealign"), pytest.raises(RuntimeError, match=r"BackendOptions\(method"):
        run(clean, inputs)


def test_cross_attention_runs_diffusers_native_attention():
    q = torch.randn(1, 40, 2, 32)
    k, v = torch.randn(1, 16, 2, 32), torch.randn(1, 16, 2, 32)
    with wd.BackendOptions(Recording(pooled), **SPARSE) as options:
        out = dispatch_attention_fn(q, k, v, backend="wavealign")
    assert options._method.shapes == []
    assert torch.equal(out, dispatch_attention_fn(q, k, v, backend="native"))


# ---- route 1: apply goes through the backend ----------------------------------------------------------------

def test_apply_s_processors_call_the_registered_backend(clean, inputs, monkeypatch):
    member = AttentionBackendName("wavealign")
    calls = []

    def spy(**kwargs):
        calls.append((kwargs["_wavealign_handle"], kwargs["_wavealign_layer"], kwargs["_parallel_config"]))
        return wd._wavealign_attention(**kwargs)

    monkeypatch.setitem(_AttentionBackendRegistry._backends, member, spy)
    handle = wd.apply(clean, pooled, dense_layers=[0], **SPARSE)
    out = run(clean, inputs)
    assert calls == [(handle.id, layer, None) for layer in range(len(clean.blocks))]
    monkeypatch.undo()
    assert torch.equal(out, run(clean, inputs))


# ---- bad arguments ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arguments, name", [
    (dict(method=3), "method"),
    (dict(method="radial"), "method"),
    (dict(method=pooled, backend="cudnn"), "backend"),
    (dict(method=pooled, precision="int4"), "precision"),
    (dict(method=pooled, backend="flex", precision="int8"), "precision"),
    (dict(method=pooled, order="spiral"), "order"),
    (dict(method=pooled, skip="maybe"), "skip"),
    (dict(method=pooled, block_size=(16, 0)), "block_size"),
    (dict(method="xattention", block_size=(16, 32)), "block_size"),
    (dict(method=pooled, method_options=[1]), "method_options"),
    (dict(method="xattention", method_options={"gamma": 0.5}), "method_options"),
    (dict(method="dense", method_options={"threshold": 0.9}), "method_options"),
    (dict(method=pooled, plan_options={"order": "s1"}), "plan_options"),
    (dict(method=pooled, plan_options=[("wave_size", 3)]), "plan_options"),
    (dict(method=pooled, profile={"points": 3}), "profile"),
])
def test_bad_options_name_the_argument(arguments, name):
    # a profile's errors name the field after the argument: "invalid argument 'profile: format'"
    with pytest.raises(ValueError, match=f"^invalid argument '{name}[':]"):
        wd.BackendOptions(**arguments)


def test_bad_calls_name_the_argument(clean, inputs):
    q = k = v = torch.randn(1, 32, 2, 16)
    with wd.BackendOptions(pooled, **SPARSE):
        for keyword, value in (("attn_mask", torch.ones(32, 32, dtype=torch.bool)), ("is_causal", True),
                               ("dropout_p", 0.1)):
            with pytest.raises(ValueError, match=f"^invalid argument '{keyword}'"):
                dispatch_attention_fn(q, k, v, backend="wavealign", **{keyword: value})
        with pytest.raises(ValueError, match="^invalid argument 'return_lse'"):
            dispatch_attention_fn(q, k, v, backend="wavealign", attention_kwargs={"return_lse": True})
        ring = types.SimpleNamespace(context_parallel_config=types.SimpleNamespace(ring_degree=2, ulysses_degree=1))
        with pytest.raises(ValueError, match="^invalid argument 'ring_degree': is 2.*Ulysses"):
            dispatch_attention_fn(q, k, v, backend="wavealign", parallel_config=ring)
    with pytest.raises(ValueError, match="^invalid argument 'options'"):
        wd.set_backend_options("xattention")
    with attention_backend("wavealign"), wd.BackendOptions(lambda q, k: torch.ones(2, 5, 5, dtype=torch.bool),
                                                           **SPARSE):
        with pytest.raises(ValueError, match=r"^invalid argument 'method': returned a mask of 5 x 5 blocks; 192 "):
            run(clean, inputs)


def test_fa4_is_the_kernel_the_options_name():
    q = k = v = torch.randn(1, 32, 2, 16)
    with wd.BackendOptions(pooled, backend="fa4", **SPARSE):
        with pytest.raises(ValueError, match="^invalid argument 'q': is on cpu: FlashAttention-4 runs on CUDA"):
            dispatch_attention_fn(q, k, v, backend="wavealign")


# ---- route 3: diffusers' context parallelism on 2 gloo processes --------------------------------------------

# "anything": diffusers' ulysses_anything exchange (its all-to-alls of any shard length). The shards are even
# here: gloo's all-gather, which gathers the output shards, takes equal sizes only.
# "apply-first": apply, then enable_parallelism on the transformer with apply's processors.
CP_CASES = ("named", "callable", "int8", "apply", "apply-first", "anything")


def cp_case(name: str):
    """(model config, latent shape, mask method, options, route) of a context-parallel case."""
    if name == "anything":
        return wan_t2v.TINY, LATENT, Recording(pooled), SPARSE, "backend"
    if name == "named":
        return wan_t2v.TINY, LATENT, "xattention", dict(method_options={"threshold": 0.5}, **SPARSE), "backend"
    if name == "callable":
        return wan_t2v.TINY, LATENT, Recording(pooled), SPARSE, "backend"
    if name == "int8":
        return INT8_CONFIG, INT8_LATENT, int8_pooled, dict(block_size=INT8_BLOCK, skip="never",
                                                           precision="int8"), "backend"
    return wan_t2v.TINY, LATENT, Recording(pooled), dict(dense_layers=[0], **SPARSE), name


def run_route(model, inputs, method, options, route):
    """The model's output through apply, or through the backend (set on the model, or by attention_backend)."""
    if route.startswith("apply"):
        if getattr(model, "_wavealign_sparse_attention", None) is None:
            wd.apply(model, method, **options)
        return run(model, inputs)
    with attention_backend("wavealign"), wd.BackendOptions(method, **options):
        return run(model, inputs)


def cp_worker(rank: int, world: int, port: int, folder: str) -> None:
    torch.set_num_threads(1)  # the processes share the machine's cores; the one-process runs use 1 thread too
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=COLLECTIVE_TIMEOUT)
    # "cpu:gloo" rather than "gloo": ulysses_anything exchanges the shard lengths on the CPU only where the
    # group's backend string names the cpu device (diffusers' gather_size_by_comm), else on the accelerator.
    dist.init_process_group("cpu:gloo", store=store, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    results = {}
    try:
        for name in CP_CASES:
            config, latent, method, options, route = cp_case(name)
            inputs = inputs_for(config, latent)
            if rank == 0:           # the one-process output, without parallelism
                results[f"{name}-one"] = run_route(build(config), inputs, method, options, route)
            config, latent, method, options, route = cp_case(name)   # a mask method that has seen no call
            model = build(config)
            if route == "backend":
                model.set_attention_backend("wavealign")
            if route == "apply-first":
                wd.apply(model, method, **options)
            model.enable_parallelism(config=wan_t2v.context_parallel_config(
                torch.device("cpu"), ulysses_degree=world, ulysses_anything=name == "anything"))
            results[name] = run_route(model, inputs, method, options, route)
            if isinstance(method, Recording):
                results[f"{name}-shapes"] = method.shapes
        ring = build()
        ring.set_attention_backend("wavealign")
        ring.enable_parallelism(config=wan_t2v.context_parallel_config(torch.device("cpu"), ring_degree=world))
        try:
            with wd.BackendOptions(pooled, **SPARSE):
                run(ring, inputs_for())
            results["ring"] = "no error"
        except ValueError as error:
            results["ring"] = str(error)
        torch.save(results, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def launch(world: int, folder) -> dict:
    """Runs `cp_worker` on `world` processes; {rank: results}."""
    return launch_processes(cp_worker, (str(folder),), world, folder,
                            ["torch", "torch.distributed", "diffusers", "wavealign.diffusers"], LAUNCH_TIMEOUT_S,
                            COLLECTIVE_TIMEOUT)


@pytest.fixture(scope="module")
def cp_runs(tmp_path_factory):
    return launch(2, tmp_path_factory.mktemp("ulysses"))


@pytest.mark.parametrize("case", CP_CASES)
def test_ulysses_on_two_processes_equals_one_process_bit_for_bit(cp_runs, case):
    expected = cp_runs[0][f"{case}-one"]
    assert torch.isfinite(expected).all()
    for rank in (0, 1):
        assert torch.equal(cp_runs[rank][case], expected), f"rank {rank}"


@pytest.mark.parametrize("case", ["callable", "apply", "apply-first", "anything"])
def test_under_ulysses_the_mask_method_sees_the_rank_s_head_over_the_whole_sequence(cp_runs, case):
    sparse_layers = 1 if case.startswith("apply") else 2        # apply's cases keep layer 0 dense
    for rank in (0, 1):
        assert cp_runs[rank][f"{case}-shapes"] == [(1, 1, 192, 32)] * sparse_layers


def test_ring_context_parallelism_is_refused_naming_ring_degree(cp_runs):
    for rank in (0, 1):
        assert cp_runs[rank]["ring"].startswith("invalid argument 'ring_degree': is 2")


@pytest.mark.parametrize("method", ["pooled", "xattention"])
def test_the_context_parallel_example_runs_on_two_cpu_processes(method):
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(EXAMPLES / "wan_context_parallel.py"), "--device", "cpu", "--method", method],
                            capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"2 ranks, 4 heads, {method} mask" in result.stdout and "finite: True" in result.stdout
    assert "max |context parallel - one process| = 0\n" in result.stdout


# ---- CUDA ---------------------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
GPU_CONFIG = dict(wan_t2v.TINY, num_attention_heads=2, attention_head_dim=128, num_layers=2)
GPU_BLOCK = 128


@needs_cuda
@pytest.mark.parametrize("backend", ["wavealign", "fa4"])
def test_gpu_kernels_through_attention_backend_equal_apply(backend):
    if backend == "wavealign" and not wavealign.has_cuda:
        pytest.skip("wavealign was built without its CUDA kernels")
    if backend == "fa4":
        pytest.importorskip("flash_attn.cute", reason="FlashAttention-4 (flash_attn.cute) is not installed")
    model = wan_t2v.build_transformer(GPU_CONFIG, torch.device("cuda"), torch.bfloat16, seed=3)
    generator = torch.Generator().manual_seed(5)
    latents = torch.randn(1, GPU_CONFIG["in_channels"], 5, 32, 32, generator=generator)   # L = 1280
    inputs = (latents.to("cuda", torch.bfloat16), torch.tensor([700], device="cuda"),
              wan_t2v.text_embeddings(GPU_CONFIG, torch.device("cuda"), torch.bfloat16, seed=6, length=16))
    method = wan_t2v.PooledTopK(GPU_BLOCK, 0.3)
    options = dict(backend=backend, block_size=GPU_BLOCK, skip="never", plan_options={"wave_size": 4})
    with attention_backend("wavealign"), wd.BackendOptions(method, **options):
        out = run(model, inputs)
    assert torch.isfinite(out).all()
    assert torch.equal(out, applied(model, inputs, method, **options))
