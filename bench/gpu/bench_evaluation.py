#!/usr/bin/env python3
"""The GPU side of the paper's kernel-level evaluation (bench/gpu/run_evaluation.sh runs it; docs/evaluation.md).

For every mask method x sequence length, on the mask the method's GPU generator wrote (`wavealign mask`,
MASKS/METHOD-FRAMES.npy with its JSON summary beside it), Q, K, V seeded normal bf16 [1, H, L, 128]:

- impl "wavealign": the GPU plan of each row order (original, s1, s2, wavealign; skip off, so every head runs
  in that order) timed on the host around wavealign.plan() and the kernel's CSR and schedule tensors (both
  synchronized: what a call pays before its first launch), then our fused kernel in that order (kind "kernel"), and its output against
  the original order's, bit for bit. The WaveAlign row also records what the adaptive skip with the H200
  profile would decide per head.
- impl "flashattention4" (when flash_attn.cute imports): FA4's block-sparse forward on the original mask
  (the baseline, kind "kernel", order "original"), on the permuted queries and mask of each --fa4-orders
  order (kind "kernel"; WaveAlign by default) and the whole plug-in path wavealign.fa4.sparse_attention (kind "plugin": permute Q, FA4,
  unpermute O), with the time to build FA4's block-sparse tensors of each plan, and the plug-in output
  against the baseline, bit for bit.
- --ceiling (impl "wavealign", kind "ceiling", order "s2"): the same mask with each row's kept blocks moved to
  the row's first columns (`packed_rows`: the same row lengths, blocks and FLOPs, but every row of a wave walks
  the same K/V blocks in the same sequence, so nearly every K/V read after a wave's first hits in L2), in
  Stage 2's order. No row order of the real mask can share K/V more than that, so its time bounds what any
  order can give (docs/reordering.md).

Timing: CUDA events around one call, L2 flushed before each (cold), the median of --iters after one untimed
call; the first timing of each length first runs --warmup-ms of warm-up kernels (the H200's 700 W power cap
engages within ~100 ms of a kernel starting: after the warm-up every timed call runs at the steady, capped
clock), later ones at least --case-warmup-ms (a gap of a few hundred ms between cases lets the clock rise
again). Each line records the SM clock, power and power-capped share of its timed calls.

--profile launches every case exactly once and writes the case of each launch, in launch order, to
--cases-out: run under Nsight Compute, whose rows then map to the cases in that order (bench/gpu/
collect_evaluation.py checks the counts and the kernel names).

    PYTHONPATH=build/python python3 bench/gpu/bench_evaluation.py --masks DIR --frames 401,161 \\
        [--methods xattention,sparge,minference,flexprefill] [--impls wavealign,flashattention4] [--iters 3] \\
        [--orders original,s1,s2,wavealign[,com,span,wave-union,hilbert,chain]] [--fa4-orders wavealign,...] \\
        [--warmup-ms 2000] [--ceiling] [--fig14 DIR] [--profile --cases-out FILE]

Prints one JSON object per line: {"bench": "evaluation", "impl", "kind", "method", "frames", "tokens", "order",
"ms", "tflops", ...}, {"check": ..., "bitwise_equal"}, {"skipped": impl, "reason"}.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any, Callable

import numpy as np
import torch

import wavealign
from wavealign import _core
from collect_evaluation import save_fig14_head  # the one writer of Fig. 14's input (this script's folder)
from wavealign.bench import (ClockSampler, fa4_or_reason, implementations, milliseconds, positive_int, print_json,
                             time_ms)

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROFILE = ROOT / "bench" / "results" / "h200-skip-profile.json"
METHODS = ("xattention", "sparge", "minference", "flexprefill")
ORDERS = ("original", "s1", "s2", "wavealign")
# Issue 13's candidates beyond the paper's orders (docs/reordering.md), each followed by Stage 2; those without
# a GPU plan are planned on the CPU, and their rows say so ("planner": "cpu").
FURTHER_ORDERS = ("com", "span", "wave-union", "hilbert", "chain")
IMPLS = ("wavealign", "flashattention4")
HEAD_DIM = 128
BLOCK = 128


def frame_list(text: str) -> tuple[int, ...]:
    try:
        frames = tuple(int(part) for part in text.split(",") if part)
    except ValueError:
        frames = ()
    if not frames or any(f < 1 for f in frames):
        raise argparse.ArgumentTypeError(f"expected comma-separated frame counts >= 1, got {text!r}")
    return frames


class WarmUp:
    """Warm-up time of the next timing: the full warm-up once per sequence length, the short one after."""

    def __init__(self, first_ms: float, later_ms: float) -> None:
        self.first_ms, self.later_ms, self.pending = first_ms, later_ms, True

    def reset(self) -> None:
        self.pending = True

    def take(self) -> float:
        ms = self.first_ms if self.pending else self.later_ms
        self.pending = False
        return ms


def load_case(masks: pathlib.Path, method: str, frames: int) -> tuple[dict, Any]:
    """(the generator's JSON summary, its bool mask [H, MB, NB] on the GPU)."""
    stem = masks / f"{method}-{frames}"
    summary = json.loads(stem.with_suffix(".json").read_text())
    return summary, torch.from_numpy(np.load(stem.with_suffix(".npy"))).cuda()


def available(masks: pathlib.Path, methods: tuple[str, ...], frames: int) -> list[str]:
    """The methods whose mask at `frames` is there; each missing one is reported as a skipped line."""
    present = []
    for method in methods:
        stem = masks / f"{method}-{frames}"
        if stem.with_suffix(".npy").exists() and stem.with_suffix(".json").exists():
            present.append(method)
        else:
            print_json({"skipped": method, "frames": frames, "reason": f"no mask {stem}.npy (and .json)"})
    return present


def synchronized_ms(fn: Callable[[], Any]) -> tuple[Any, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - start) * 1e3


def gpu_plan(mask: Any, order: str, repeats: int) -> tuple[Any, float, list[float]]:
    """The plan of `order` (skip off) and the median host time of plan + CSR over `repeats` builds; the first
    build, which makes the planner of this shape and order, is not timed. On the mask's GPU where the order has
    a GPU plan, else on the CPU (the plan's `planner` says which; a CPU plan is timed once)."""
    planner = "auto" if _core.order_has_gpu_plan(order) else "cpu"
    if planner == "cpu":
        repeats = 1

    def build() -> Any:
        plan = wavealign.plan(mask, order=order, skip="never", planner=planner)
        # The CSR and schedule the fused kernel reads, as sparse_attention derives them on its first call (on
        # the plan's device without a copy; a CPU plan's are copied to the mask's device). Not Plan.csr():
        # that returns the user a copy made through the host (76 MB of round trip at 9.5 M blocks, ~30 ms).
        plan._launch_tensors(mask.device, 1, plan.heads, "sequential")
        return plan

    if planner != "cpu":
        build()
    runs = []
    for _ in range(repeats):
        plan, ms = synchronized_ms(build)
        runs.append(round(ms, 4))
    return plan, float(np.median(runs)), runs


def adaptive_skip(mask: Any, tokens: int) -> dict:
    """What the adaptive skip with the H200 profile decides per head (skip="auto", one attention call)."""
    plan = wavealign.plan(mask, order="wavealign", skip="auto", profile=str(PROFILE), tokens=tokens)
    return {"skipped": plan.skipped, "reasons": plan.reason}


def packed_rows(mask: Any) -> Any:
    """`mask` [H, MB, NB] with each row's kept blocks moved to columns 0 .. n - 1 (n = the row's count)."""
    counts = mask.sum(dim=-1, keepdim=True)
    return torch.arange(mask.shape[-1], device=mask.device) < counts


def case_fields(summary: dict, method: str, frames: int, mask: Any) -> dict:
    heads, q_blocks, kv_blocks = (int(n) for n in mask.shape)
    nnz = int(mask.sum())
    return {"bench": "evaluation", "method": method, "frames": frames, "tokens": int(summary["inputs"]["tokens"]),
            "heads": heads, "head_dim": HEAD_DIM, "block": BLOCK, "q_blocks": q_blocks, "kv_blocks": kv_blocks,
            "nnz_blocks": nnz, "density": nnz / (heads * q_blocks * kv_blocks), "l2": "cold"}


def check_row(impl: str, order: str, reference: str, common: dict, same: Any, other: Any) -> dict:
    return {"check": f"{impl} {order} vs {reference}", "method": common["method"], "frames": common["frames"],
            "bitwise_equal": bool(torch.equal(same, other)),
            "max_abs_difference": (same.float() - other.float()).abs().max().item()}


def run_wavealign(mask: Any, qkv: tuple, common: dict, args: Any, sampler: ClockSampler, warm: WarmUp,
                  fig14: bool) -> None:
    q, k, v = qkv
    flops = 4.0 * BLOCK * BLOCK * HEAD_DIM * common["nnz_blocks"]
    reference, permutations = None, {}

    def timed(plan: Any) -> tuple[Any, float, dict]:
        """Our kernel in the plan's order: (the output, the median ms, the clock record)."""
        def call() -> Any:
            return wavealign.sparse_attention(q, k, v, plan)

        output = call()
        return (output, *time_ms(call, args.iters, True, sampler, warmup=1, warmup_ms=warm.take()))

    for order in args.orders:
        plan, plan_ms, plan_runs = gpu_plan(mask, order, args.plan_repeats)
        permutations[order] = plan.permutation
        output, ms, clocks = timed(plan)
        row = {**common, "impl": "wavealign", "kind": "kernel", "order": order, "ms": ms,
               "tflops": flops / ms / 1e9, "plan_ms": plan_ms, "plan_ms_runs": plan_runs,
               "planner": plan.planner, **clocks}
        if order == "wavealign":
            row["adaptive_skip"] = adaptive_skip(mask, common["tokens"])
        print_json(row)
        if reference is None:
            reference = output
        else:
            print_json(check_row("wavealign", order, args.orders[0], common, output, reference))
    if args.ceiling:
        packed = packed_rows(mask)
        plan, plan_ms, _ = gpu_plan(packed, "s2", 1)
        _, ms, clocks = timed(plan)
        print_json({**common, "impl": "wavealign", "kind": "ceiling", "order": "s2", "mask": "packed rows",
                    "ms": ms, "tflops": flops / ms / 1e9, "plan_ms": plan_ms, "planner": plan.planner, **clocks})
        del packed
    if fig14:
        save_fig14_head(args.fig14, common["method"], mask[0].cpu().numpy(),
                        {order: perm[0].cpu().numpy() for order, perm in permutations.items()})


def run_fa4(parts: tuple, mask: Any, fa4_qkv: tuple, common: dict, args: Any, sampler: ClockSampler,
            warm: WarmUp) -> None:
    from wavealign import fa4

    flash_attn_func = parts[1]
    q4, k4, v4 = fa4_qkv  # FA4's layout [1, L, H, d]
    tokens, heads = common["tokens"], common["heads"]
    flops = 4.0 * BLOCK * BLOCK * HEAD_DIM * common["nnz_blocks"]
    plans = {"original": (wavealign.plan(mask, order="original", skip="never"), 0.0, [])}
    for order in args.fa4_orders:
        plans[order] = gpu_plan(mask, order, args.plan_repeats)
    tensors, tensors_ms, calls = {}, {}, {}
    for order, (plan, _, _) in plans.items():
        tensors[order], tensors_ms[order] = synchronized_ms(
            lambda plan=plan: fa4.block_sparse_tensors(plan, tokens, heads=heads, device=q4.device))
        q_order = q4 if order == "original" else fa4.permute_rows(plan, q4)
        calls[("kernel", order)] = (lambda q_order=q_order, order=order:
                                    flash_attn_func(q_order, k4, v4, block_sparse_tensors=tensors[order])[0])
    if "wavealign" in plans:
        # The plug-in path takes [B, H, L, d] (here the views of FA4's layout, no copy) and returns that view;
        # transposed back, its output compares with the kernel rows' [B, L, H, d].
        calls[("plugin", "wavealign")] = lambda: fa4.sparse_attention(
            *(x.transpose(1, 2) for x in (q4, k4, v4)), plans["wavealign"][0]).transpose(1, 2)
    # FA4 compiles on a layout's first call (~20 s, the GPU idle): the next timing warms up in full again.
    outputs, first_calls_ms = synchronized_ms(lambda: {key: call() for key, call in calls.items()})
    if first_calls_ms > 1000:
        warm.reset()
    for (kind, order), call in calls.items():
        plan, plan_ms, plan_runs = plans[order]
        ms, clocks = time_ms(call, args.iters, True, sampler, warmup=1, warmup_ms=warm.take())
        print_json({**common, "impl": "flashattention4", "kind": kind, "order": order, "ms": ms,
                    "tflops": flops / ms / 1e9, "plan_ms": plan_ms, "plan_ms_runs": plan_runs,
                    "planner": plan.planner, "fa4_tensors_ms": tensors_ms[order], **clocks})
    if "wavealign" in plans:
        print_json(check_row("flashattention4", "plugin wavealign", "original", common,
                             outputs[("plugin", "wavealign")], outputs[("kernel", "original")]))


def profile_cases(masks: pathlib.Path, frames: int, args: Any, qkv: tuple, fa4_qkv: tuple | None,
                  fa4_parts: tuple | None) -> list[dict]:
    """One launch per case (under Nsight Compute); returns the cases in launch order."""
    q, k, v = qkv
    cases = []
    for method in available(masks, args.methods, frames):
        summary, mask = load_case(masks, method, frames)
        common = case_fields(summary, method, frames, mask)
        plans = {}
        for order in args.orders:
            plans[order] = gpu_plan(mask, order, 1)[0]
            cases.append({**common, "impl": "wavealign", "kind": "kernel", "order": order})
            wavealign.sparse_attention(q, k, v, plans[order])
            torch.cuda.synchronize()
        if args.ceiling:
            packed_plan = gpu_plan(packed_rows(mask), "s2", 1)[0]
            cases.append({**common, "impl": "wavealign", "kind": "ceiling", "order": "packed rows"})
            wavealign.sparse_attention(q, k, v, packed_plan)
            torch.cuda.synchronize()
        if fa4_parts is None:
            continue
        from wavealign import fa4

        q4, k4, v4 = fa4_qkv
        for order in ("original", "wavealign"):
            plan = plans.get(order) or wavealign.plan(mask, order=order, skip="never")
            tensors = fa4.block_sparse_tensors(plan, common["tokens"], heads=common["heads"], device=q4.device)
            q_order = q4 if order == "original" else fa4.permute_rows(plan, q4)
            torch.cuda.synchronize()
            cases.append({**common, "impl": "flashattention4", "kind": "kernel", "order": order})
            fa4_parts[1](q_order, k4, v4, block_sparse_tensors=tensors)
            torch.cuda.synchronize()
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masks", type=pathlib.Path, required=True, help="folder of METHOD-FRAMES.npy/.json")
    parser.add_argument("--frames", type=frame_list, required=True, help="comma-separated pixel frame counts")
    parser.add_argument("--methods", type=implementations(METHODS), default=METHODS)
    parser.add_argument("--orders", type=implementations(ORDERS + FURTHER_ORDERS), default=ORDERS)
    parser.add_argument("--fa4-orders", type=implementations(ORDERS[1:] + FURTHER_ORDERS), default=("wavealign",),
                        help="FA4's orders besides the original one (the plug-in path runs in WaveAlign order)")
    parser.add_argument("--impls", type=implementations(IMPLS), default=IMPLS)
    parser.add_argument("--iters", type=positive_int, default=3)
    parser.add_argument("--plan-repeats", type=positive_int, default=3)
    parser.add_argument("--warmup-ms", type=milliseconds, default=2000.0,
                        help="warm-up kernel time before the first timing of each length")
    parser.add_argument("--case-warmup-ms", type=milliseconds, default=200.0,
                        help="warm-up kernel time before each later timing")
    parser.add_argument("--ceiling", action="store_true", help="also time each mask with its rows packed to the "
                        "first columns (the bound of any row order; impl wavealign)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fig14", type=pathlib.Path, help="write head 0 of each method's mask and plans at the "
                                                          "longest length here (Fig. 14)")
    parser.add_argument("--profile", action="store_true", help="one launch per case, for Nsight Compute")
    parser.add_argument("--cases-out", type=pathlib.Path, help="--profile: the cases in launch order (JSON lines)")
    args = parser.parse_args(argv)
    if args.orders[0] != "original":
        parser.error("argument --orders: must start with original (the reference of the bitwise checks)")
    if args.profile and args.cases_out is None:
        parser.error("--profile needs --cases-out")
    if not torch.cuda.is_available():
        for impl in args.impls:
            print_json({"skipped": impl, "reason": "no CUDA device"})
        return 0

    fa4_parts = None
    if "flashattention4" in args.impls:
        fa4_parts, reason = fa4_or_reason()
        if fa4_parts is None:
            print(f"bench_evaluation: flashattention4 skipped: {reason}", file=sys.stderr)
            print_json({"skipped": "flashattention4", "reason": reason})
    print_json({"env": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                        "wavealign": wavealign.__version__, "fa4": fa4_parts is not None}})

    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    sampler = ClockSampler()
    warm = WarmUp(args.warmup_ms, args.case_warmup_ms)
    cases = []
    for frames in args.frames:
        methods = available(args.masks, args.methods, frames)
        if not methods:
            continue
        summary = json.loads((args.masks / f"{methods[0]}-{frames}.json").read_text())
        heads, tokens = int(summary["heads"]), int(summary["inputs"]["tokens"])
        qkv = tuple(torch.randn(1, heads, tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                                generator=generator) for _ in range(3))
        fa4_qkv = None if fa4_parts is None else tuple(x.transpose(1, 2).contiguous() for x in qkv)
        if args.profile:
            cases += profile_cases(args.masks, frames, args, qkv, fa4_qkv, fa4_parts)
            continue
        warm.reset()
        for method in methods:
            summary, mask = load_case(args.masks, method, frames)
            common = case_fields(summary, method, frames, mask)
            if "wavealign" in args.impls:
                run_wavealign(mask, qkv, common, args, sampler, warm,
                              fig14=args.fig14 is not None and frames == max(args.frames))
            if fa4_parts is not None:
                try:
                    run_fa4(fa4_parts, mask, fa4_qkv, common, args, sampler, warm)
                except Exception as error:  # FA4 failing on one mask must not lose the other rows
                    print_json({**common, "impl": "flashattention4", "error": repr(error)})
            del mask
        del qkv, fa4_qkv
        torch.cuda.empty_cache()
    if args.profile:
        args.cases_out.write_text("".join(json.dumps(case) + "\n" for case in cases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
