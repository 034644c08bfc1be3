#!/usr/bin/env python3
"""The kernel timeline of one GPU mask generation at full clock: every kernel's stream, start and duration
(CUPTI through torch.profiler), so that what runs beside what, and the gaps between launches, can be read.
Nsight Compute serialises kernels and times them at its locked clock; this shows them as they run.

Q and K are seeded normal bf16 [1, heads, L, d] (the scoring passes, the pooling and the selections cost the
same on any values; which heads turn query-aware, and so the pooled map's work, depends on them).

Usage: bench/gpu/trace_mask_kernels.py BUILD [--method flexprefill] [--frames 401] [--heads 40] [--warmup 2]
                                       [--option NAME=VALUE ...] [--json OUT]
--option passes one of the method's options (a Python literal: --option stride=16 --option int8_estimate=True).
BUILD is a CMake build directory holding the Python extension (BUILD/python).
"""
import argparse
import ast
import collections
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from collect_mask_kernels import short_name  # noqa: E402  (one reader of kernel names)


def method_option(text: str):
    """NAME=VALUE with VALUE a Python literal -> (NAME, value)."""
    name, separator, value = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"{name}: {value!r} is not a Python literal") from None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", type=pathlib.Path)
    parser.add_argument("--method", default="flexprefill", choices=("flexprefill", "minference", "sparge",
                                                                     "xattention"))
    parser.add_argument("--frames", type=int, default=401, help="Wan2.1-14B 720p frames (401: 363,600 tokens)")
    parser.add_argument("--heads", type=int, default=40)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--option", action="append", default=[], type=method_option,
                        help="NAME=VALUE, one of the method's options (repeat for more)")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    options = dict(args.option)
    sys.path.insert(0, str(args.build / "python"))
    import torch
    from torch.profiler import ProfilerActivity, profile

    import wavealign.methods as methods

    tokens = ((args.frames - 1) // 4 + 1) * (720 // 16) * (1280 // 16)  # latent frames x 45 x 80 patches
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn((1, args.heads, tokens, args.head_dim), generator=generator, device="cuda",
                        dtype=torch.bfloat16) for _ in range(2))
    method = getattr(methods, args.method)

    def run(q, k):
        return method(q, k, **options)
    for _ in range(args.warmup):
        run(q, k)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        start.record()
        run(q, k)
        end.record()
        torch.cuda.synchronize()
    kernels = [event for event in trace.events() if event.device_type.name == "CUDA" and
               not event.name.startswith(("Memcpy", "Memset", "cudaEvent"))]
    kernels.sort(key=lambda event: event.time_range.start)
    origin = kernels[0].time_range.start
    rows = [{"name": short_name(event.name), "stream": getattr(event, "device_resource_id", None),
             "start_us": event.time_range.start - origin, "us": event.time_range.end - event.time_range.start}
            for event in kernels]
    wall_ms = start.elapsed_time(end)
    busy = sum(row["us"] for row in rows)
    print(f"{args.method} {options}: {tokens} tokens, {args.heads} heads: {wall_ms:.2f} ms between events, "
          f"{len(rows)} kernels, {busy / 1e3:.2f} ms of kernel time")
    for row in rows:
        print(f"  {row['start_us']:9.1f} us  +{row['us']:8.1f}  stream {row['stream']}  {row['name']}")
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for row in rows:
        by_name[row["name"]][0] += 1
        by_name[row["name"]][1] += row["us"]
    print("by kernel (launches, total us):")
    for name, (count, total) in sorted(by_name.items(), key=lambda item: -item[1][1]):
        print(f"  {total:9.1f} us  {count:4d}x  {name}")
    if args.json:
        args.json.write_text(json.dumps({"method": args.method, "options": options, "tokens": tokens, "heads": args.heads,
                                         "wall_ms": wall_ms, "kernels": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
