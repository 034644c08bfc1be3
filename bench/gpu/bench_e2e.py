#!/usr/bin/env python3
"""End-to-end step latency of the Wan2.1-T2V-14B transformer with wavealign's sparse self-attention (H200).

One denoising step is one forward of diffusers' WanTransformer3DModel built from the Wan2.1-T2V-14B config
(40 heads x 128, ffn 13,824; random weights, bf16) at 720p: 81 frames = 75,600 tokens, 401 frames = 363,600.
Rows: dense (diffusers' SDPA in every layer, through the processor so that attention is timed; the stock
model's step time is recorded beside it), then for each mask method x backend x order the sparse model. Per row:
the median step time of --repeats timed forwards after one warm-up forward, the self-attention time and the mask
and plan time inside it (CUDA events; see wavealign.diffusers.WanSparseAttention.step_times), the blocks' time,
the mean mask density and the reordered heads of the warm-up's plans, whether the output equals the
original order's bit for bit, and the output's cosine similarity with the dense step's (`cos_vs_dense`) and, for an
8-bit row (--precisions int8), with the same row's bf16 output (`cos_vs_native`). Random weights: the cosines are
a sanity figure of the arithmetic, not a quality claim. With --layers below 40 the model has only those layers and the row also gives the
40-layer step extrapolated from the measured per-layer time (outside the blocks + 40 x per layer), marked so.

    PYTHONPATH=build/python:$DEPS python3 bench/gpu/bench_e2e.py --frames 81 --layers 40 \
        --methods xattention,sparge --backends wavealign,fa4 --out logs/e2e.jsonl
    PYTHONPATH=build/python:$DEPS python3 bench/gpu/bench_e2e.py --frames 401 --layers 2 --out logs/e2e.jsonl
    PYTHONPATH=build/python:$DEPS python3 bench/gpu/bench_e2e.py --frames 81 --layers 40 --methods full,sparge \
        --backends wavealign --orders wavealign --precisions native,int8 --out logs/e2e.jsonl
    python3 bench/gpu/collect_e2e.py logs/e2e.jsonl --docs docs/e2e.md

Each row prints one JSON line (and appends it to --out); bench/gpu/collect_e2e.py derives the speedups and
writes bench/results/h200-e2e.json. Runtime: the script prints an upper-bound estimate before it starts
(docs/e2e.md, "Running it"). --config tiny --device cpu runs the same rows on a CPU-sized model (the CI smoke
test of this script).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import wan_t2v  # noqa: E402

import wavealign  # noqa: E402
import wavealign.diffusers  # noqa: E402

MODEL_LAYERS = 40
# Measured on the H200 (diffusers 0.42.1, this config, bf16, one layer, dense SDPA): 321 ms at 75,600 tokens
# (self-attention 66 %), 5,861 ms at 363,600. The estimate scales the attention share with L^2 and the rest
# with L.
DENSE_LAYER_MS, DENSE_TOKENS, DENSE_ATTENTION_SHARE = 321.0, 75600, 0.66


def dense_layer_ms(length: int) -> float:
    ratio = length / DENSE_TOKENS
    return DENSE_LAYER_MS * (DENSE_ATTENTION_SHARE * ratio ** 2 + (1 - DENSE_ATTENTION_SHARE) * ratio)


class StepTimer:
    """Times forwards of the transformer: the whole step and the span of its blocks (CUDA events or wall)."""

    def __init__(self, transformer: Any, device: torch.device) -> None:
        self.device = device
        self.marks: list[Any] = []
        self._hooks = [transformer.blocks[0].register_forward_pre_hook(lambda module, args: self._mark()),
                       transformer.blocks[-1].register_forward_hook(lambda module, args, out: self._mark())]

    def _mark(self) -> None:
        self.marks.append(wavealign.diffusers.time_mark(self.device))

    def forward(self, transformer: Any, inputs: dict[str, Any]) -> tuple[Any, float, float]:
        """(output, step ms, blocks ms) of one forward."""
        self.marks.clear()
        self._mark()
        with torch.no_grad():
            out = transformer(**inputs, return_dict=False)[0]
        self._mark()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start, first_block, last_block, end = self.marks
        return out, wavealign.diffusers.elapsed_ms(start, end), wavealign.diffusers.elapsed_ms(first_block, last_block)

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


def device_description(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit", "--format=csv,noheader",
                                "-i", str(device.index or 0)], capture_output=True, text=True, timeout=30)
        if query.returncode == 0 and query.stdout.strip():
            return query.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return torch.cuda.get_device_name(device)


class FullMask:
    """Stand-in mask method: every block kept, so the fused kernel runs dense attention (the 8-bit kernel's
    accuracy through the whole model, with no mask that could differ between precisions)."""

    __name__ = "full"

    def __init__(self, block: int) -> None:
        self.block = block

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        batch, heads, length, _ = q.shape
        blocks = -(-length // self.block)
        return torch.ones(batch * heads, blocks, -(-k.shape[2] // self.block), dtype=torch.bool, device=q.device)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def resolve_methods(names: list[str], block: int, out: pathlib.Path | None) -> dict[str, Any]:
    """name -> what apply() takes; names whose module is missing are reported and left out."""
    methods: dict[str, Any] = {}
    for name in names:
        if name == "pooled":
            methods[name] = wan_t2v.PooledTopK(block, 0.25)
            continue
        if name == "full":
            methods[name] = FullMask(block)
            continue
        try:
            import wavealign.methods as available

            if not hasattr(available, name):
                raise ImportError(f"wavealign.methods has no {name!r}")
        except ImportError as error:
            emit({"skipped": f"method {name}", "reason": str(error)}, out)
            continue
        methods[name] = name
    return methods


def backend_available(backend: str) -> str | None:
    """None when the backend can run here, else why not."""
    if backend == "fa4":
        for module in ("wavealign.fa4", "flash_attn.cute"):
            try:
                __import__(module)
            except ImportError as error:
                return f"{module} is not importable ({error})"
    if backend == "wavealign" and torch.cuda.is_available() and not wavealign.has_cuda:
        return "wavealign was built without its CUDA kernels"
    return None


def method_options(text: str) -> dict[str, dict[str, Any]]:
    """--method-options: a JSON object of JSON objects, one per method name."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise argparse.ArgumentTypeError(f'expected {{"method": {{"option": value}}}}, got {text!r}')
    return value


def emit(row: dict[str, Any], out: pathlib.Path | None) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out is not None:
        with out.open("a") as file:
            file.write(line + "\n")


def measure(transformer: Any, timer: StepTimer, inputs: dict[str, Any], repeats: int, method: Any,
            **options: Any) -> dict[str, Any]:
    """One row: warm-up forward (plans recorded), then `repeats` timed forwards."""
    plans: list[Any] = []
    handle = wavealign.diffusers.apply(transformer, method, timing=True,
                                       on_plan=lambda layer, step, branch, plan: plans.append(plan), **options)
    try:
        timer.forward(transformer, inputs)
        densities = [d for plan in plans for d in plan.stats["density"]]
        reordered = [not skipped for plan in plans for skipped in plan.skipped if plan.order != "original"]
        plans.clear()
        handle.clear_times()
        handle._on_plan = None
        steps, blocks, parts = [], [], []
        for _ in range(repeats):
            out, step_ms, blocks_ms = timer.forward(transformer, inputs)
            steps.append(step_ms)
            blocks.append(blocks_ms)
            (row,) = handle.step_times(clear=True)
            parts.append(row)
    finally:
        wavealign.diffusers.remove(transformer)
    best = min(range(repeats), key=lambda i: abs(steps[i] - statistics.median(steps)))
    return {"step_ms": statistics.median(steps), "step_ms_all": steps, "blocks_ms": blocks[best],
            "attention_ms": parts[best]["attention_ms"], "mask_ms": parts[best]["mask_ms"],
            "plan_ms": parts[best]["plan_ms"], "sparse_calls": parts[best]["sparse_calls"],
            "dense_calls": parts[best]["dense_calls"],
            "density": statistics.fmean(densities) if densities else None,
            "reordered_heads": statistics.fmean(reordered) if reordered else None, "output": out}


def extrapolate(row: dict[str, Any], layers: int) -> dict[str, Any]:
    """The 40-layer figures of a row measured with `layers` layers (outside the blocks + 40 x per layer)."""
    factor = MODEL_LAYERS / layers
    outside = row["step_ms"] - row["blocks_ms"]
    return {"step_ms_model": outside + factor * row["blocks_ms"],
            **{f"{name}_model": factor * row[name] for name in ("attention_ms", "mask_ms", "plan_ms")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--layers", type=int, default=None,
                        help="transformer layers to build and run (default: 40 up to 100K tokens, else 2)")
    parser.add_argument("--methods", default="xattention,sparge",
                        help="comma list of xattention, sparge, minference, flexprefill, pooled and full (stand-ins)")
    parser.add_argument("--backends", default="wavealign,fa4", help="comma list of wavealign, fa4, flex")
    parser.add_argument("--orders", default="original,wavealign", help="comma list of plan orders")
    parser.add_argument("--precisions", default="native",
                        help="comma list of native, int8: the fused kernel's arithmetic (int8 rows run on backend "
                             "wavealign only)")
    parser.add_argument("--no-dense", action="store_true", help="leave out the dense row")
    parser.add_argument("--repeats", type=int, default=1, help="timed forwards per row after one warm-up")
    parser.add_argument("--skip", default="auto", help="wavealign skip policy of the WaveAlign rows")
    parser.add_argument("--profile", default=str(ROOT / "bench/results/h200-skip-profile.json"),
                        help="skip profile of the WaveAlign rows ('' for none)")
    parser.add_argument("--method-options", type=method_options, default={},
                        help='JSON {method: {option: value}}, e.g. \'{"xattention": {"threshold": 0.5}}\': the '
                             "methods' keyword arguments (random weights give near-uniform attention, so the "
                             "defaults keep most blocks; this sets the sparsity a trained model would give)")
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--config", choices=("14b", "tiny"), default="14b")
    parser.add_argument("--head-dim", type=int, default=None,
                        help="override the config's attention_head_dim (the 8-bit kernel takes 128 only: "
                             "--config tiny --head-dim 128 runs its rows on the CPU)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None, help="append the JSON lines to this file")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_e2e: no CUDA device (use --config tiny --device cpu for a CPU run)")
    config = wan_t2v.WAN21_T2V_14B if args.config == "14b" else wan_t2v.TINY
    if args.head_dim is not None:
        config = dict(config, attention_head_dim=args.head_dim)
    length = wan_t2v.tokens(config, args.frames, args.height, args.width)
    layers = args.layers or (MODEL_LAYERS if length <= 100_000 else 2)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    methods = resolve_methods([m for m in args.methods.split(",") if m], args.block, args.out)
    unknown = sorted(set(args.method_options) - set(methods))
    if unknown:
        parser.error(f"argument --method-options: {', '.join(unknown)} not among --methods ({args.methods})")
    backends = []
    for backend in (b for b in args.backends.split(",") if b):
        reason = backend_available(backend)
        if reason:
            emit({"skipped": f"backend {backend}", "reason": reason}, args.out)
        else:
            backends.append(backend)
    orders = [o for o in args.orders.split(",") if o]
    precisions = [p for p in args.precisions.split(",") if p]
    unknown = sorted(set(precisions) - {"native", "int8"})
    if unknown or not precisions:
        parser.error(f"argument --precisions: {args.precisions!r} is not a comma list of native, int8")
    variants = [(backend, precision) for backend in backends for precision in precisions
                if precision == "native" or backend == "wavealign"]
    rows = (0 if args.no_dense else 1) + len(methods) * len(variants) * len(orders)
    forwards = rows * (1 + args.repeats) + (0 if args.no_dense else 1 + args.repeats)   # + the stock model's
    estimate = forwards * layers * dense_layer_ms(length) / 1e3
    print(f"# {length} tokens, {layers} layers, {rows} rows, {forwards} forwards: at most "
          f"~{estimate:.0f} s of forwards (dense per-layer cost for every row) plus the model build and, on the "
          "first row of a backend, its compilation", file=sys.stderr, flush=True)

    start = time.perf_counter()
    transformer = wan_t2v.build_transformer(config, device, dtype, args.seed, layers)
    generator = torch.Generator(device="cpu").manual_seed(args.seed)
    latent_frames = (args.frames - 1) // wan_t2v.TEMPORAL_COMPRESSION + 1
    latents = torch.randn(1, config["in_channels"], latent_frames, args.height // wan_t2v.SPATIAL_COMPRESSION,
                          args.width // wan_t2v.SPATIAL_COMPRESSION, generator=generator)
    inputs = {"hidden_states": latents.to(device, dtype), "timestep": torch.tensor([999.0], device=device),
              "encoder_hidden_states": wan_t2v.text_embeddings(config, device, dtype, args.seed)}
    print(f"# model built in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    timer = StepTimer(transformer, device)
    common = {"bench": "e2e", "config": args.config, "device": device_description(device),
              "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip(),
              "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "diffusers": __import__("diffusers").__version__, "frames": args.frames,
              "height": args.height, "width": args.width, "tokens": length, "layers": layers,
              "model_layers": MODEL_LAYERS, "extrapolated": layers != MODEL_LAYERS, "block": args.block,
              "repeats": args.repeats}

    def finish(row: dict[str, Any], **fields: Any) -> None:
        row.pop("output", None)
        row.update(extrapolate(row, layers))
        emit({**common, **fields, **row}, args.out)

    dense_output = None
    if not args.no_dense:
        timer.forward(transformer, inputs)
        stock_ms = statistics.median(timer.forward(transformer, inputs)[1] for _ in range(args.repeats))
        row = measure(transformer, timer, inputs, args.repeats, "dense")
        dense_output = row["output"]
        finish(row, method="dense", backend="sdpa", order="original", stock_step_ms=stock_ms)
    profile = args.profile or None
    for name, method in methods.items():
        native_outputs: dict[tuple[str, str], torch.Tensor] = {}
        for backend, precision in variants:
            reference = None
            for order in orders:
                options = args.method_options.get(name)
                row = measure(transformer, timer, inputs, args.repeats, method, backend=backend, order=order,
                              block_size=args.block, skip=args.skip if order != "original" else "never",
                              profile=profile if order != "original" else None, method_options=options,
                              precision=precision)
                output = row["output"]
                equal = None if reference is None else bool(torch.equal(output, reference))
                if order == "original":
                    reference = output
                if precision == "native":
                    native_outputs[(backend, order)] = output
                native = native_outputs.get((backend, order)) if precision != "native" else None
                finish(row, method=name, backend=backend, order=order, precision=precision,
                       method_options=options, skip=args.skip if order != "original" else "never",
                       bitwise_equal_to_original=equal,
                       cos_vs_dense=None if dense_output is None else cosine(output, dense_output),
                       cos_vs_native=None if native is None else cosine(output, native))
    timer.close()


if __name__ == "__main__":
    main()
