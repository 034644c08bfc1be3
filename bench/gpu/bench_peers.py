#!/usr/bin/env python3
"""Peers of the block-sparse kernel on the same mask, in the same run: PyTorch FlexAttention (torch.compile'd,
default and tuned kernel options) in the original and the WaveAlign row order, FlashAttention-4's block-sparse
forward in the original, S2 and WaveAlign row order, and dense SDPA and FA4.

The mask and the permutations come from `wa_bench_attention --save-mask/--save-perm`, so both benchmarks run
the identical workload. FlexAttention and FA4 get every kept block as a *full* block (no mask_mod evaluation),
their fastest path. In a permuted order, Q blocks and mask rows are permuted beforehand (the plug-in path);
the timed region is the attention call alone. FA4's block-sparse tensors are wavealign.fa4's (the package
staged in BUILD/python must be on PYTHONPATH), built from the permuted mask. Prints one JSON object per
measurement, one per plug-in check (the permuted order's output, unpermuted, against the original order's),
and {"skipped": impl, "reason": ...} when an implementation cannot run here (FA4 without flash_attn.cute).

All cases run in one process, so each torch.compile'd kernel variant is compiled once per sequence length, and
FA4's JIT (~20 s per shape) once per shape.

--warmup-ms MS keeps running untimed warm-up calls after the warm-up count until their kernel time reaches MS
milliseconds in total: the H200 runs at its 700 W software power cap, which engages within ~100 ms of a kernel
starting and takes the SM clock from 1980 MHz to ~1490-1650 MHz, so without it a short case is timed partly at
boost clocks (one case of our kernel read 597 and 689 TF/s in two sessions). Each timing line also carries the
mean SM clock, board power and power-capped share of its timed calls (NVML; null without it) and warmup_ms.

Usage: bench_peers.py --case MASK.npy:PERM.npy:TOKENS:KIND[:sdpa][:s2=S2PERM.npy] [--case ...]
                      [--impls flexattention,sdpa,flashattention4] [--head-dim 128] [--iters 5] [--cold-l2]
                      [--warmup-ms 0]
(PERM is the WaveAlign permutation; with s2=, FA4 also runs in that S2 order; sdpa adds the dense rows.)
"""
import argparse
import ctypes
import json
import math
import sys
import threading

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

BLOCK = 128
TUNED = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}


class ClockSampler:
    """SM clock, board power and SW power cap state of one GPU, read from NVML every 10 ms on a thread between
    start() and stop(). NVML is opened with ctypes, so a machine without the driver's libnvidia-ml.so.1 still
    runs the benchmark, with every statistic None."""

    PERIOD_S = 0.01
    CLOCK_SM = 1  # NVML_CLOCK_SM
    SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap: clocks lowered to hold the software power limit
    FIELDS = ("sm_clock_mhz", "power_w", "power_capped")

    def __init__(self):
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

    def start(self, index, pci_bus_id=None):
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

    def stop(self):
        """Means over the window: {"sm_clock_mhz", "power_w", "power_capped"}, None where NVML gave nothing."""
        if self._thread is None:
            return dict.fromkeys(self.FIELDS)
        self._stop.set()
        self._thread.join()
        self._thread = None

        def mean(values, digits):
            return round(sum(values) / len(values), digits) if values else None
        return {"sm_clock_mhz": mean(self._clocks, 1), "power_w": mean(self._powers, 1),
                "power_capped": mean(self._capped, 3)}

    def _sample_until_stopped(self, handle):
        # The first sample is taken at once, so a window shorter than the period still has one.
        while True:
            self._sample(handle)
            if self._stop.wait(self.PERIOD_S):
                return

    def _sample(self, handle):
        clock, power, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        if self._nvml.nvmlDeviceGetClockInfo(handle, self.CLOCK_SM, ctypes.byref(clock)) == 0:
            self._clocks.append(clock.value)
        # Board power in mW; on Hopper it is averaged over the last second, so it lags short windows.
        if self._nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power)) == 0:
            self._powers.append(power.value / 1000)
        if self._reasons is not None and self._reasons(handle, ctypes.byref(reasons)) == 0:
            self._capped.append(1.0 if reasons.value & self.SW_POWER_CAP else 0.0)


def pci_bus_id_of(device):
    """The CUDA device's PCI bus id in NVML's form, or None where this PyTorch does not report it."""
    properties = torch.cuda.get_device_properties(device)
    if not all(hasattr(properties, name) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return None
    return f"{properties.pci_domain_id:04x}:{properties.pci_bus_id:02x}:{properties.pci_device_id:02x}.0"


def time_ms(fn, iters, cold_l2, sampler, warmup=2, warmup_ms=0.0):
    """Median of `iters` CUDA-event timings after `warmup` runs and then as many more as it takes for the
    warm-up kernels to reach `warmup_ms` in total; with cold_l2 every run first flushes L2 (2x its size).
    Returns the median and the clock fields of the timed runs (sampled during those only) with warmup_ms."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")
    launches = 0

    def launch():
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
    device = torch.cuda.current_device()
    sampler.start(device, pci_bus_id_of(device))
    times = [launch() for _ in range(iters)]
    return float(np.median(times)), {**sampler.stop(), "warmup_ms": round(spent, 1)}


def block_mask_of(mask, heads, q_blocks, padded):
    """A FlexAttention BlockMask whose kept blocks are all 'full' blocks. mask: bool [H, MB, NB] (numpy)."""
    counts = torch.from_numpy(mask.sum(axis=2).astype(np.int32)).cuda()
    order = np.argsort(~mask, axis=2, kind="stable").astype(np.int32)  # kept block indices first, ascending
    indices = torch.from_numpy(order).cuda()
    zeros = torch.zeros_like(counts)
    return BlockMask.from_kv_blocks(zeros[None], indices[None], counts[None], indices[None], BLOCK_SIZE=BLOCK,
                                    seq_lengths=(padded, padded))


IMPLS = ("flexattention", "sdpa", "flashattention4")


def fa4_or_reason():
    """(wavealign.fa4, flash_attn_func), or (None, why the FlashAttention-4 rows are skipped)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as error:  # any import failure of the optional peer only skips its rows
        return None, f"flash_attn.cute is not importable ({error!r}): install flash-attn-4 (bench/gpu/fa4_wheels.sh)"
    try:
        from wavealign import fa4
    except Exception as error:
        return None, f"wavealign's Python package is not importable ({error!r}): put BUILD/python on PYTHONPATH"
    return (fa4, flash_attn_func), None


def token_order(perm, heads, padded, head_dim):
    """The gather index [1, H, padded, d] that moves Q's query blocks into the order `perm` [H, MB]."""
    tokens = (torch.from_numpy(perm.astype(np.int64)).cuda()[:, :, None] * BLOCK
              + torch.arange(BLOCK, device="cuda")).reshape(heads, padded)
    return tokens[None, :, :, None].expand(1, heads, padded, head_dim)


def run_fa4(fa4, flash_attn_func, mask, perms, q, k, v, tokens, sdpa, common, flops, args, sampler):
    """FlashAttention-4 block-sparse in each order of `perms` ({order: permutation [H, MB]}) through the
    plug-in path, and dense on the unpadded tokens when `sdpa`. q, k, v: [1, H, padded, d] bf16."""
    import wavealign

    heads, q_blocks, _ = mask.shape
    padded = q_blocks * BLOCK
    k_fa4, v_fa4 = (x.transpose(1, 2).contiguous() for x in (k, v))  # FA4's layout [B, L, H, d]
    outputs, indices = {}, {}
    for order, perm in perms.items():
        permuted_mask = np.take_along_axis(mask, perm[:, :, None].astype(np.int64), axis=1)
        # A plan of the permuted mask in its own order: its block-sparse tensors are the permuted rows.
        plan = wavealign.plan(permuted_mask, order="original", skip="never", block_size=BLOCK)
        tensors = fa4.block_sparse_tensors(plan, padded, device="cuda")
        indices[order] = token_order(perm, heads, padded, args.head_dim)
        q_order = torch.gather(q, 2, indices[order]).transpose(1, 2).contiguous()
        fn = lambda: flash_attn_func(q_order, k_fa4, v_fa4, block_sparse_tensors=tensors)[0]  # noqa: E731
        outputs[order] = fn().transpose(1, 2)
        ms, clocks = time_ms(fn, args.iters, args.cold_l2, sampler, warmup_ms=args.warmup_ms)
        print(json.dumps({"impl": "flashattention4", "order": order, "ms": ms, "tflops": flops / ms / 1e9,
                          **common, **clocks}), flush=True)
    for order in outputs:
        if order != "original":
            restored = torch.empty_like(outputs[order]).scatter_(2, indices[order], outputs[order])
            print(json.dumps({"check": f"fa4 {order} order unpermuted vs original", "mask": common["mask"],
                              "tokens": tokens, "bitwise_equal": bool(torch.equal(restored, outputs["original"])),
                              "max_abs_difference": (restored.float() - outputs["original"].float()).abs().max()
                              .item()}), flush=True)
    if sdpa:
        qd, kd, vd = (x[:, :, :tokens].transpose(1, 2).contiguous() for x in (q, k, v))
        ms, clocks = time_ms(lambda: flash_attn_func(qd, kd, vd), max(2, args.iters // 2), args.cold_l2, sampler,
                             warmup=1, warmup_ms=args.warmup_ms)
        print(json.dumps({"impl": "flashattention4", "order": "dense", "ms": ms,
                          "tflops": dense_flops(heads, tokens, args.head_dim) / ms / 1e9,
                          **dense_common(common, heads, q_blocks, mask.shape[2]), **clocks}), flush=True)


def dense_flops(heads, tokens, head_dim):
    return 4.0 * heads * tokens * tokens * head_dim


def dense_common(common, heads, q_blocks, kv_blocks):
    return {**common, "mode": "dense", "density": 1.0, "mask": "dense", "nnz_blocks": heads * q_blocks * kv_blocks}


def run_case(mask_path, perm_path, tokens, kind, sdpa, s2_path, args, compiled, sampler, fa4):
    mask = np.load(mask_path)
    perm = np.load(perm_path)
    heads, q_blocks, kv_blocks = mask.shape
    padded = q_blocks * BLOCK  # flex needs whole blocks; the padding rows/keys are part of the last block anyway
    nnz = int(mask.sum())
    flops = 4.0 * BLOCK * BLOCK * args.head_dim * nnz
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, heads, padded, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))

    common = {"tokens": tokens, "heads": heads, "head_dim": args.head_dim, "block": BLOCK,
              "density": nnz / (heads * q_blocks * kv_blocks), "nnz_blocks": nnz, "mask": kind,
              "l2": "cold" if args.cold_l2 else "warm", "mode": "sparse"}
    if "flexattention" in args.impls:
        permuted_mask = np.take_along_axis(mask, perm[:, :, None].astype(np.int64), axis=1)
        index = token_order(perm, heads, padded, args.head_dim)
        masks = {"original": block_mask_of(mask, heads, q_blocks, padded),
                 "wavealign": block_mask_of(permuted_mask, heads, q_blocks, padded)}
        queries = {"original": q, "wavealign": torch.gather(q, 2, index)}
        outputs = {}
        for impl, options in (("flexattention", None), ("flexattention-tuned", TUNED)):
            for order in ("original", "wavealign"):
                fn = lambda: compiled(queries[order], k, v, block_mask=masks[order], kernel_options=options)
                outputs[order] = fn()
                ms, clocks = time_ms(fn, args.iters, args.cold_l2, sampler, warmup_ms=args.warmup_ms)
                print(json.dumps({"impl": impl, "order": order, "ms": ms, "tflops": flops / ms / 1e9, **common,
                                  **clocks}), flush=True)

        # The plug-in path on this run: WaveAlign order, un-permuted, equals the original order (bf16 rounding).
        restored = torch.empty_like(outputs["wavealign"]).scatter_(2, index, outputs["wavealign"])
        difference = (restored.float() - outputs["original"].float()).abs().max().item()
        print(json.dumps({"check": "flex wavealign order unpermuted vs original", "mask": kind, "tokens": tokens,
                          "max_abs_difference": difference}), flush=True)

    if sdpa and "sdpa" in args.impls:
        qs, ks, vs = q[:, :, :tokens], k[:, :, :tokens], v[:, :, :tokens]
        ms, clocks = time_ms(lambda: F.scaled_dot_product_attention(qs, ks, vs), max(2, args.iters // 2),
                             args.cold_l2, sampler, warmup=1, warmup_ms=args.warmup_ms)
        print(json.dumps({"impl": "sdpa", "order": "dense", "ms": ms,
                          "tflops": dense_flops(heads, tokens, args.head_dim) / ms / 1e9,
                          **dense_common(common, heads, q_blocks, kv_blocks), **clocks}), flush=True)

    if fa4 is not None:
        perms = {"original": np.tile(np.arange(q_blocks, dtype=np.int32), (heads, 1))}
        if s2_path:
            perms["s2"] = np.load(s2_path)
        perms["wavealign"] = perm
        run_fa4(*fa4, mask, perms, q, k, v, tokens, sdpa, common, flops, args, sampler)


def milliseconds(text):
    """argparse type of --warmup-ms: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds >= 0, got {text!r}")
    return value


def implementations(text):
    """argparse type of --impls: a comma-separated subset of IMPLS."""
    chosen = tuple(name for name in text.split(",") if name)
    unknown = [name for name in chosen if name not in IMPLS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(IMPLS)}, got {text!r}")
    return chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", required=True,
                        help="MASK.npy:PERM.npy:TOKENS:KIND[:sdpa][:s2=S2PERM.npy]")
    parser.add_argument("--impls", type=implementations, default=",".join(IMPLS),
                        help=f"comma-separated subset of {','.join(IMPLS)} (default: all)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--cold-l2", action="store_true")
    parser.add_argument("--warmup-ms", type=milliseconds, default=0.0,
                        help="warm-up kernel time before each timing, past the power cap's boost transient")
    args = parser.parse_args()
    compiled = torch.compile(flex_attention, dynamic=False)
    sampler = ClockSampler()
    fa4 = None
    if "flashattention4" in args.impls:
        fa4, reason = fa4_or_reason()
        if fa4 is None:
            print(f"bench_peers: FlashAttention-4 rows skipped: {reason}", file=sys.stderr, flush=True)
            print(json.dumps({"skipped": "flashattention4", "reason": reason}), flush=True)
    for case in args.case:
        mask_path, perm_path, tokens, kind, *options = case.split(":")
        s2_path = next((option[len("s2="):] for option in options if option.startswith("s2=")), None)
        try:
            run_case(mask_path, perm_path, int(tokens), kind, "sdpa" in options, s2_path, args, compiled, sampler, fa4)
        except Exception as error:  # one failing case must not lose the others' numbers
            print(json.dumps({"case": case, "error": repr(error)}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
