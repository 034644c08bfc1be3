"""wavealign.distributed: Ulysses sequence-parallel sparse attention on 2 and 4 CPU processes (gloo).

One launch of 4 processes on 127.0.0.1 runs every case on the whole group (P = 4) and on two groups of 2
ranks side by side (P = 2); the parent compares each rank's shard with the one-process result of the whole
tensors. The CPU reference computes each row in float32 from that row's inputs alone, and the all-to-alls copy
values exactly, so the shards must equal it bit for bit. On a machine with 2 CUDA devices the same comparison
runs over NCCL with the fused kernel (bf16), also bit for bit.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the distributed tests are skipped")
dist = pytest.importorskip("torch.distributed", reason="this PyTorch has no torch.distributed")
if not dist.is_available():
    pytest.skip("this PyTorch was built without torch.distributed", allow_module_level=True)


import wavealign  # noqa: E402
import wavealign.distributed as ulysses  # noqa: E402
from wa_testing import launch_processes  # noqa: E402

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=30)
LAUNCH_TIMEOUT_S = 120  # the whole launch; it normally takes ~10 s on 2 busy cores
BATCH, HEADS = 2, 4
EMPTY_HEAD, EMPTY_ROW = 1, 3  # a mask row without blocks: its tokens get O = 0 and LSE = -inf


@dataclasses.dataclass(frozen=True)
class Config:
    block: int
    head_dim: int
    dtype: torch.dtype
    uneven: int  # a sequence length that no group size divides
    even: int


# CPU: the float32 reference on small blocks. 203 tokens: shards of [102, 101] on 2 ranks, [51, 51, 51, 50] on 4.
CPU = Config(block=16, head_dim=16, dtype=torch.float32, uneven=203, even=192)
# GPU: a shape the fused kernel runs (bf16, 64 x 64 blocks, head_dim 64); 1,625 tokens: shards of [813, 812].
GPU = Config(block=64, head_dim=64, dtype=torch.bfloat16, uneven=1625, even=1536)


# ---- inputs and the mask method (the same on every process: seeded) -------------------------------------------

def inputs(config: Config, length: int, heads: int = HEADS, dyadic: bool = False,
           seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [B, H, L, d] (CPU, config.dtype) and a bool [H, MB, MB] mask with the diagonal kept and one
    empty row. dyadic: q and k in multiples of 1/4, so that the mask method's pooled scores are exact."""
    generator = torch.Generator().manual_seed(seed)
    shape = (BATCH, heads, length, config.head_dim)
    if dyadic:
        q, k = (torch.randint(-4, 5, shape, generator=generator).float() / 4 for _ in range(2))
    else:
        q, k = (torch.randn(shape, generator=generator) for _ in range(2))
    q, k, v = (x.to(config.dtype) for x in (q, k, torch.randn(shape, generator=generator)))
    blocks = -(-length // config.block)
    mask = torch.rand((heads, blocks, blocks), generator=generator) < 0.3
    mask[:, torch.arange(blocks), torch.arange(blocks)] = True
    mask[EMPTY_HEAD, EMPTY_ROW] = False
    return q, k, v, mask


class PooledTopMask:
    """A content-dependent mask method for the tests: per batch entry, head and query block, the diagonal and
    the 3 KV blocks of highest pooled score q_I . k_J (block sums; ties keep the lower block). Returns a
    [B*H, MB, NB] mask, one per batch entry and head. Counts its calls."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.calls = 0

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        batch, heads, length, head_dim = q.shape
        block = self.block
        blocks = -(-length // block)
        pad = (0, 0, 0, blocks * block - length)
        pooled_q, pooled_k = (torch.nn.functional.pad(x, pad).reshape(batch, heads, blocks, block, head_dim).sum(3)
                              for x in (q, k))
        scores = pooled_q @ pooled_k.transpose(-1, -2)
        top = torch.argsort(scores, dim=-1, descending=True, stable=True)[..., :3]
        mask = torch.zeros(batch, heads, blocks, blocks, dtype=torch.bool, device=q.device).scatter_(-1, top, True)
        mask[..., torch.arange(blocks), torch.arange(blocks)] = True
        return mask.reshape(batch * heads, blocks, blocks)


def blhd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


# ---- what each rank runs ---------------------------------------------------------------------------------------

def error_of(call) -> str:
    try:
        call()
    except ValueError as error:
        return str(error)
    return "no error"


def run_cases(group, device: torch.device, config: Config) -> dict:
    """Every case on one group; tensors come back on the CPU."""
    ranks = dist.get_world_size(group)
    block = config.block
    options = dict(block_size=block, skip="never", wave_size=4)
    results: dict = {}
    layer = ulysses.UlyssesAttention(group, **options)
    original = ulysses.UlyssesAttention(group, order="original", **options)

    def shards(tensors, layout="bhld"):
        return [ulysses.shard_sequence((x if layout == "bhld" else blhd(x)).to(device), group, layout=layout)
                for x in tensors]

    # Uneven sequence, [B, H, L_r, d], this rank's heads of a precomputed mask, both orders.
    q, k, v, mask = inputs(config, config.uneven)
    local_mask = ulysses.shard_heads(mask, group).to(device)
    results["mask"] = layer(*shards((q, k, v)), local_mask, seq_len=config.uneven, return_lse=True)
    results["mask-original"] = original(*shards((q, k, v)), local_mask, seq_len=config.uneven, return_lse=True)
    permutation = layer.local.plan_for(local_mask).permutation.cpu()
    results["reordered"] = bool((permutation != torch.arange(permutation.shape[1], dtype=torch.int32)).any())

    # A plan of the rank's heads, made by the caller; the phases of the call timed.
    own_plan = wavealign.plan(local_mask, **options)
    timed = ulysses.UlyssesAttention(group, record_timings=True, **options)
    results["plan"] = timed(*shards((q, k, v)), plan=own_plan, seq_len=config.uneven)
    results["timings"] = timed.timings()

    # Bad calls: every rank raises the same error, and the group stays usable afterwards. A 3-head mask is
    # never a rank's (H/P = 2 or 1 heads, B*H/P = 4 or 2).
    three_heads = mask[:3].to(device)
    odd_heads = inputs(config, config.uneven, heads=2 * ranks - 1)
    seq_len = config.uneven
    errors = {
        "heads": lambda: layer(*shards(odd_heads[:3]), local_mask, seq_len=seq_len),
        "seq_len": lambda: layer(*shards((q, k, v)), local_mask, seq_len=seq_len + ranks),
        "uneven-without-seq_len": lambda: layer(*shards((q, k, v)), local_mask),
        "layout": lambda: ulysses.UlyssesAttention(group, layout="bshd"),
        "k": lambda: layer(shards((q,))[0], shards((k,))[0][:, :, :-1], shards((v,))[0], local_mask,
                           seq_len=seq_len),
        "plan": lambda: layer(*shards((q, k, v)), plan=wavealign.plan(three_heads, **options), seq_len=seq_len),
        "block_mask": lambda: layer(*shards((q, k, v)), three_heads, seq_len=seq_len),
        "no-mask": lambda: layer(*shards((q, k, v)), seq_len=seq_len),
        "mask_method": lambda: ulysses.UlyssesAttention(group, mask_method=lambda q, k: three_heads, **options)(
            *shards((q, k, v)), seq_len=seq_len),
    }
    per_entry = np.arange(BATCH * HEADS * 4).reshape(BATCH * HEADS, 2, 2)  # one mask per batch entry and head
    errors["batch"] = lambda: ulysses.shard_heads(per_entry, group, batch=3)
    errors["shard-csr"] = lambda: ulysses.shard_heads((np.zeros(3), np.zeros(2)), group)
    results["errors"] = {name: error_of(call) for name, call in errors.items()}
    numpy_heads = ulysses.shard_heads(per_entry, group, batch=BATCH)
    results["shard-heads"] = (type(numpy_heads).__name__, torch.from_numpy(numpy_heads),
                              ulysses.shard_heads(torch.from_numpy(per_entry[:HEADS]), group))
    results["after-errors"] = layer(*shards((q, k, v)), local_mask, seq_len=seq_len, return_lse=True)

    # Even sequence, [B, L_r, H, d], a mask method (one mask per batch entry and head), once per mask_key.
    q, k, v, _ = inputs(config, config.even, dyadic=True, seed=1)
    method = PooledTopMask(block)
    keyed = ulysses.UlyssesAttention(group, layout="blhd", mask_method=method, **options)
    results["method"] = keyed(*shards((q, k, v), "blhd"), return_lse=True)
    results["method-key"] = keyed(*shards((q, k, v), "blhd"), mask_key="step0")
    results["method-key-again"] = keyed(*shards((q, k, v), "blhd"), mask_key="step0")
    results["method-calls"] = method.calls
    return {name: to_cpu(value) for name, value in results.items()}


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, tuple):
        return tuple(to_cpu(x) for x in value)
    return value


def worker(rank: int, world: int, port: int, folder: str, backend: str) -> None:
    torch.set_num_threads(1)  # the processes share the machine's cores
    if backend == "nccl":
        torch.cuda.set_device(rank)
    device, config = (torch.device("cuda", rank), GPU) if backend == "nccl" else (torch.device("cpu"), CPU)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=COLLECTIVE_TIMEOUT)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    try:
        groups = {world: None}
        if world == 4:  # two groups of 2 ranks, run side by side; every rank creates both
            pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            groups[2] = pairs[rank // 2]
        results = {ranks: run_cases(group, device, config) for ranks, group in groups.items()}
        torch.save(results, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def launch(world: int, folder, backend: str) -> dict:
    """Runs `worker` on `world` processes; returns {rank: results}."""
    return launch_processes(worker, (str(folder), backend), world, folder,
                            ["torch", "torch.distributed", "wavealign.distributed"], LAUNCH_TIMEOUT_S,
                            COLLECTIVE_TIMEOUT)


# ---- one-process references ----------------------------------------------------------------------------------------

def one_process(config, q, k, v, mask, order="wavealign", layout="bhld", device="cpu"):
    """(O, LSE) of the whole tensors in one process, in `layout`."""
    plan = wavealign.plan(mask.to(device), block_size=config.block, skip="never", wave_size=4, order=order)
    o, lse = wavealign.sparse_attention(*(x.to(device) for x in (q, k, v)), plan, return_lse=True)
    return (o.cpu(), lse.cpu()) if layout == "bhld" else (blhd(o).cpu(), lse.transpose(1, 2).cpu())


def shard_of(x: torch.Tensor, ranks: int, rank: int, dim: int) -> torch.Tensor:
    return torch.tensor_split(x, ranks, dim=dim)[rank]


def per_group_rank(runs: dict, ranks: int):
    """(rank within its group, results of that group size) for every process."""
    for rank, results in runs.items():
        yield rank % ranks, results[ranks]


def check_precomputed_mask_cases(runs: dict, ranks: int, config: Config, device: str) -> None:
    """The shards of the precomputed-mask and plan cases equal the one-process result, in both orders."""
    expected_o, expected_lse = one_process(config, *inputs(config, config.uneven), device=device)
    for rank, results in per_group_rank(runs, ranks):
        o, lse = results["mask"]
        assert o.shape == (BATCH, HEADS, ulysses.shard_sizes(config.uneven, ranks)[rank], config.head_dim)
        assert torch.equal(o, shard_of(expected_o, ranks, rank, 2))
        assert torch.equal(lse, shard_of(expected_lse, ranks, rank, 2))
        assert torch.equal(results["plan"], o)
        assert results["reordered"], "the plan left every row in place: the order comparison would prove nothing"
        for wavealign_order, original_order in zip(results["mask"], results["mask-original"]):
            assert torch.equal(wavealign_order, original_order)


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    return launch(4, tmp_path_factory.mktemp("ulysses"), "gloo")


@pytest.mark.parametrize("ranks", [2, 4])
def test_uneven_sequence_in_both_orders_equals_one_process(cpu_runs, ranks):
    check_precomputed_mask_cases(cpu_runs, ranks, CPU, "cpu")


@pytest.mark.parametrize("ranks", [2, 4])
def test_timings_cover_every_phase(cpu_runs, ranks):
    phases = ["pack_ms", "plan_ms", "wait_ms", "attention_ms", "to_sequence_ms"]
    for _, results in per_group_rank(cpu_runs, ranks):
        timings = results["timings"]
        assert sorted(timings) == sorted(phases + ["total_ms"])
        assert all(timings[phase] >= 0 for phase in phases) and timings["attention_ms"] > 0
        assert timings["total_ms"] == pytest.approx(sum(timings[phase] for phase in phases))


def test_timings_before_a_timed_call_raise():
    with pytest.raises(RuntimeError, match="record_timings=True"):
        ulysses.UlyssesAttention(record_timings=True).timings()


@pytest.mark.parametrize("ranks", [2, 4])
def test_empty_rows_give_zero_and_minus_infinity_on_every_rank_they_reach(cpu_runs, ranks):
    rows = slice(EMPTY_ROW * CPU.block, (EMPTY_ROW + 1) * CPU.block)  # global tokens of the empty row
    sizes = ulysses.shard_sizes(CPU.uneven, ranks)
    for rank, results in per_group_rank(cpu_runs, ranks):
        o, lse = results["mask"]
        start = sum(sizes[:rank])
        local = slice(max(rows.start - start, 0), max(min(rows.stop - start, sizes[rank]), 0))
        assert not torch.isnan(o).any() and not torch.isnan(lse).any()
        assert torch.equal(o[:, EMPTY_HEAD, local], torch.zeros_like(o[:, EMPTY_HEAD, local]))
        assert torch.isneginf(lse[:, EMPTY_HEAD, local]).all()
        assert torch.isfinite(lse[:, 0]).all()
    assert sizes[0] < rows.stop or ranks == 2  # on 4 ranks the empty row spans ranks 0 and 1


@pytest.mark.parametrize("ranks", [2, 4])
def test_mask_method_in_blhd_layout_equals_one_process(cpu_runs, ranks):
    q, k, v, _ = inputs(CPU, CPU.even, dyadic=True, seed=1)
    expected_o, expected_lse = one_process(CPU, q, k, v, PooledTopMask(CPU.block)(q, k), layout="blhd")
    for rank, results in per_group_rank(cpu_runs, ranks):
        o, lse = results["method"]
        local = CPU.even // ranks
        assert o.shape == (BATCH, local, HEADS, CPU.head_dim) and lse.shape == (BATCH, local, HEADS)
        assert torch.equal(o, shard_of(expected_o, ranks, rank, 1))
        assert torch.equal(lse, shard_of(expected_lse, ranks, rank, 1))
        assert torch.equal(results["method-key"], o) and torch.equal(results["method-key-again"], o)
        assert results["method-calls"] == 2, "a cached mask_key must not run the mask method again"


@pytest.mark.parametrize("ranks", [2, 4])
def test_bad_calls_raise_on_every_rank_naming_the_argument(cpu_runs, ranks):
    expected = {"heads": ("q", "cannot share evenly"), "seq_len": ("q", "torch.tensor_split"),
                "uneven-without-seq_len": ("seq_len", f"pass seq_len={CPU.uneven}"),
                "layout": ("layout", "bshd"), "k": ("k", "q's shape"), "plan": ("plan", "rank's own heads"),
                "block_mask": ("block_mask", "rank's own heads"), "no-mask": ("block_mask", "no mask_method"),
                "mask_method": ("mask_method", "rank's own heads"), "batch": ("batch", "does not divide"),
                "shard-csr": ("block_mask", "dense")}
    expected_o, expected_lse = one_process(CPU, *inputs(CPU, CPU.uneven))
    for rank, results in per_group_rank(cpu_runs, ranks):
        for case, (argument, words) in expected.items():
            message = results["errors"][case]
            assert message.startswith(f"invalid argument '{argument}'") and words in message, (case, message)
        o, lse = results["after-errors"]
        assert torch.equal(o, shard_of(expected_o, ranks, rank, 2))
        assert torch.equal(lse, shard_of(expected_lse, ranks, rank, 2))


@pytest.mark.parametrize("ranks", [2, 4])
def test_shard_heads_takes_the_rank_s_heads_of_every_batch_entry(cpu_runs, ranks):
    local = HEADS // ranks
    for rank, results in per_group_rank(cpu_runs, ranks):
        kind, per_entry, shared = results["shard-heads"]
        heads = [b * HEADS + h for b in range(BATCH) for h in range(rank * local, (rank + 1) * local)]
        assert kind == "ndarray"  # a numpy mask stays numpy
        assert np.array_equal(per_entry.numpy(), np.arange(BATCH * HEADS * 4).reshape(-1, 2, 2)[heads])
        assert torch.equal(shared, torch.arange(HEADS * 4).reshape(-1, 2, 2)[rank * local:(rank + 1) * local])


def test_shard_sizes_follow_tensor_split():
    for length, ranks in ((203, 4), (192, 2), (5, 3), (3, 4)):
        sizes = [len(part) for part in torch.tensor_split(torch.arange(length), ranks)]
        assert ulysses.shard_sizes(length, ranks) == sizes
    with pytest.raises(ValueError, match="invalid argument 'seq_len'"):
        ulysses.shard_sizes(0, 2)


def test_without_a_process_group_the_error_names_group():
    assert not dist.is_initialized()
    q, k, v, mask = inputs(CPU, CPU.even)
    with pytest.raises(ValueError, match="invalid argument 'group': torch.distributed has no process group"):
        ulysses.UlyssesAttention(block_size=CPU.block)(q, k, v, mask)


def test_importing_turns_multicast_off_unless_the_environment_says_otherwise(monkeypatch):
    for name, value in ulysses.MULTICAST_OFF:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "0")
    importlib.reload(ulysses)
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert os.environ["NVSHMEM_DISABLE_NVLS"] == "0"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not wavealign.has_cuda,
                    reason="needs 2 CUDA devices and the wavealign CUDA kernels (the NCCL run of the same cases)")
def test_two_gpus_over_nccl_equal_one_gpu_bit_for_bit(tmp_path):
    check_precomputed_mask_cases(launch(2, tmp_path, "nccl"), 2, GPU, "cuda")
