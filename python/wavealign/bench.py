"""Times attention kernels of other libraries on one block mask in several row orders, through the plug-in path:
FlashAttention-4's block-sparse forward, FlexAttention and SpargeAttn's 8-bit block-sparse kernel (where
spas_sage_attn is installed; its call quantizes Q, K and V itself, so its time includes that). `wavealign bench`
runs this module next to the fused kernel; bench/gpu/bench_peers.py builds the H200 benchmark from the same
pieces.

    python3 -m wavealign.bench --mask MASK.npy [--perm original] [--perm wavealign=PERM.npy ...]
                               [--impls flashattention4,flexattention,spargeattn] [--block 128] [--head-dim 128]
                               [--dtype bf16] [--iters 5] [--warmup-ms 2000] [--cold-l2] [--seed 0]

MASK.npy is a bool/uint8 block mask [H, MB, NB] or [MB, NB]; each --perm NAME=FILE.npy an int32 [H, MB] row order
(position p of head h runs row perm[h, p]: a plan's permutation), a bare NAME the identity. Without --perm the
original order alone is timed. Q, K and V are seeded normal [1, H, MB*block, d] and [1, H, NB*block, d]. Every
kept block is a full block (no mask_mod): the libraries' fastest path. In each order the query blocks and mask
rows are permuted beforehand; the timed region is the attention call alone (CUDA events; warm-up until the
warm-up kernels reach --warmup-ms, so the timed calls run at the GPU's steady, power-capped clock; the median
of --iters). Prints one JSON object per line:

    {"impl", "order", "ms", "tflops", "sm_clock_mhz", "power_w", "power_capped", "warmup_ms", ...}   a timing
    {"check": "<impl> <order> order unpermuted vs <first order>", "bitwise_equal", "max_abs_difference", ...}
    {"skipped": "<impl>", "reason": "..."}                                   an implementation that cannot run

Effective TF/s = 4 * q_block * kv_block * d * nnz_blocks / time, the count the fused kernel reports.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import sys
import threading
from typing import Any, Callable

import numpy as np

from ._util import require_torch

IMPLS = ("flashattention4", "flexattention", "spargeattn")


class ClockSampler:
    """SM clock, board power and SW power cap state of one GPU, read from NVML every 10 ms on a thread between
    start() and stop(). NVML is opened with ctypes, so a machine without the driver's libnvidia-ml.so.1 still
    runs the benchmark, with every statistic None."""

    PERIOD_S = 0.01
    CLOCK_SM = 1  # NVML_CLOCK_SM
    SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap: clocks lowered to hold the software power limit
    FIELDS = ("sm_clock_mhz", "power_w", "power_capped")

    def __init__(self) -> None:
        self._nvml = None
        self._reasons = None
        self._thread = None
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if nvml.nvmlInit_v2() == 0:
                self._nvml = nvml
        except (OSError, AttributeError):
            return
        # Drivers from 535 name it "ClocksEvent"; older ones only have the "ClocksThrottle" spelling (same ABI).
        self._reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))

    def start(self, index: int, pci_bus_id: str | None = None) -> None:
        """Samples the GPU with this PCI bus id ("0000:19:00.0"; it names the same GPU in CUDA and NVML, whose
        indices can differ) or, without one, NVML device `index`."""
        self.stop()
        if self._nvml is None:
            return
        handle = ctypes.c_void_p()
        if pci_bus_id and hasattr(self._nvml, "nvmlDeviceGetHandleByPciBusId_v2"):
            found = self._nvml.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle))
        else:
            found = self._nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
        if found != 0:
            return
        self._clocks, self._powers, self._capped = [], [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, args=(handle,), daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float | None]:
        """Means over the window: {"sm_clock_mhz", "power_w", "power_capped"}, None where NVML gave nothing."""
        if self._thread is None:
            return dict.fromkeys(self.FIELDS)
        self._stop.set()
        self._thread.join()
        self._thread = None

        def mean(values: list[float], digits: int) -> float | None:
            return round(sum(values) / len(values), digits) if values else None
        return {"sm_clock_mhz": mean(self._clocks, 1), "power_w": mean(self._powers, 1),
                "power_capped": mean(self._capped, 3)}

    def _sample_until_stopped(self, handle: Any) -> None:
        # The first sample is taken at once, so a window shorter than the period still has one.
        while True:
            self._sample(handle)
            if self._stop.wait(self.PERIOD_S):
                return

    def _sample(self, handle: Any) -> None:
        clock, power, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        if self._nvml.nvmlDeviceGetClockInfo(handle, self.CLOCK_SM, ctypes.byref(clock)) == 0:
            self._clocks.append(clock.value)
        # Board power in mW; on Hopper it is averaged over the last second, so it lags short windows.
        if self._nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power)) == 0:
            self._powers.append(power.value / 1000)
        if self._reasons is not None and self._reasons(handle, ctypes.byref(reasons)) == 0:
            self._capped.append(1.0 if reasons.value & self.SW_POWER_CAP else 0.0)


def pci_bus_id_of(device: int) -> str | None:
    """The CUDA device's PCI bus id in NVML's form, or None where this PyTorch does not report it."""
    torch = require_torch("wavealign.bench")
    properties = torch.cuda.get_device_properties(device)
    if not all(hasattr(properties, name) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return None
    return f"{properties.pci_domain_id:04x}:{properties.pci_bus_id:02x}:{properties.pci_device_id:02x}.0"


def time_ms(fn: Callable[[], Any], iters: int, cold_l2: bool, sampler: ClockSampler, warmup: int = 2,
            warmup_ms: float = 0.0) -> tuple[float, dict[str, Any]]:
    """Median of `iters` CUDA-event timings after `warmup` runs and then as many more as it takes for the
    warm-up kernels to reach `warmup_ms` in total; with cold_l2 every run first flushes L2 (2x its size).
    Returns the median and the clock fields of the timed runs (sampled during those only) with warmup_ms."""
    torch = require_torch("wavealign.bench")
    device = torch.cuda.current_device()
    flush = torch.empty(2 * torch.cuda.get_device_properties(device).L2_cache_size, dtype=torch.uint8,
                        device="cuda")
    launches = 0

    def launch() -> float:
        nonlocal launches
        if cold_l2:
            flush.fill_(launches & 0xFF)
        launches += 1
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    spent = 0.0
    while launches < warmup or spent < warmup_ms:
        spent += launch()
    sampler.start(device, pci_bus_id_of(device))
    times = [launch() for _ in range(iters)]
    return float(np.median(times)), {**sampler.stop(), "warmup_ms": round(spent, 1)}


def token_order(perm: np.ndarray, block: int, head_dim: int) -> Any:
    """The gather index [1, H, MB*block, d] (CUDA) that moves Q's query blocks into the order perm [H, MB]."""
    torch = require_torch("wavealign.bench")
    heads, q_blocks = perm.shape
    tokens = (torch.from_numpy(perm.astype(np.int64)).cuda()[:, :, None] * block
              + torch.arange(block, device="cuda")).reshape(heads, q_blocks * block)
    return tokens[None, :, :, None].expand(1, heads, q_blocks * block, head_dim)


def flex_full_block_mask(mask: np.ndarray, block: int, q_len: int, kv_len: int) -> Any:
    """A FlexAttention BlockMask (CUDA) whose kept blocks are all 'full' blocks. mask: bool [H, MB, NB]."""
    torch = require_torch("wavealign.bench")
    from torch.nn.attention.flex_attention import BlockMask

    counts = torch.from_numpy(mask.sum(axis=2).astype(np.int32)).cuda()
    order = np.argsort(~mask, axis=2, kind="stable").astype(np.int32)  # kept block indices first, ascending
    indices = torch.from_numpy(order).cuda()
    zeros = torch.zeros_like(counts)
    return BlockMask.from_kv_blocks(zeros[None], indices[None], counts[None], indices[None], BLOCK_SIZE=block,
                                    seq_lengths=(q_len, kv_len))


def fa4_or_reason() -> tuple[Any, str | None]:
    """(wavealign.fa4 module, flash_attn_func), or (None, why FlashAttention-4 cannot run here)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as error:  # any import failure of the optional library only skips its rows
        return None, f"flash_attn.cute is not importable ({error!r}): install flash-attn-4"
    from . import fa4

    return (fa4, flash_attn_func), None


def fa4_call(fa4_parts: tuple[Any, Any], block: int, k: Any, v: Any) -> Callable[[np.ndarray, Any], Callable]:
    """make(permuted mask, plan-ordered q [1, H, L, d]) -> the timed FA4 call, whose output is [1, H, L, d]."""
    fa4, flash_attn_func = fa4_parts
    import wavealign

    k_fa4, v_fa4 = (x.transpose(1, 2).contiguous() for x in (k, v))  # FA4's layout [B, L, H, d]

    def make(permuted_mask: np.ndarray, q_order: Any) -> Callable:
        # A plan of the permuted mask in its own order: its block-sparse tensors are the permuted rows.
        plan = wavealign.plan(permuted_mask, order="original", skip="never", block_size=block)
        tensors = fa4.block_sparse_tensors(plan, k.shape[2], device=q_order.device)
        q_fa4 = q_order.transpose(1, 2).contiguous()
        return lambda: flash_attn_func(q_fa4, k_fa4, v_fa4, block_sparse_tensors=tensors)[0].transpose(1, 2)

    return make


def sparge_or_reason() -> tuple[Any, str | None]:
    """(wavealign.sparge module, block_sparse_sage2_attn_cuda), or (None, why SpargeAttn cannot run here)."""
    try:
        from spas_sage_attn import block_sparse_sage2_attn_cuda
    except Exception as error:  # any import failure of the optional library only skips its rows
        return None, (f"spas_sage_attn is not importable ({error!r}): SpargeAttn is built from its source "
                      "(thu-ml/SpargeAttn)")
    from . import sparge

    return (sparge, block_sparse_sage2_attn_cuda), None


def sparge_call(sparge_parts: tuple[Any, Any], block: int, k: Any, v: Any) -> Callable[[np.ndarray, Any], Callable]:
    """make(permuted mask, plan-ordered q [1, H, L, d]) -> the timed SpargeAttn call (its quantization of Q, K
    and V and its mask-to-LUT step included, as a user calls it), whose output is [1, H, L, d]."""
    sparge, block_sparse_sage2_attn_cuda = sparge_parts
    import wavealign

    def make(permuted_mask: np.ndarray, q_order: Any) -> Callable:
        plan = wavealign.plan(permuted_mask, order="original", skip="never", block_size=block)
        mask_id = sparge.mask_id(plan, k.shape[2], heads=q_order.shape[1], device=q_order.device)
        return lambda: block_sparse_sage2_attn_cuda(q_order, k, v, mask_id=mask_id, tensor_layout="HND")

    return make


def flex_call(compiled: Callable, block: int, k: Any, v: Any,
              kernel_options: dict[str, Any] | None = None) -> Callable[[np.ndarray, Any], Callable]:
    """make(permuted mask, plan-ordered q) -> the timed call of a torch.compile'd flex_attention."""
    def make(permuted_mask: np.ndarray, q_order: Any) -> Callable:
        block_mask = flex_full_block_mask(permuted_mask, block, q_order.shape[2], k.shape[2])
        return lambda: compiled(q_order, k, v, block_mask=block_mask, kernel_options=kernel_options)

    return make


def time_in_orders(impl: str, make: Callable, mask: np.ndarray, perms: dict[str, np.ndarray], q: Any, block: int,
                   common: dict[str, Any], options: Any, sampler: ClockSampler,
                   emit: Callable[[dict], None] | None = None) -> None:
    """Times make(permuted mask, permuted q) in each order of `perms`, then checks each later order's output,
    unpermuted, against the first order's. q: [1, H, MB*block, d] on CUDA."""
    torch = require_torch("wavealign.bench")
    emit = emit or print_json
    flops = 4.0 * block * block * q.shape[-1] * float(mask.sum())
    outputs, indices = {}, {}
    for order, perm in perms.items():
        permuted = np.take_along_axis(mask, perm[:, :, None].astype(np.int64), axis=1)
        indices[order] = token_order(perm, block, q.shape[-1])
        fn = make(permuted, torch.gather(q, 2, indices[order]))
        outputs[order] = fn()
        ms, clocks = time_ms(fn, options.iters, options.cold_l2, sampler, warmup_ms=options.warmup_ms)
        emit({"impl": impl, "order": order, "ms": ms, "tflops": flops / ms / 1e9, **common, **clocks})
    first = next(iter(outputs))
    for order in list(outputs)[1:]:
        restored = torch.empty_like(outputs[order]).scatter_(2, indices[order], outputs[order])
        emit({"check": f"{impl} {order} order unpermuted vs {first}", "mask": common.get("mask"),
              "tokens": common.get("tokens"), "bitwise_equal": bool(torch.equal(restored, outputs[first])),
              "max_abs_difference": (restored.float() - outputs[first].float()).abs().max().item()})


def print_json(row: dict) -> None:
    print(json.dumps(row), flush=True)


def milliseconds(text: str) -> float:
    """argparse type of --warmup-ms: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def implementations(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """argparse type of --impls: a comma-separated subset of `choices`."""
    def parse(text: str) -> tuple[str, ...]:
        chosen = tuple(name for name in text.split(",") if name)
        if not chosen or any(name not in choices for name in chosen):
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(choices)}, "
                                             f"got {text!r}")
        return chosen

    return parse


def _load_mask(path: str, parser: argparse.ArgumentParser) -> np.ndarray:
    try:
        mask = np.load(path)
    except (OSError, ValueError) as error:
        parser.error(f"argument --mask: cannot read {path}: {error}")
    if mask.dtype not in (np.bool_, np.uint8) or mask.ndim not in (2, 3) or 0 in mask.shape:
        parser.error(f"argument --mask: {path} must be a bool/uint8 [H, MB, NB] or [MB, NB] mask with no empty "
                     f"dimension, got {mask.dtype} {list(mask.shape)}")
    return (mask if mask.ndim == 3 else mask[None]).astype(bool)


def _load_perms(specs: list[str], heads: int, q_blocks: int, parser: argparse.ArgumentParser) -> dict:
    identity = np.tile(np.arange(q_blocks, dtype=np.int32), (heads, 1))
    perms = {}
    for spec in specs or ["original"]:
        name, _, path = spec.partition("=")
        if not name or name in perms:
            parser.error(f"argument --perm: {spec!r} needs a new order name (NAME or NAME=FILE.npy)")
        if not path:
            perms[name] = identity
            continue
        try:
            perm = np.load(path)
        except (OSError, ValueError) as error:
            parser.error(f"argument --perm: cannot read {path}: {error}")
        if perm.shape != (heads, q_blocks) or not np.issubdtype(perm.dtype, np.integer) or \
                not (np.sort(perm, axis=1) == np.arange(q_blocks)).all():
            parser.error(f"argument --perm: {path} must hold one permutation of 0..{q_blocks - 1} per head, "
                         f"int [{heads}, {q_blocks}], got {perm.dtype} {list(perm.shape)}")
        perms[name] = perm.astype(np.int32)
    return perms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m wavealign.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--mask", required=True, help="bool/uint8 block mask .npy [H, MB, NB] or [MB, NB]")
    parser.add_argument("--perm", action="append", help="NAME=PERM.npy (int32 [H, MB]) or NAME (identity)")
    parser.add_argument("--impls", type=implementations(IMPLS), default=IMPLS,
                        help=f"comma-separated subset of {','.join(IMPLS)} (default: all)")
    parser.add_argument("--block", type=positive_int, default=128, help="tokens per mask block")
    parser.add_argument("--head-dim", type=positive_int, default=128)
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--iters", type=positive_int, default=5)
    parser.add_argument("--warmup-ms", type=milliseconds, default=2000.0,
                        help="warm-up kernel time before each timing (past the power cap's boost transient)")
    parser.add_argument("--cold-l2", action="store_true", help="flush L2 before every call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    mask = _load_mask(args.mask, parser)
    heads, q_blocks, kv_blocks = mask.shape
    perms = _load_perms(args.perm, heads, q_blocks, parser)

    torch = require_torch("python3 -m wavealign.bench")
    if not torch.cuda.is_available():
        for impl in args.impls:
            print_json({"skipped": impl, "reason": "no CUDA device"})
        return 0
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn(1, heads, q_blocks * args.block, args.head_dim, device="cuda", dtype=dtype, generator=generator)
    k, v = (torch.randn(1, heads, kv_blocks * args.block, args.head_dim, device="cuda", dtype=dtype,
                        generator=generator) for _ in range(2))
    common = {"tokens": q_blocks * args.block, "heads": heads, "head_dim": args.head_dim, "block": args.block,
              "density": float(mask.mean()), "nnz_blocks": int(mask.sum()), "mask": args.mask,
              "l2": "cold" if args.cold_l2 else "warm", "mode": "sparse"}
    sampler = ClockSampler()
    for impl in args.impls:
        if impl == "flashattention4":
            parts, reason = fa4_or_reason()
            make = None if parts is None else fa4_call(parts, args.block, k, v)
        elif impl == "spargeattn":
            parts, reason = sparge_or_reason()
            make = None if parts is None else sparge_call(parts, args.block, k, v)
        else:
            from torch.nn.attention.flex_attention import flex_attention

            make, reason = flex_call(torch.compile(flex_attention, dynamic=False), args.block, k, v), None
        if make is None:
            print(f"wavealign.bench: {impl} skipped: {reason}", file=sys.stderr)
            print_json({"skipped": impl, "reason": reason})
            continue
        try:
            time_in_orders(impl, make, mask, perms, q, args.block, common, args, sampler)
        except Exception as error:  # one library failing on this mask must not lose the other's numbers
            print_json({"impl": impl, "error": repr(error)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
