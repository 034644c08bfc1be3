#!/usr/bin/env python3
"""Ulysses sequence parallelism on 2 GPUs: one Wan2.1-14B self-attention layer, 2 GPUs against 1.

The layer: 40 heads x 128, 720p, 401 frames = 363,600 tokens (2,841 blocks of 128), bf16, the synthetic
`video` mask at density 0.28 (`wavealign generate`), a mask file, or a mask method of `wavealign.methods`.
Every measurement runs in the original and in the WaveAlign row order, with the plan reused ("reused": built
once, as across denoising steps) and built in every call ("per_step": mask method, if any, and plan in the
timed region):

  - one_gpu: each GPU runs the whole layer alone (both at once, independently): wavealign.sparse_attention on
    [1, 40, L, 128].
  - two_gpu: wavealign.distributed.UlyssesAttention over NCCL, each rank holding half of the sequence
    ([1, 40, L/2, 128]) and computing 20 heads; the step time is the host wall time from a common start
    (barrier) to the slower rank's end. Each rank's phases (pack, plan, waiting for the all-to-all, attention,
    all-to-all back) come from the layer's CUDA events; WaveAlign's gain per rank is 1 - its attention time
    over the original order's.
  - all_to_all: the four exchanges of one step (q, k, v to heads; O back) alone, without packing or overlap,
    and their share of the step.
  - check: every two_gpu output equals the one_gpu output's shard bit for bit.

Prints JSON lines (for bench/results/h200x2-ulysses.json). NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1, set before torch is imported). Each timing first
runs --warmup-ms of untimed calls: the H200's power cap settles within ~100 ms of a kernel starting, so
shorter warm-ups time part of a boost-clock transient (bench_peers.py). About 2-3 minutes on 2 H200s.

Usage: PYTHONPATH=build/python bench/gpu/bench_ulysses.py [--cli build/wavealign] [--frames 401]
           [--mask video|random|FILE.npy] [--method NAME] [--density 0.28] [--iters 5] [--warmup-ms 2000]
       --device cpu runs the same flow on 2 gloo processes with the CPU reference (a check of the script on a
       small --tokens; its times mean nothing).
"""
import argparse
import datetime
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_peers import ClockSampler, pci_bus_id_of  # noqa: E402

RANKS = 2
HEADS, HEAD_DIM, BLOCK = 40, 128, 128
TOKENS_PER_LATENT_FRAME = 45 * 80  # 720 x 1280 pixels, VAE stride 8, patch 2 x 2
TIMEOUT = datetime.timedelta(minutes=8)
MODES = ("reused", "per_step")
ORDERS = ("original", "wavealign")


def tokens_of(frames):
    """Wan2.1's sequence length: (frames - 1) / 4 + 1 latent frames (temporal stride 4) of 3,600 tokens."""
    return ((frames - 1) // 4 + 1) * TOKENS_PER_LATENT_FRAME


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def nccl_version():
    """NCCL's version as "major.minor.patch" (torch reports a tuple, older releases one int)."""
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def emit(record):
    print(json.dumps(record), flush=True)


# ---- timing ----------------------------------------------------------------------------------------------------

def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Host wall milliseconds of calls that start together on every rank (barrier) and end when the device
    has finished them, after `warmup_ms` of untimed calls; with the SM clock of the timed window (NVML)."""

    def __init__(self, device, iters, warmup_ms):
        self.device, self.iters, self.warmup_ms = device, iters, warmup_ms
        self.sampler = ClockSampler()

    def _once(self, fn):
        synchronize(self.device)
        dist.barrier()
        synchronize(self.device)
        start = time.perf_counter()
        fn()
        synchronize(self.device)
        return (time.perf_counter() - start) * 1e3

    def run(self, fn, after_each=None):
        """(per-call ms of this rank, clock fields, warm-up ms). after_each runs after every timed call."""
        spent, calls = 0.0, 0
        while calls < 1 or spent < self.warmup_ms:
            spent += self._once(fn)
            calls += 1
        if self.device.type == "cuda":
            self.sampler.start(self.device.index, pci_bus_id_of(self.device))
        times = []
        for _ in range(self.iters):
            times.append(self._once(fn))
            if after_each is not None:
                after_each()
        clocks = self.sampler.stop() if self.device.type == "cuda" else dict.fromkeys(ClockSampler.FIELDS)
        return times, clocks, round(spent, 1)


def slowest(times, device):
    """Per call, the time of the slowest rank: a step ends when every rank has its output."""
    values = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values.tolist()


def gather(record):
    """Every rank's record, on every rank (host objects; a synchronization, outside any timed region)."""
    records = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    return records


def median(values):
    return round(statistics.median(values), 3)


# ---- the workload ----------------------------------------------------------------------------------------------

def make_mask(args, work):
    """bool [H, MB, NB] of all heads as a .npy path, or None for a mask method."""
    if args.method:
        return None
    if args.mask == "video":
        path = os.path.join(work, "mask.npy")
        subprocess.run([args.cli, "generate", "--frames", str(args.frames), "--heads", str(args.heads), "--mask",
                        "video", "--density", str(args.density), "--out", path], check=True,
                       stdout=subprocess.DEVNULL)
        return path
    if args.mask == "random":
        blocks = -(-args.tokens // args.block)
        generator = np.random.default_rng(0)
        path = os.path.join(work, "mask.npy")
        np.save(path, generator.random((args.heads, blocks, blocks)) < args.density)
        return path
    return args.mask


def mask_method(name):
    """wavealign.methods.<name> as a (q, k) -> block mask callable."""
    try:
        methods = importlib.import_module("wavealign.methods")
    except ImportError as error:
        raise SystemExit(f"--method {name}: this wavealign has no mask methods (wavealign.methods: {error})")
    if not callable(getattr(methods, name, None)):
        raise SystemExit(f"--method {name}: wavealign.methods has no method {name!r}")
    return getattr(methods, name)


def inputs(args, device, dtype):
    """q, k, v [1, H, L, d] of the whole layer, the same on every rank (seeded)."""
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (1, args.heads, args.tokens, args.head_dim)
    return [torch.randn(shape, device=device, dtype=dtype, generator=generator) for _ in range(3)]


# ---- one rank --------------------------------------------------------------------------------------------------

def worker(rank, args, port, mask_path):
    import wavealign
    import wavealign.distributed as ulysses

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=RANKS, timeout=TIMEOUT,
                            **({"device_id": device} if cuda else {}))
    try:
        run_rank(rank, args, device, dtype, mask_path, wavealign, ulysses)
    finally:
        dist.destroy_process_group()


def run_rank(rank, args, device, dtype, mask_path, wavealign, ulysses):
    timer = Timer(device, args.iters, args.warmup_ms)
    method = mask_method(args.method) if args.method else None
    options = dict(block_size=args.block, skip="never")
    full_mask = None if mask_path is None else torch.from_numpy(np.load(mask_path)).to(device)
    local_mask = None if full_mask is None else ulysses.shard_heads(full_mask)
    q, k, v = inputs(args, device, dtype)
    common = {"tokens": args.tokens, "heads": args.heads, "head_dim": args.head_dim, "block": args.block,
              "mask": args.method or (args.mask if args.mask in ("video", "random") else os.path.basename(args.mask)),
              "dtype": str(dtype).replace("torch.", "")}
    if rank == 0:
        emit({"kind": "meta", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "gpus": RANKS, "torch": torch.__version__,
              "nccl": nccl_version() if device.type == "cuda" else None,
              "commit": commit(), "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
              "env": {name: os.environ.get(name) for name in
                      ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")},
              "density": None if full_mask is None else round(float(full_mask.float().mean()), 4),
              "iters": args.iters, "warmup_ms": args.warmup_ms, **common})

    # One GPU: the whole layer on each GPU alone; the shard of its output is the reference of the two-GPU run.
    one_gpu, expected = {}, {}
    for order in ORDERS:
        def plan_whole():
            return wavealign.plan(method(q, k) if method else full_mask, order=order, **options)

        plan = plan_whole()
        for mode in MODES:
            if mode == "reused":
                def call(plan=plan):
                    return wavealign.sparse_attention(q, k, v, plan)
            else:
                def call():
                    return wavealign.sparse_attention(q, k, v, plan_whole())
            times, clocks, warm = timer.run(call)
            records = gather({"ms": median(times), **clocks})
            one_gpu[(order, mode)] = statistics.mean(record["ms"] for record in records)
            if rank == 0:
                for gpu, record in enumerate(records):
                    emit({"kind": "one_gpu", "gpu": gpu, "order": order, "plan": mode, **record, "warmup_ms": warm,
                          **common})
        expected[order] = ulysses.shard_sequence(wavealign.sparse_attention(q, k, v, plan)).clone()
        del plan
    local_q, local_k, local_v = (ulysses.shard_sequence(x).contiguous() for x in (q, k, v))
    del q, k, v, full_mask
    if device.type == "cuda":
        torch.cuda.empty_cache()

    # Two GPUs: the Ulysses layer, both orders, plan reused (one mask_key) or planned in every call (a new key).
    attention, steps = {}, {}
    for order in ORDERS:
        for mode in MODES:
            layer = ulysses.UlyssesAttention(mask_method=method, order=order, record_timings=True, cache_size=1,
                                             **options)
            keys = iter(range(1 << 30))
            phases = []

            def call():
                key = "reused" if mode == "reused" else ("step", next(keys))
                return layer(local_q, local_k, local_v, local_mask, mask_key=key)

            times, clocks, warm = timer.run(call, after_each=lambda: phases.append(layer.timings()))
            step = slowest(times, device)
            output = call()
            equal = bool(torch.equal(output, expected[order]))
            difference = float((output.float() - expected[order].float()).abs().max())
            per_rank = {phase: median([p[phase] for p in phases]) for phase in phases[0]}
            attention[(order, mode)] = per_rank["attention_ms"]
            ranks = gather({"rank": rank, **per_rank, **clocks, "bitwise_equal_to_one_gpu": equal,
                            "max_abs_difference": difference})
            if rank == 0:
                step_ms = steps[(order, mode)] = median(step)
                exposed = [(r["total_ms"] - r["attention_ms"] - r["plan_ms"]) / r["total_ms"] for r in ranks]
                emit({"kind": "two_gpu", "order": order, "plan": mode, "step_ms": step_ms,
                      "one_gpu_ms": round(one_gpu[(order, mode)], 3),
                      "speedup_over_one_gpu": round(one_gpu[(order, mode)] / step_ms, 3),
                      "exposed_communication_share": round(max(exposed), 4), "per_rank": ranks,
                      "warmup_ms": warm, **common})
                emit({"kind": "check", "order": order, "plan": mode,
                      "bitwise_equal_to_one_gpu": all(r["bitwise_equal_to_one_gpu"] for r in ranks),
                      "max_abs_difference": max(r["max_abs_difference"] for r in ranks)})
            del layer, output

    # WaveAlign's gain per rank: its attention time against the original order's, plan reused.
    gains = gather({"rank": rank, "original_ms": attention[("original", "reused")],
                    "wavealign_ms": attention[("wavealign", "reused")]})
    if rank == 0:
        for record in gains:
            emit({"kind": "gain", **record, "gain": round(1 - record["wavealign_ms"] / record["original_ms"], 4),
                  "one_gpu_gain": round(1 - one_gpu[("wavealign", "reused")] / one_gpu[("original", "reused")], 4),
                  **common})

    # The four all-to-alls of a step alone (each moves one [P, L/P, 1, H/P, d] buffer), against the step.
    buffers = [torch.empty((RANKS, local_q.shape[2], 1, args.heads // RANKS, args.head_dim), dtype=dtype,
                           device=device) for _ in range(2)]

    def exchanges():
        for _ in range(4):
            dist.all_to_all_single(buffers[1], buffers[0])

    times, clocks, warm = timer.run(exchanges)
    exchange_ms = median(slowest(times, device))
    if rank == 0:
        step_bytes = 4 * buffers[0].numel() * buffers[0].element_size() * (RANKS - 1) // RANKS
        emit({"kind": "all_to_all", "tensors": 4, "ms": exchange_ms,
              "gb_per_s_per_rank": round(step_bytes / exchange_ms / 1e6, 1), "bytes_sent_per_rank": step_bytes,
              "share_of_step": {f"{order}/{mode}": round(exchange_ms / step_ms, 4)
                                for (order, mode), step_ms in steps.items()}, **clocks, "warmup_ms": warm, **common})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", default="build/wavealign", help="the wavealign CLI (generates the video mask)")
    parser.add_argument("--frames", type=int, default=401)
    parser.add_argument("--tokens", type=int, default=None, help="sequence length (default: Wan2.1's for --frames)")
    parser.add_argument("--heads", type=int, default=HEADS)
    parser.add_argument("--head-dim", type=int, default=HEAD_DIM)
    parser.add_argument("--block", type=int, default=BLOCK)
    parser.add_argument("--mask", default="video", help="video, random or a bool [H, MB, NB] .npy file")
    parser.add_argument("--method", default=None, help="a mask method of wavealign.methods instead of --mask")
    parser.add_argument("--density", type=float, default=0.28)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup-ms", type=float, default=2000.0)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args()
    args.tokens = args.tokens or tokens_of(args.frames)
    if args.device == "cuda" and torch.cuda.device_count() < RANKS:
        raise SystemExit(f"needs {RANKS} CUDA devices, found {torch.cuda.device_count()}")
    if args.heads % RANKS:
        raise SystemExit(f"--heads {args.heads} is not a multiple of {RANKS}")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    with tempfile.TemporaryDirectory() as work:
        mask_path = make_mask(args, work)
        torch.multiprocessing.start_processes(worker, args=(args, store.port, mask_path), nprocs=RANKS,
                                              start_method="spawn")


if __name__ == "__main__":
    main()
