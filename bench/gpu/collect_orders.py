#!/usr/bin/env python3
"""Tables of the orders step (`bench/gpu/run_evaluation.sh BUILD LOG orders`: every candidate row order on the
four methods' masks, our kernel and FA4, and the packed-rows bound) for docs/reordering.md, and the run's entry
of bench/results/h200-orders-methods.json.

    bench/gpu/collect_orders.py LOG/orders.jsonl --commit C [--out bench/results/h200-orders-methods.json]
        [--ncu LOG/orders-ncu] [--markdown]

Every speedup is against the paper's S1 + S2 (order "wavealign") of the same method and backend, in one run:
"kernel" compares kernel times, "with plan" adds each order's own plan cost as the driver timed it on the host
(GPU plan with the tensors the kernel reads, or the CPU plan of orders that have no GPU plan). The bound row
("packed rows", impl wavealign) is the same mask with each row's blocks moved to its first columns: the most
K/V sharing any order could give. --out writes the run's record (bench/result_record.py's schema), replacing
the file's earlier one. --ncu adds each of our kernel's cases' L2 hit rate, HBM SOL and HBM bytes read from the orders-ncu step
(one profiled launch per case, matched to its case as bench/gpu/collect_evaluation.py matches them).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import collect_evaluation  # noqa: E402  (the one reader of the evaluation's ncu logs)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import result_record  # noqa: E402

METHODS, LABELS = collect_evaluation.METHODS, collect_evaluation.LABELS
BACKENDS = {"wavealign": "our kernel", "flashattention4": "FA4"}
REFERENCE = "wavealign"
CEILING = "packed rows"


def read(path: pathlib.Path) -> tuple[list[dict], dict]:
    """(the timing rows, the env line) of one orders.jsonl; a later row of the same case replaces an earlier one."""
    rows, env = {}, {}
    try:
        lines = collect_evaluation.read_jsonl(path)
    except collect_evaluation.LogError as error:
        raise SystemExit(f"collect_orders: {error}")
    for row in lines:
        if "env" in row:
            env = row["env"]
        elif "ms" in row and row.get("kind") in ("kernel", "ceiling"):
            rows[(row["impl"], row["kind"], row["method"], row["frames"], row["order"])] = row
    return list(rows.values()), env


NCU_FIELDS = {"l2_hit_pct": collect_evaluation.NCU_L2, "hbm_sol_pct": collect_evaluation.NCU_SOL,
              "hbm_read_bytes": collect_evaluation.NCU_READ}


def read_ncu(folder: pathlib.Path) -> dict[tuple, dict]:
    """{(impl, method, frames, order): {l2_hit_pct, hbm_sol_pct, hbm_read_bytes}} of an orders-ncu folder."""
    logs = collect_evaluation.Logs(folder)
    for note in logs.notes:
        print(f"collect_orders: {note}", file=sys.stderr)
    return {(impl, method, int(launch["frames"]), order): {field: launch.get(metric) for field, metric in NCU_FIELDS.items()}
            for (impl, method, order), launch in logs.ncu.items()}


def derive(rows: list[dict], ncu: dict[tuple, dict] | None = None) -> list[dict]:
    """One entry per (backend, method, frames, order or bound): ms, TF/s, plan ms, speedups over S1 + S2, and
    the profiled launch's L2 and HBM figures where `ncu` has the case."""
    ncu = ncu or {}
    reference = {(r["impl"], r["method"], r["frames"]): r for r in rows
                 if r["kind"] == "kernel" and r["order"] == REFERENCE}
    derived = []
    for row in rows:
        base = reference.get((row["impl"], row["method"], row["frames"]))
        if base is None:
            continue
        order = CEILING if row["kind"] == "ceiling" else row["order"]
        plan = row.get("plan_ms", 0.0) or 0.0
        base_total = base["ms"] + (base.get("plan_ms", 0.0) or 0.0)
        derived.append({
            "backend": row["impl"], "method": row["method"], "frames": row["frames"], "tokens": row["tokens"],
            "density": row["density"], "order": order, "planner": row.get("planner"), "ms": row["ms"],
            "tflops": row["tflops"], "plan_ms": plan, "sm_clock_mhz": row.get("sm_clock_mhz"),
            "kernel_vs_s1s2": base["ms"] / row["ms"],
            # The bound has no plan of its own to charge: it is a property of the mask, not an order.
            "with_plan_vs_s1s2": None if order == CEILING else base_total / (row["ms"] + plan),
            **ncu.get((row["impl"], row["method"], row["frames"], order), {})})
    return derived


def order_columns(derived: list[dict]) -> list[str]:
    seen = []
    for row in derived:
        if row["order"] not in seen:
            seen.append(row["order"])
    return [o for o in seen if o != CEILING] + ([CEILING] if CEILING in seen else [])


def markdown(derived: list[dict]) -> str:
    columns = order_columns(derived)
    cell = {(r["backend"], r["method"], r["frames"], r["order"]): r for r in derived}
    cases = sorted({(r["frames"], r["method"]) for r in derived}, key=lambda c: (-c[0], METHODS.index(c[1])))

    def block(title: str, backends: dict, text, label) -> list[str]:
        """One table: a row per backend and case that has a cell for which text() gives a value."""
        rows = []
        for backend, backend_label in backends.items():
            for frames, method in cases:
                cells = [cell.get((backend, method, frames, order)) for order in columns]
                values = [text(c) if c else None for c in cells]
                if any(v is not None for v in values):
                    first = next(c for c in cells if c)
                    rows.append(([backend_label] if len(backends) > 1 else []) + [label(method, first)] +
                                [v if v is not None else "–" for v in values])
        header = (["backend"] if len(backends) > 1 else []) + ["method"] + columns
        return ["", title, "", collect_evaluation.table(header, rows)] if rows else []

    tokens = lambda method, c: f"{LABELS[method]} ({c['tokens']:,})"
    ours = {"wavealign": BACKENDS["wavealign"]}
    lines = block("Kernel time, ms (TF/s):", BACKENDS, lambda c: f"{c['ms']:.2f} ({c['tflops']:.0f})",
                  lambda method, c: f"{LABELS[method]} ({c['density']:.1%}, {c['tokens']:,} tokens)")
    lines += block("Plan cost of each order on our kernel, ms, host-timed (the original order's builds the CSR the "
                   "kernel reads; the bound's is Stage 2 on the packed mask), and where it ran:", ours,
                   lambda c: f"{c['plan_ms']:.2f} ({c['planner']})", tokens)
    lines += block("Against S1 + S2 (`wavealign`) of the same backend: kernel time alone / with each order's plan:",
                   BACKENDS, lambda c: f"{c['kernel_vs_s1s2']:.3f}×" + (
                       "" if c["with_plan_vs_s1s2"] is None else f" / {c['with_plan_vs_s1s2']:.3f}×"), tokens)
    lines += block("Nsight Compute, one launch each (our kernel): L2 hit / HBM SOL / HBM read:", ours,
                   lambda c: None if c.get("l2_hit_pct") is None else
                   f"{c['l2_hit_pct']:.1f} % / {c['hbm_sol_pct']:.1f} % / {c['hbm_read_bytes'] / 1e9:.1f} GB", tokens)
    return "\n".join(lines[1:])


def plot(derived: list[dict], path: pathlib.Path) -> None:
    """Bars of kernel-only speedup over S1 + S2 per order, one panel per backend, methods side by side, at the
    longest length of the run (the packed-rows bound as a hatched bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = max(r["frames"] for r in derived)
    columns = order_columns(derived)
    backends = [b for b in BACKENDS if any(r["backend"] == b for r in derived)]
    figure, axes = plt.subplots(1, len(backends), figsize=(6.5 * len(backends), 3.6), squeeze=False)
    width = 0.8 / len(METHODS)
    for axis, backend in zip(axes[0], backends):
        cell = {(r["method"], r["order"]): r for r in derived if r["backend"] == backend and r["frames"] == frames}
        for m, method in enumerate(METHODS):
            xs = [i + (m - 1.5) * width for i in range(len(columns))]
            ys = [cell[(method, o)]["kernel_vs_s1s2"] if (method, o) in cell else 0.0 for o in columns]
            bars = axis.bar(xs, ys, width, label=LABELS[method])
            for bar, order in zip(bars, columns):
                if order == CEILING:
                    bar.set_hatch("//")
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.axhline(1.05, color="grey", linewidth=0.8, linestyle="--")
        axis.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
        axis.set_ylim(0.8, 1.1)
        axis.set_ylabel("kernel speedup over S1 + S2")
        axis.set_title(f"{BACKENDS[backend]} ({frames} frames)")
    axes[0][0].legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=pathlib.Path, help="orders.jsonl of run_evaluation.sh's orders step")
    parser.add_argument("--commit", required=True, help="the commit the run was made from")
    parser.add_argument("--command", default="WA_ORDER_FRAMES=401 bench/gpu/run_evaluation.sh build LOG orders")
    parser.add_argument("--date", default=None, help="the day of the run (default: today)")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="the results JSON to write the run's record to")
    parser.add_argument("--ncu", type=pathlib.Path, default=None, help="the orders-ncu folder of the same run")
    parser.add_argument("--markdown", action="store_true", help="print the tables")
    parser.add_argument("--plot", type=pathlib.Path, default=None, help="write the speedup bars to this PNG")
    args = parser.parse_args(argv)
    rows, env = read(args.log)
    derived = derive(rows, read_ncu(args.ncu) if args.ncu else None)
    if not derived:
        print(f"collect_orders: no order rows with an S1 + S2 reference in {args.log}", file=sys.stderr)
        return 1
    if args.markdown:
        print(markdown(derived))
    if args.plot is not None:
        plot(derived, args.plot)
    if args.out is not None:
        result_record.write(args.out, result_record.make(
            env.get("device") or "unknown", args.command, commit=args.commit, date=args.date, fa4=env.get("fa4"),
            derived=derived, rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
