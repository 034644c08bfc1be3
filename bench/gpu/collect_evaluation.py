#!/usr/bin/env python3
"""Merges the logs of bench/gpu/run_evaluation.sh into bench/results/h200-evaluation.json, draws the figures
under docs/figures/ and fills the generated blocks of docs/evaluation.md, each beside the paper's H100 numbers.

Usage: bench/gpu/collect_evaluation.py LOG_DIR [--out bench/results/h200-evaluation.json] [--figures docs/figures]
                                       [--doc docs/evaluation.md]
       bench/gpu/collect_evaluation.py LOG_DIR --simulated [--wavealign build/wavealign] [--sim-frames 13,21,29,37]
                                       [--sim-heads 2] [--out LOG_DIR/evaluation.json]

LOG_DIR holds what run_evaluation.sh wrote on the GPU host (see its header). --simulated first fills LOG_DIR on
this machine from CPU runs, with no GPU: each method's fp64 CPU reference mask at reduced lengths
(--sim-frames, one per measured length, in the same order), `wavealign simulate` on it, a full mask for the
dense rows and `wavealign reorder` for Fig. 14. At 1/10 of the length a head's K/V fits the L2, so each
simulation scales the usable L2 by the ratio of the tokens (L_sim / L_measured): the K/V working set is then as
many L2s as at the measured length (the 132 concurrent rows, though, cover the sequence in one to three waves:
the numbers check the pipeline, not WaveAlign). Every number of a simulated run is labelled simulated; it writes
no bench/results record unless --out says where.

The document keeps everything outside its blocks (<!-- generated: NAME --> ... <!-- end generated: NAME -->):
the text around them is written by hand and survives every run. A block missing from the document is an error.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import math
import os
import pathlib
import re
import shlex
import subprocess
import sys
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import result_record  # noqa: E402
RUN_SCRIPT = ROOT / "bench" / "gpu" / "run_evaluation.sh"
METHODS = ("xattention", "sparge", "minference", "flexprefill")
LABELS = {"xattention": "XAttention", "sparge": "SpargeAttn", "minference": "MInference", "flexprefill": "FlexPrefill",
          "dense": "Dense", "random": "Random (20 %)"}
ORDERS = ("original", "s1", "s2", "wavealign")
ORDER_LABELS = {"original": "Original", "s1": "O + S1", "s2": "O + S2", "wavealign": "O + S1 + S2"}
IMPLS = ("wavealign", "flashattention4")
IMPL_LABELS = {"wavealign": "our kernel", "flashattention4": "FA4 (plug-in path)"}
BLOCK, HEAD_DIM = 128, 128
SLOTS = 132  # the H200's wave: 132 SMs x 1 CTA
BLOCKS = ("data", "setup", "fig2", "table1", "fig10", "fig11", "fig12", "fig14", "fig15", "checks", "budget")
FIGURES = ("fig2", "fig10", "fig11", "fig12", "fig14", "fig15")

# Roofs of Fig. 15: dense bf16 tensor-core peak and HBM bandwidth from the data sheets (H200 SXM: 989 TF/s,
# 4.8 TB/s HBM3e; the paper's H100 SXM: 990 TF/s, 3.35 TB/s).
ROOFS = {"H200": (989e12, 4.8e12), "H100 (paper)": (990e12, 3.35e12)}

# The paper's H100 numbers (Wan2.1-T2V-14B, FlashAttention-4; section II-B, VI-C to VI-E, Figs. 2, 10-12, Table I).
PAPER = {
    "fig2_gap": (1.09, 1.26),  # (1/rho) / S_actual over 148K-364K on Wan2.1, gap growing with the length
    "table1": {"dense": (100.0, 49.38, 46.51), "minference": (18.3, 79.28, 21.67),
               "flexprefill": (29.4, 86.43, 14.72), "xattention": (28.8, 83.44, 17.94),
               "sparge": (28.3, 84.06, 17.35), "random": (20.0, 87.77, 10.64)},  # density %, HBM SOL %, L2 hit %
    "fig10_speedup": {"minference": (1.092, 1.181), "flexprefill": (1.088, 1.179), "xattention": (1.124, 1.252),
                      "sparge": (1.125, 1.234)},  # WaveAlign incl. the reorder overhead over the original
    "fig10_overhead_share": (0.011, 0.032),  # reorder overhead / WaveAlign attention latency
    "fig11_l2_original": (28.48, 36.35), "fig11_l2_wavealign": (79.38, 89.06),
    "fig11_hbm_reduction": (80.71, 92.11),  # percent fewer HBM reads with WaveAlign
    "fig11_named": {"xattention": (36.35, 84.17), "sparge": (28.48, 80.04)},  # L2 hit original -> WaveAlign
    "fig12": {"s1": {"speedup_max": 1.0319, "l2": (34.88, 44.47), "hbm_reduction": (8.71, 18.61)},
              "s2": {"speedup": (1.091, 1.147), "l2": (68.35, 78.71), "hbm_reduction": (68.89, 83.67)},
              "wavealign": {"speedup_max": 1.17, "l2": (79.38, 89.06), "hbm_reduction_max": 92.11}},
}

NCU_L2, NCU_READ, NCU_WRITE = "lts__t_sector_hit_rate.pct", "dram__bytes_read.sum", "dram__bytes_write.sum"
NCU_SOL, NCU_TIME, NCU_CLOCK = ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum",
                                "sm__cycles_elapsed.avg.per_second")
UNIT_SCALE = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9,
              "nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3,  # durations in ms
              "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3,  # ncu 2025.3 writes the short unit names
              "cycle/nsecond": 1e3, "cycle/usecond": 1.0, "cycle/second": 1e-6,  # clocks in MHz
              "hz": 1e-6, "Khz": 1e-3, "Mhz": 1.0, "Ghz": 1e3}


class LogError(Exception):
    """A log that cannot be read as run_evaluation.sh writes it."""


# ---- reading the logs ----------------------------------------------------------------------------------------

def read_jsonl(path: pathlib.Path) -> list[dict]:
    rows = []
    if path.exists():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise LogError(f"{path}:{number}: not a JSON line ({error})") from error
    return rows


def read_ncu_csv(path: pathlib.Path) -> list[dict]:
    """Nsight Compute's --csv rows grouped per profiled launch, in launch order: [{"kernel", metric: value}]
    (bytes, ms, MHz, percent). Lines that are not CSV (the profiled program's output, ==PROF== notes) are
    skipped."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines(keepends=True) if line.startswith('"')]
    launches: dict[str, dict] = {}
    header = None
    for line in lines:
        if line.startswith('"ID"'):
            header = line
            continue
        if header is None:
            raise LogError(f"{path}: CSV rows before ncu's header line")
        row = next(csv.DictReader(io.StringIO(header + line)))
        value = row["Metric Value"].replace(",", "")
        try:
            number = float(value) * UNIT_SCALE.get(row.get("Metric Unit", ""), 1.0)
        except ValueError:
            continue  # "n/a" of a metric the device does not have
        launch = launches.setdefault(row["ID"], {"kernel": row.get("Kernel Name", row.get("Function Name", ""))})
        launch[row["Metric Name"]] = number
    return [launches[key] for key in sorted(launches, key=int)]


def method_flags(script: pathlib.Path = RUN_SCRIPT) -> dict[str, str]:
    """Each method's CLI flags, read from run_evaluation.sh's method_flags (the one place they are set)."""
    text = script.read_text()
    body = re.search(r"^method_flags\(\) \{\n(.*?)^\}", text, re.S | re.M)
    if body is None:
        raise LogError(f"{script} has no method_flags() function")
    flags = dict(re.findall(r'^\s*(\w+)\) echo "([^"]*)" ;;', body.group(1), re.M))
    if set(flags) != set(METHODS):
        raise LogError(f"{script}: method_flags() sets {sorted(flags)}, expected {sorted(METHODS)}")
    return flags


class Logs:
    """Everything run_evaluation.sh (or --simulated) left in LOG_DIR, indexed."""

    def __init__(self, folder: pathlib.Path) -> None:
        if not folder.is_dir():
            raise LogError(f"{folder} is not a folder")
        self.folder = folder
        self.notes: list[str] = []
        self.meta = read_jsonl(folder / "meta.jsonl")
        self.simulated = any(row.get("mode") == "simulated" for row in self.meta)
        gpu = (folder / "gpu.txt").read_text().splitlines() if (folder / "gpu.txt").exists() else []
        self.device = gpu[1].split(",")[0].strip() if len(gpu) > 1 else ("none (simulated)" if self.simulated
                                                                          else "unknown")
        self.steps = read_jsonl(folder / "steps.jsonl")
        self.masks = {(row["method"], int(row["inputs"]["frames"])): row for row in read_jsonl(folder / "masks.jsonl")}
        self.dense = {int(row["frames"]): row for row in read_jsonl(folder / "dense.jsonl") if "ms" in row}
        self.timing: dict[tuple, dict] = {}
        self.checks: list[dict] = []
        self.skipped: list[dict] = []
        self.errors: list[dict] = []
        self.env: list[dict] = []
        for row in read_jsonl(folder / "timing.jsonl"):
            if "check" in row:
                self.checks.append(row)
            elif "skipped" in row:
                self.skipped.append(row)
            elif "error" in row:
                self.errors.append(row)
            elif "env" in row:
                self.env.append(row["env"])
            elif row.get("bench") == "evaluation":
                self.timing[(row["impl"], row["kind"], row["method"], int(row["frames"]), row["order"])] = row
        self.simulation: dict[tuple, dict] = {}
        for row in read_jsonl(folder / "simulate.jsonl"):
            self.simulation[(row["method"], int(row["frames"]))] = {r["order"]: r for r in row["results"]} | {
                "_scale": row.get("scale", 1.0), "_wave": row["gpu"]["slots"]}
        self.ncu = self._read_ncu()
        self.ncu_reference = {}
        for name in ("dense", "random"):
            launches = read_ncu_csv(folder / f"ncu-{name}.csv")
            lines = read_jsonl(folder / f"ncu-{name}.csv")
            if launches and lines:
                self.ncu_reference[name] = {**launches[0], "nnz_blocks": lines[-1]["nnz_blocks"],
                                            "density": lines[-1]["density"], "tokens": lines[-1]["tokens"]}
            elif (folder / f"ncu-{name}.csv").exists():
                self.notes.append(f"ncu-{name}.csv holds no profiled launch of our kernel")
        self.fig14 = {path.stem: dict(np.load(path)) for path in sorted((folder / "fig14").glob("*.npz"))}

    def _read_ncu(self) -> dict[tuple, dict]:
        """{(impl, method, order): metrics} of ncu.csv, each launch matched to ncu-cases.jsonl by launch order
        within its kernel: our kernel's launches (fwd_kernel_sm*) to the wavealign cases, the others to FA4's.
        An implementation whose counts differ is left out, with a note."""
        cases = read_jsonl(self.folder / "ncu-cases.jsonl")
        launches = read_ncu_csv(self.folder / "ncu.csv")
        matched = {}
        for impl in IMPLS:
            wanted = [case for case in cases if case["impl"] == impl]
            got = [launch for launch in launches if ("fwd_kernel_sm" in launch["kernel"]) == (impl == "wavealign")]
            if len(wanted) != len(got):
                if wanted or got:
                    self.notes.append(f"ncu: {len(got)} profiled {impl} launches for {len(wanted)} cases; "
                                      f"its ncu rows are left out")
                continue
            for case, launch in zip(wanted, got):
                matched[(impl, case["method"], case["order"])] = {**launch, **case}
        return matched

    @property
    def frames(self) -> list[int]:
        return sorted({frames for _, frames in self.masks})

    def methods(self) -> list[str]:
        present = {method for method, _ in self.masks}
        return [method for method in METHODS if method in present]

    def tokens(self, frames: int) -> int:
        return next(int(row["inputs"]["tokens"]) for (_, f), row in self.masks.items() if f == frames)


# ---- derived numbers, one list per figure --------------------------------------------------------------------

def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def flops(nnz_blocks: float) -> float:
    return 4.0 * BLOCK * BLOCK * HEAD_DIM * nnz_blocks


def derive_fig2(logs: Logs) -> list[dict]:
    """Upper bound 1/rho against the speedup over dense mode, per method and length."""
    rows = []
    for method in logs.methods():
        for frames in logs.frames:
            mask = logs.masks.get((method, frames))
            if mask is None:
                continue
            row = {"method": method, "frames": frames, "tokens": logs.tokens(frames), "density": mask["density"],
                   "upper_bound": 1.0 / mask["density"]}
            original = logs.timing.get(("wavealign", "kernel", method, frames, "original"))
            dense = logs.dense.get(frames)
            row["actual"] = ratio(dense and dense["ms"], original and original["ms"])
            row["gap"] = ratio(row["upper_bound"], row["actual"])
            simulated = logs.simulation.get((method, frames), {}).get("original")
            simulated_dense = logs.simulation.get(("dense", frames), {}).get("original")
            row["actual_simulated"] = ratio(simulated_dense and simulated_dense["predicted_kernel_ms"],
                                            simulated and simulated["predicted_kernel_ms"])
            row["gap_simulated"] = ratio(row["upper_bound"], row["actual_simulated"])
            rows.append(row)
    return rows


def derive_table1(logs: Logs) -> list[dict]:
    """Density, HBM SOL and L2 hit of the original order at the longest length (ncu), dense and random too."""
    frames = max(logs.frames, default=None)
    rows = []
    for name in ("dense", *logs.methods(), "random"):
        if name in ("dense", "random"):
            ncu = logs.ncu_reference.get(name)
            density = ncu["density"] if ncu else (1.0 if name == "dense" else None)
            simulated = logs.simulation.get((name, frames), {}).get("original")
        else:
            ncu = logs.ncu.get(("wavealign", name, "original"))
            density = logs.masks[(name, frames)]["density"] if (name, frames) in logs.masks else None
            simulated = logs.simulation.get((name, frames), {}).get("original")
        paper = PAPER["table1"][name]
        rows.append({"method": name, "frames": frames, "density": density, "paper_density": paper[0] / 100,
                     "hbm_sol": ncu and ncu[NCU_SOL] / 100, "paper_hbm_sol": paper[1] / 100,
                     "l2_hit": ncu and ncu[NCU_L2] / 100, "paper_l2_hit": paper[2] / 100,
                     "l2_hit_simulated": simulated and simulated["l2_hit_ratio"]})
    return rows


def derive_fig10(logs: Logs) -> list[dict]:
    """Original against WaveAlign with its whole reorder overhead, per implementation, method and length."""
    rows = []
    for impl in IMPLS:
        for method in logs.methods():
            for frames in logs.frames:
                original = logs.timing.get((impl, "kernel", method, frames, "original"))
                kernel = logs.timing.get((impl, "kernel", method, frames, "wavealign"))
                if original is None or kernel is None:
                    continue
                overhead = kernel["plan_ms"]
                if impl == "flashattention4":  # the plug-in path's permute and unpermute around FA4
                    plugin = logs.timing.get((impl, "plugin", method, frames, "wavealign"))
                    overhead += max(0.0, plugin["ms"] - kernel["ms"]) if plugin else math.nan
                total = kernel["ms"] + overhead
                rows.append({"impl": impl, "method": method, "frames": frames, "tokens": logs.tokens(frames),
                             "original_ms": original["ms"], "kernel_ms": kernel["ms"], "overhead_ms": overhead,
                             "total_ms": total, "kernel_speedup": original["ms"] / kernel["ms"],
                             "speedup": original["ms"] / total, "overhead_share": overhead / total,
                             "sm_clock_mhz": kernel.get("sm_clock_mhz"), "power_capped": kernel.get("power_capped")})
    for method in logs.methods():
        for frames in logs.frames:
            simulated = logs.simulation.get((method, frames))
            if not simulated:
                continue
            original, wave = simulated["original"], simulated["wavealign"]
            total = wave["predicted_kernel_ms"] + wave["plan_cost_ms"]
            rows.append({"impl": "simulated", "method": method, "frames": frames, "tokens": logs.tokens(frames),
                         "original_ms": original["predicted_kernel_ms"], "kernel_ms": wave["predicted_kernel_ms"],
                         "overhead_ms": wave["plan_cost_ms"], "total_ms": total,
                         "kernel_speedup": original["predicted_kernel_ms"] / wave["predicted_kernel_ms"],
                         "speedup": original["predicted_kernel_ms"] / total,
                         "overhead_share": wave["plan_cost_ms"] / total})
    return rows


def derive_orders(logs: Logs) -> list[dict]:
    """Figs. 11 and 12 at the longest length: per implementation, method and order the kernel time, L2 hit
    and HBM bytes (ncu), each also relative to the original order, and the simulator's."""
    frames = max(logs.frames, default=None)
    rows = []
    for impl in IMPLS:
        for method in logs.methods():
            base_time = logs.timing.get((impl, "kernel", method, frames, "original"))
            base_ncu = logs.ncu.get((impl, method, "original"))
            for order in ORDERS:
                timing = logs.timing.get((impl, "kernel", method, frames, order))
                ncu = logs.ncu.get((impl, method, order))
                if timing is None and ncu is None:
                    continue
                rows.append({"impl": impl, "method": method, "order": order, "frames": frames,
                             "ms": timing and timing["ms"],
                             "time_vs_original": ratio(timing and timing["ms"], base_time and base_time["ms"]),
                             "l2_hit": ncu and ncu[NCU_L2] / 100, "hbm_read_bytes": ncu and ncu[NCU_READ],
                             "hbm_read_vs_original": ratio(ncu and ncu[NCU_READ], base_ncu and base_ncu[NCU_READ]),
                             "ncu_ms": ncu and ncu[NCU_TIME]})
    for method in logs.methods():
        simulated = logs.simulation.get((method, frames))
        if not simulated:
            continue
        base = simulated["original"]
        for order in ORDERS:
            row = simulated[order]
            rows.append({"impl": "simulated", "method": method, "order": order, "frames": frames,
                         "ms": row["predicted_kernel_ms"],
                         "time_vs_original": row["predicted_kernel_ms"] / base["predicted_kernel_ms"],
                         "l2_hit": row["l2_hit_ratio"], "hbm_read_bytes": row["hbm_read_bytes"],
                         "hbm_read_vs_original": row["hbm_read_bytes"] / base["hbm_read_bytes"]})
    return rows


def derive_fig15(logs: Logs) -> list[dict]:
    """Roofline points: FLOPs of the kept blocks over the ncu duration (TF/s) and over the HBM bytes read and
    written (operational intensity), original and WaveAlign order, dense and random; and the simulator's."""
    rows = []
    for (impl, method, order), ncu in logs.ncu.items():
        if order in ("original", "wavealign"):
            rows.append({"impl": impl, "method": method, "order": order, "nnz_blocks": ncu["nnz_blocks"]} | _roof(ncu))
    for name, ncu in logs.ncu_reference.items():
        rows.append({"impl": "wavealign", "method": name, "order": "original", "nnz_blocks": ncu["nnz_blocks"]}
                    | _roof(ncu))
    frames = max(logs.frames, default=None)
    for method in logs.methods():
        simulated = logs.simulation.get((method, frames))
        mask = logs.masks.get((method, frames))
        if not simulated or not mask:
            continue
        nnz = mask["density"] * mask["heads"] * mask["q_blocks"] * mask["kv_blocks"]
        for order in ("original", "wavealign"):
            row = simulated[order]
            work = flops(nnz)
            rows.append({"impl": "simulated", "method": method, "order": order, "nnz_blocks": nnz,
                         "tflops": work / row["predicted_kernel_ms"] / 1e9,
                         "intensity": work / (row["hbm_read_bytes"] + row["hbm_write_bytes"])})
    return rows


def _roof(ncu: dict) -> dict:
    work = flops(ncu["nnz_blocks"])
    return {"tflops": work / ncu[NCU_TIME] / 1e9, "intensity": work / (ncu[NCU_READ] + ncu[NCU_WRITE]),
            "sm_clock_mhz": ncu.get(NCU_CLOCK)}


def wave_unions(mask: np.ndarray, order: np.ndarray, wave: int) -> float:
    """Mean number of distinct K/V blocks a wave of `wave` rows touches, rows taken in `order`."""
    rows = mask[order]
    return float(np.mean([rows[start:start + wave].any(axis=0).sum() for start in range(0, len(rows), wave)]))


def derive_fig14(logs: Logs, wave: int) -> list[dict]:
    rows = []
    for method in (method for method in METHODS if method in logs.fig14):
        data = logs.fig14[method]
        mask = unpack_mask(data)
        rows.append({"method": method, "q_blocks": mask.shape[0], "kv_blocks": mask.shape[1], "wave": wave,
                     "density": float(mask.mean()),
                     **{f"wave_union_{order}": wave_unions(mask, data[order], wave)
                        for order in ORDERS if order in data}})
    return rows


def unpack_mask(data: dict) -> np.ndarray:
    return np.unpackbits(data["mask_bits"], axis=1, count=int(data["kv_blocks"])).astype(bool)


def save_fig14_head(folder: pathlib.Path, method: str, head_mask: np.ndarray, permutations: dict) -> None:
    """Fig. 14's input: head 0 of a mask [MB, NB] bit-packed by rows, with each order's permutation [MB]
    (run_evaluation.sh's GPU driver and --simulated both write it)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(folder / f"{method}.npz", mask_bits=np.packbits(head_mask.astype(bool), axis=1),
                        kv_blocks=np.int64(head_mask.shape[1]),
                        **{order: np.asarray(perm, dtype=np.int32) for order, perm in permutations.items()})


# ---- figures -------------------------------------------------------------------------------------------------

def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 8, "axes.titlesize": 9, "figure.dpi": 110, "savefig.dpi": 110})
    return plt


def _source_label(logs: Logs) -> str:
    return "simulated (CPU model, reduced length)" if logs.simulated else f"measured on {logs.device}"


def _finish(plt: Any, figure: Any, path: pathlib.Path, title: str) -> bool:
    """Titles, lays out and writes a figure; True (the figure was drawn)."""
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, bbox_inches="tight", metadata={"Software": None})
    plt.close(figure)
    return True


def _pick(rows: list[dict], logs: Logs, impls: tuple[str, ...] = IMPLS) -> str:
    """The series a figure shows: the first measured implementation present, else the simulator's."""
    for impl in impls:
        if any(row.get("impl") == impl for row in rows):
            return impl
    return "simulated"


def plot_fig2(plt: Any, rows: list[dict], logs: Logs, path: pathlib.Path) -> bool:
    key, gap = ("actual", "gap") if any(row["actual"] for row in rows) else ("actual_simulated", "gap_simulated")
    if not any(row[key] for row in rows):
        return False
    figure, (left, right) = plt.subplots(1, 2, figsize=(8, 3))
    for method in logs.methods():
        mine = [row for row in rows if row["method"] == method and row[key]]
        x = [row["tokens"] / 1e3 for row in mine]
        line, = left.plot(x, [row[key] for row in mine], marker="o", label=f"{LABELS[method]} actual")
        left.plot(x, [row["upper_bound"] for row in mine], ls="--", color=line.get_color(),
                  label=f"{LABELS[method]} 1/ρ")
        right.plot(x, [row[gap] for row in mine], marker="o", color=line.get_color(), label=LABELS[method])
    right.axhspan(*PAPER["fig2_gap"], color="0.85", label="paper, H100 (Wan2.1)")
    left.set(xlabel="sequence length (K tokens)", ylabel="speedup over dense", title="upper bound 1/ρ vs actual")
    right.set(xlabel="sequence length (K tokens)", ylabel="(1/ρ) / actual", title="gap")
    left.legend(fontsize=6, ncol=2)
    right.legend(fontsize=6)
    return _finish(plt, figure, path, f"Fig. 2: sparse kernel speedup over our dense mode ({_source_label(logs)})")


def plot_fig10(plt: Any, rows: list[dict], logs: Logs, path: pathlib.Path) -> bool:
    present = {row["impl"] for row in rows}
    impls = [impl for impl in IMPLS if impl in present] or (["simulated"] if "simulated" in present else [])
    if not impls:
        return False
    methods = logs.methods()
    figure, axes = plt.subplots(len(impls), len(methods), figsize=(2.3 * len(methods), 2.3 * len(impls)),
                                squeeze=False)
    for r, impl in enumerate(impls):
        for c, method in enumerate(methods):
            axis = axes[r][c]
            mine = sorted((row for row in rows if row["impl"] == impl and row["method"] == method),
                          key=lambda row: row["tokens"])
            x = np.arange(len(mine))
            axis.bar(x - 0.2, [row["original_ms"] for row in mine], 0.4, label="Original", color="0.55")
            axis.bar(x + 0.2, [row["kernel_ms"] for row in mine], 0.4, label="WaveAlign", color="tab:blue")
            axis.bar(x + 0.2, [row["overhead_ms"] for row in mine], 0.4, bottom=[row["kernel_ms"] for row in mine],
                     label="reorder overhead", color="tab:red")
            for i, row in enumerate(mine):
                axis.text(i + 0.2, row["total_ms"], f"{row['speedup']:.2f}×", ha="center", va="bottom", fontsize=6)
            axis.set_xticks(x, [f"{row['tokens'] / 1e3:.0f}" for row in mine])
            axis.set_title(f"{LABELS[method]} ({IMPL_LABELS.get(impl, 'simulated')})", fontsize=7)
            if c == 0:
                axis.set_ylabel("attention time (ms)")
            if r == len(impls) - 1:
                axis.set_xlabel("sequence length (K)")
    _legend_below(figure, axes[0][0])
    return _finish(plt, figure, path,
                   f"Fig. 10: original vs WaveAlign including its reorder overhead ({_source_label(logs)})")


def _legend_below(figure: Any, axis: Any) -> None:
    """One legend for the figure, under its panels (bars fill the panels to the top)."""
    handles, labels = axis.get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels), fontsize=7)


def _grouped(axis: Any, rows: list[dict], methods: list[str], orders: tuple[str, ...], field: str,
             scale: float = 1.0) -> None:
    width = 0.8 / len(orders)
    for i, order in enumerate(orders):
        values = [next((row[field] * scale for row in rows if row["method"] == method and row["order"] == order
                        and row[field] is not None), np.nan) for method in methods]
        axis.bar(np.arange(len(methods)) + (i - (len(orders) - 1) / 2) * width, values, width,
                 label=ORDER_LABELS[order] if len(orders) > 2 else ("Original" if order == "original" else "WaveAlign"))
    axis.set_xticks(np.arange(len(methods)), [LABELS[method] for method in methods], fontsize=7)


def plot_fig11(plt: Any, rows: list[dict], logs: Logs, path: pathlib.Path) -> bool:
    impl = _pick([row for row in rows if row["l2_hit"] is not None], logs)
    mine = [row for row in rows if row["impl"] == impl]
    if not any(row["l2_hit"] is not None for row in mine):
        return False
    methods = logs.methods()
    figure, (left, right) = plt.subplots(1, 2, figsize=(8, 2.8))
    _grouped(left, mine, methods, ("original", "wavealign"), "l2_hit", 100)
    _grouped(right, mine, methods, ("original", "wavealign"), "hbm_read_vs_original")
    left.set(ylabel="L2 hit ratio (%)", ylim=(0, 100), title="(a) L2 hit ratio")
    right.set(ylabel="HBM reads / original", title="(b) normalised HBM reads")
    _legend_below(figure, left)
    return _finish(plt, figure, path,
                   f"Fig. 11: {IMPL_LABELS.get(impl, 'simulator')} at {logs.tokens(max(logs.frames)):,} tokens "
                   f"({'ncu, one launch per case; ' if impl != 'simulated' else ''}{_source_label(logs)})")


def plot_fig12(plt: Any, rows: list[dict], logs: Logs, path: pathlib.Path) -> bool:
    impl = _pick([row for row in rows if row["order"] in ("s1", "s2")], logs, ("wavealign",))
    mine = [row for row in rows if row["impl"] == impl]
    if not mine:
        return False
    methods = logs.methods()
    figure, axes = plt.subplots(1, 3, figsize=(10, 2.8))
    _grouped(axes[0], mine, methods, ORDERS, "time_vs_original")
    _grouped(axes[1], mine, methods, ORDERS, "l2_hit", 100)
    _grouped(axes[2], mine, methods, ORDERS, "hbm_read_vs_original")
    axes[0].set(ylabel="kernel time / original", title="(a) kernel time")
    axes[1].set(ylabel="L2 hit ratio (%)", ylim=(0, 100), title="(b) L2 hit ratio")
    axes[2].set(ylabel="HBM reads / original", title="(c) HBM reads")
    _legend_below(figure, axes[0])
    return _finish(plt, figure, path, f"Fig. 12: ablation of the two stages, "
                   f"{IMPL_LABELS.get(impl, 'simulator')} ({_source_label(logs)})")


def zoom_window(mask: np.ndarray, order: np.ndarray, wave: int) -> tuple[int, int]:
    """(first row position, first column) of Fig. 14's wave x wave window: the middle wave of the WaveAlign
    order, at the columns where that wave keeps the most blocks."""
    start = (len(order) // wave // 2) * wave
    rows = mask[order[start:start + wave]]
    counts = np.convolve(rows.sum(axis=0), np.ones(min(wave, mask.shape[1])), mode="valid")
    return start, int(np.argmax(counts))


def plot_fig14(plt: Any, rows: list[dict], logs: Logs, path: pathlib.Path, wave: int) -> bool:
    if not logs.fig14:
        return False
    from matplotlib.patches import Rectangle

    methods = [method for method in METHODS if method in logs.fig14]
    figure, axes = plt.subplots(len(methods), 4, figsize=(9, 2.4 * len(methods)), squeeze=False)
    for r, method in enumerate(methods):
        data = logs.fig14[method]
        mask = unpack_mask(data)
        stats = next(row for row in rows if row["method"] == method)
        start, column = zoom_window(mask, data["wavealign"], wave)
        size = min(wave, mask.shape[1])
        for c, order in enumerate(("original", "wavealign")):
            ordered = mask[data[order]]
            axes[r][c].imshow(ordered, cmap="Greys", interpolation="antialiased", aspect="auto")
            axes[r][c].add_patch(Rectangle((column, start), size, min(wave, len(ordered) - start), fill=False,
                                           ec="red", lw=1))
            axes[r][c].set_title(f"{LABELS[method]} {ORDER_LABELS[order] if order != 'wavealign' else 'WaveAlign'}"
                                 f" (wave union {stats[f'wave_union_{order}']:.0f})", fontsize=7)
            axes[r][c + 2].imshow(ordered[start:start + wave, column:column + size], cmap="Greys",
                                  interpolation="nearest", aspect="auto")
            axes[r][c + 2].set_title(f"{size}x{size} zoom, rows {start}-{start + wave - 1}", fontsize=7)
        for axis in axes[r]:
            axis.set_xticks([])
            axis.set_yticks([])
    return _finish(plt, figure, path, f"Fig. 14: head 0 before and after WaveAlign ({_source_label(logs)}); "
                   f"wave union = mean K/V blocks a wave of {wave} rows touches")


def plot_fig15(plt: Any, rows: list[dict], logs: Logs, path: pathlib.Path) -> bool:
    impl = _pick(rows, logs)
    references = ("dense", "random")  # profiled with our kernel, shown beside whichever backend is plotted
    mine = [row for row in rows if row["impl"] == impl or row["method"] in references]
    if not mine:
        return False
    figure, axis = plt.subplots(figsize=(5.5, 3.6))
    x = np.logspace(1, 4, 200)
    for (name, (peak, bandwidth)), style in zip(ROOFS.items(), ("-", ":")):
        axis.plot(x, np.minimum(peak, bandwidth * x) / 1e12, ls=style, color="k", lw=1,
                  label=f"{name} roof, ridge {peak / bandwidth:.0f} FLOP/B")
    for method in ("dense", *logs.methods(), "random"):
        points = {row["order"]: row for row in mine if row["method"] == method}
        if not points:
            continue
        original = points.get("original")
        color = axis.plot([], [])[0].get_color()
        if original:
            axis.scatter(original["intensity"], original["tflops"], facecolors="none", edgecolors=color,
                         label=f"{LABELS[method]}" + (" original" if "wavealign" in points else ""))
        if "wavealign" in points:
            wave = points["wavealign"]
            axis.scatter(wave["intensity"], wave["tflops"], color=color, label=f"{LABELS[method]} WaveAlign")
            if original:
                axis.annotate("", (wave["intensity"], wave["tflops"]), (original["intensity"], original["tflops"]),
                              arrowprops={"arrowstyle": "->", "color": color, "lw": 0.8})
    axis.set(xscale="log", yscale="log", xlabel="operational intensity (FLOP / HBM byte)", ylabel="achieved TF/s")
    axis.legend(fontsize=5.5, loc="lower right")
    return _finish(plt, figure, path, f"Figs. 3 and 15: roofline, {IMPL_LABELS.get(impl, 'simulator')} at "
                                      f"{logs.tokens(max(logs.frames)):,} tokens\n({_source_label(logs)})")


# ---- the document --------------------------------------------------------------------------------------------

def pct(value: float | None, digits: int = 1) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.{digits}f} %"


def times(value: float | None, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}×"


def ms(value: float | None) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def change(value: float | None) -> str:
    """A ratio to the original as a signed change: 0.2 -> "−80.0 %"."""
    if value is None or math.isnan(value):
        return "—"
    return f"{100 * (value - 1):+.1f} %".replace("-", "−")


def span(values: list[float], fmt: Any) -> str:
    values = [value for value in values if value is not None and not math.isnan(value)]
    if not values:
        return "—"
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low} – {high}"


def table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(row) + " |" for row in rows])


def figure_link(name: str, record: dict, doc: pathlib.Path) -> str:
    """The Markdown image of a drawn figure, its path relative to the document."""
    if name not in record["figure_files"]:
        return ""
    path = ROOT / record["figure_files"][name]  # an absolute path stays itself
    return f"![{name}]({pathlib.Path(os.path.relpath(path, doc.parent.resolve())).as_posix()})\n\n"


def _within(path: pathlib.Path, folder: pathlib.Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def _shown(path: pathlib.Path) -> str:
    """A path as the record keeps it: relative to the repository when inside it."""
    return os.path.relpath(path.resolve(), ROOT) if _within(path, ROOT) else str(path.resolve())


def _roofline_order(row: dict) -> tuple:
    impls, methods = (*IMPLS, "simulated"), ("dense", *METHODS, "random")
    return impls.index(row["impl"]), methods.index(row["method"]), ORDERS.index(row["order"])


def render_blocks(record: dict, logs: Logs, doc: pathlib.Path) -> dict[str, str]:
    derived = record["derived"]
    simulated = logs.simulated
    source = "simulated" if simulated else "H200"
    blocks = {}
    blocks["data"] = "\n".join([
        "- **Source**: " + ("SIMULATED on the CPU (no GPU measurement): " + record["simulation"] if simulated
                            else "measured on " + record["device"]),
        f"- **Commit** {record['commit']}, collected {record['date']}; command: `{record['command']}`",
        *[f"- {note}" for note in record["notes"]]])

    lengths = logs.frames
    longest = f"At {logs.tokens(max(lengths)):,} tokens ({max(lengths)} frames).\n\n"
    setup_rows = []
    for method in logs.methods():
        flags = next((row.get("flags", "") for (m, _), row in logs.masks.items() if m == method), "")
        setup_rows.append([LABELS[method], f"`{flags}`"] + [pct(logs.masks[(method, f)]["density"])
                                                            if (method, f) in logs.masks else "—" for f in lengths])
    blocks["setup"] = table(["method", "flags of `wavealign mask`"] + [f"density at {logs.tokens(f):,} tokens"
                                                                       for f in lengths], setup_rows)

    fig2 = derived["fig2"]
    key, gap = ("actual", "gap") if any(row["actual"] for row in fig2) else ("actual_simulated", "gap_simulated")
    blocks["fig2"] = figure_link("fig2", record, doc) + table(
        ["method", "tokens", "density ρ", "1/ρ", f"actual speedup over dense ({source})", "gap (1/ρ)/actual"],
        [[LABELS[row["method"]], f"{row['tokens']:,}", pct(row["density"]), times(row["upper_bound"], 2),
          times(row[key], 2), times(row[gap], 3)] for row in fig2]) + \
        f"\n\nPaper (H100, FA4, Wan2.1): gap {PAPER['fig2_gap'][0]:.2f}–{PAPER['fig2_gap'][1]:.2f}×, growing with " \
        "the " \
        f"length; ours: {span([row[gap] for row in fig2], lambda v: f'{v:.2f}×')}."

    blocks["table1"] = longest + table(
        ["method", "density ρ, paper", "ours", "HBM SOL, paper", "ours (ncu)", "L2 hit, paper", "ours (ncu)",
         "simulator"],
        [[LABELS[row["method"]], pct(row["paper_density"]), pct(row["density"]), pct(row["paper_hbm_sol"], 2),
          pct(row["hbm_sol"], 2), pct(row["paper_l2_hit"], 2), pct(row["l2_hit"], 2), pct(row["l2_hit_simulated"], 2)]
         for row in derived["table1"]])

    fig10 = derived["fig10"]
    fig10_rows = []
    for impl in (*IMPLS, "simulated"):
        for method in logs.methods():
            mine = [row for row in fig10 if row["impl"] == impl and row["method"] == method]
            if not mine:
                continue
            low, high = PAPER["fig10_speedup"][method]
            fig10_rows.append([IMPL_LABELS.get(impl, "simulator"), LABELS[method],
                               span([row["speedup"] for row in mine], lambda v: f"{v:.3f}×"),
                               span([row["kernel_speedup"] for row in mine], lambda v: f"{v:.3f}×"),
                               span([row["overhead_share"] for row in mine], lambda v: pct(v)),
                               f"{low:.3f}–{high:.3f}×"])
    # The times behind the ranges above at the longest length only (every length's are in the record and the
    # figure): the document keeps one short table per figure.
    at_longest = [[IMPL_LABELS.get(row["impl"], "simulator"), LABELS[row["method"]], ms(row["original_ms"]),
                   ms(row["kernel_ms"]), ms(row["overhead_ms"]), times(row["speedup"])]
                  for row in fig10 if row["tokens"] == logs.tokens(max(lengths))]
    blocks["fig10"] = figure_link("fig10", record, doc) + table(
        ["backend", "method", "speedup incl. overhead", "kernel speedup", "overhead share", "paper (H100, FA4)"],
        fig10_rows) + f"\n\nPaper: the reorder overhead is {pct(PAPER['fig10_overhead_share'][0])}–" \
        f"{pct(PAPER['fig10_overhead_share'][1])} of WaveAlign's attention latency.\n\n" + longest + table(
        ["backend", "method", "original ms", "WaveAlign kernel ms", "overhead ms", "speedup"], at_longest)

    orders = derived["orders"]
    fig11_rows = []
    for impl in (*IMPLS, "simulated"):
        for method in logs.methods():
            mine = {row["order"]: row for row in orders if row["impl"] == impl and row["method"] == method}
            if "original" not in mine or "wavealign" not in mine or mine["wavealign"]["l2_hit"] is None:
                continue
            named = PAPER["fig11_named"].get(method)
            fig11_rows.append([IMPL_LABELS.get(impl, "simulator"), LABELS[method],
                               f"{pct(mine['original']['l2_hit'])} → {pct(mine['wavealign']['l2_hit'])}",
                               change(mine["wavealign"]["hbm_read_vs_original"]),
                               f"{named[0]:.2f} % → {named[1]:.2f} %" if named else ""])
    blocks["fig11"] = figure_link("fig11", record, doc) + longest + table(
        ["backend", "method", "L2 hit original → WaveAlign", "HBM reads vs original", "paper (H100, FA4)"],
        fig11_rows) + \
        "\n\nPaper over the four methods: L2 hit " \
        f"{PAPER['fig11_l2_original'][0]}–{PAPER['fig11_l2_original'][1]} % → " \
        f"{PAPER['fig11_l2_wavealign'][0]}–{PAPER['fig11_l2_wavealign'][1]} %, HBM reads " \
        f"−{PAPER['fig11_hbm_reduction'][0]} to −{PAPER['fig11_hbm_reduction'][1]} % (median of three ncu runs; " \
        "ours: " \
        f"one run per case)."

    fig12_rows = []
    for impl in ("wavealign", "simulated"):
        for order in ORDERS[1:]:
            mine = [row for row in orders if row["impl"] == impl and row["order"] == order]
            if not mine:
                continue
            paper = PAPER["fig12"][order]
            paper_text = "; ".join(filter(None, [
                f"speedup ≤ {paper['speedup_max']}×" if "speedup_max" in paper else
                f"speedup {paper['speedup'][0]}–{paper['speedup'][1]}×",
                f"L2 {paper['l2'][0]}–{paper['l2'][1]} %",
                f"HBM reads −{paper['hbm_reduction'][0]} to −{paper['hbm_reduction'][1]} %"
                if "hbm_reduction" in paper
                else f"HBM reads up to −{paper['hbm_reduction_max']} %"]))
            fig12_rows.append([IMPL_LABELS.get(impl, "simulator"), ORDER_LABELS[order],
                               span([ratio(1, row["time_vs_original"]) for row in mine], lambda v: f"{v:.3f}×"),
                               span([row["l2_hit"] for row in mine], pct),
                               span([row["hbm_read_vs_original"] for row in mine], change),
                               paper_text])
    blocks["fig12"] = figure_link("fig12", record, doc) + longest + table(
        ["backend", "configuration", "kernel speedup", "L2 hit", "HBM reads", "paper (H100, FA4)"], fig12_rows)

    fig14 = derived["fig14"]
    blocks["fig14"] = figure_link("fig14", record, doc) + table(
        ["method", "blocks", "density", "mean wave union, original", "S1", "S2", "WaveAlign"],
        [[LABELS[row["method"]], f"{row['q_blocks']} × {row['kv_blocks']}", pct(row["density"])]
         + [f"{row[f'wave_union_{order}']:.0f}" if f"wave_union_{order}" in row else "—" for order in ORDERS]
         for row in fig14])

    fig15 = derived["fig15"]
    blocks["fig15"] = figure_link("fig15", record, doc) + longest + table(
        ["backend", "method", "order", "operational intensity (FLOP/B)", "achieved TF/s"],
        [[IMPL_LABELS.get(row["impl"], "simulator"), LABELS[row["method"]], row["order"], f"{row['intensity']:.0f}",
          f"{row['tflops']:.0f}"] for row in sorted(fig15, key=_roofline_order)]
    ) + "\n\nRoofs: " + "; ".join(f"{name} {peak / 1e12:.0f} TF/s and {bandwidth / 1e12:.2f} TB/s (ridge "
                                  f"{peak / bandwidth:.0f} FLOP/B)" for name, (peak, bandwidth) in ROOFS.items()) + "."

    checks = record["checks"]
    failed = [check for check in checks if not check["bitwise_equal"]]
    blocks["checks"] = (f"{len(checks)} outputs in another row order compared with the original order's: "
                        f"{len(checks) - len(failed)} bit for bit equal"
                        + ("." if not failed else ", NOT equal: " + "; ".join(
                            f"{c['check']} ({c['method']}, {c['frames']} frames, max |diff| {c['max_abs_difference']})"
                            for c in failed) + ".")) if checks else "No outputs compared in this run."

    blocks["budget"] = table(["step", "budget s", "elapsed s", "exit status"],
                             [[row["step"], str(row["budget_s"]), str(row["elapsed_s"]),
                               str(row["rc"]) + (" (out of time)" if row["rc"] == 124 else "")]
                              for row in logs.steps]) if logs.steps else "No steps recorded (a simulated run)."
    return blocks


def fill_document(doc: pathlib.Path, blocks: dict[str, str]) -> None:
    text = doc.read_text()
    for name in BLOCKS:
        begin, end = f"<!-- generated: {name} -->", f"<!-- end generated: {name} -->"
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise LogError(f"{doc} has no block {begin} ... {end}")
        text = pattern.sub(lambda _: f"{begin}\n{blocks[name]}\n{end}", text)
    doc.write_text(text)


# ---- --simulated: the logs from CPU runs ---------------------------------------------------------------------

def run_json(command: list[str]) -> dict:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise LogError(f"{shlex.join(command)} exited {result.returncode}: {result.stderr.strip()}")
    return json.loads(result.stdout)


def simulate_logs(folder: pathlib.Path, cli: str, sim_frames: list[int], measured_frames: list[int],
                  heads: int) -> None:
    """LOG_DIR of a simulated run: CPU reference masks at sim_frames, the simulator on each at the usable L2
    and wave size scaled by L_sim / L_measured, a full mask for the dense rows, and Fig. 14's plans."""
    if len(sim_frames) != len(measured_frames):
        raise LogError(f"--sim-frames has {len(sim_frames)} lengths, one per measured length "
                       f"({', '.join(map(str, measured_frames))}) is needed")
    folder.mkdir(parents=True, exist_ok=True)
    flags = method_flags()
    masks_dir = folder / "masks"
    masks_dir.mkdir(exist_ok=True)

    def tokens_at(frames: int) -> tuple[int, dict]:
        out = run_json([cli, "simulate", "--model", "wan2.1-14b", "--frames", str(frames), "--heads", "1",
                        "--mask", "random", "--density", "0.001", "--orders", "original", "--json"])
        return int(out["workload"]["tokens"]), out["gpu"]

    mask_rows, simulate_rows = [], []
    for frames, measured in zip(sim_frames, measured_frames):
        tokens, gpu = tokens_at(frames)
        scale = tokens / tokens_at(measured)[0]
        model = ["--usable-l2", f"{gpu['usable_l2_fraction'] * scale:.6g}"]
        for method in METHODS:
            path = masks_dir / f"{method}-{frames}.npy"
            row = run_json([cli, "mask", "--method", method, *shlex.split(flags[method]), "--model", "wan2.1-14b",
                            "--frames", str(frames), "--heads", str(heads), "--device", "cpu", "--out", str(path),
                            "--json"])
            mask_rows.append({**row, "flags": flags[method]})
            out = run_json([cli, "simulate", "--mask", str(path), "--orders", ",".join(ORDERS), *model, "--json"])
            simulate_rows.append({**out, "method": method, "frames": frames, "scale": scale})
            if frames == max(sim_frames):
                permutations = {}
                for order in ORDERS:
                    perm_path = masks_dir / f"{method}-{frames}-{order}.npy"
                    subprocess.run([cli, "reorder", "--mask", str(path), "--order", order, "--skip", "never",
                                    "--out", str(perm_path)], check=True, capture_output=True)
                    permutations[order] = np.load(perm_path)[0]
                save_fig14_head(folder / "fig14", method, np.load(path)[0], permutations)
        for name, density in (("dense", "1"), ("random", "0.2")):
            out = run_json([cli, "simulate", "--model", "wan2.1-14b", "--frames", str(frames), "--heads", str(heads),
                            "--mask", "random", "--density", density, "--seed", "1", "--orders", "original", *model,
                            "--json"])
            simulate_rows.append({**out, "method": name, "frames": frames, "scale": scale})
    (folder / "masks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in mask_rows))
    (folder / "simulate.jsonl").write_text("".join(json.dumps(row) + "\n" for row in simulate_rows))
    description = (f"CPU reference masks at {', '.join(map(str, sim_frames))} frames ({heads} heads) standing for "
                   f"{', '.join(map(str, measured_frames))}, the usable L2 scaled by L_sim / L_measured. These numbers "
                   f"check the pipeline, not WaveAlign: at these lengths the GPU's {SLOTS} concurrent rows cover the "
                   f"whole sequence in one to three waves, where the measured lengths have 9 to 22.")
    (folder / "meta.jsonl").write_text(json.dumps({"mode": "simulated", "description": description,
                                                   "command": "bench/gpu/collect_evaluation.py " +
                                                   shlex.join(sys.argv[1:])}) + "\n")


# ---- main ----------------------------------------------------------------------------------------------------

def collect(logs: Logs, figures: pathlib.Path, doc: pathlib.Path | None, date: str) -> dict:
    run = next((row for row in reversed(logs.meta) if "command" in row), {})
    # Parts of one evaluation may come from different commits (timing re-run later than ncu): name each once.
    commits = list(dict.fromkeys(row["commit"] for row in logs.meta if "command" in row and "commit" in row))
    # The wave the plans of the longest length were made with (the simulator's record of it, else the H200's).
    wave = next((value["_wave"] for (_, frames), value in logs.simulation.items()
                 if logs.frames and frames == max(logs.frames)), SLOTS)
    for skipped in dict.fromkeys((row["skipped"], row.get("frames"), row["reason"]) for row in logs.skipped):
        name, frames, reason = skipped
        where = "" if frames is None else f" at {frames} frames"
        logs.notes.append(f"{IMPL_LABELS.get(name, LABELS.get(name, name))} not run{where}: {reason}")
    for row in logs.errors:
        logs.notes.append(f"{IMPL_LABELS.get(row['impl'], row['impl'])} failed on {row.get('method')} at "
                          f"{row.get('frames')} frames: {row['error']}")
    for row in logs.steps:
        if row["rc"] != 0:
            late = " (out of its budget)" if row["rc"] == 124 else ""
            logs.notes.append(f"step {row['step']} exited {row['rc']}{late}")
    record = {
        "device": logs.device, "commit": ", ".join(commits) if commits else result_record.git_commit(),
        "date": run.get("date", date),
        "command": "; ".join(row["command"] for row in logs.meta if "command" in row) +
                   ("" if logs.simulated else f"; bench/gpu/collect_evaluation.py {logs.folder.name}"),
        "collected": date, "mode": "simulated" if logs.simulated else "measured",
        "simulation": next((row["description"] for row in logs.meta if "description" in row), None),
        "environment": logs.env, "paper": PAPER, "masks": list(logs.masks.values()),
        "dense": list(logs.dense.values()), "timing": list(logs.timing.values()), "checks": logs.checks,
        "ncu": [{**value, "impl": key[0], "method": key[1], "order": key[2]} for key, value in logs.ncu.items()],
        "ncu_reference": logs.ncu_reference, "steps": logs.steps,
        "derived": {"fig2": derive_fig2(logs), "table1": derive_table1(logs), "fig10": derive_fig10(logs),
                    "orders": derive_orders(logs), "fig14": derive_fig14(logs, wave), "fig15": derive_fig15(logs)},
        "notes": logs.notes, "figure_files": {},
    }
    if record["commit"] == "unknown":
        record["commit"] = f"unknown (collected at {result_record.git_commit()})"
    figures.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    derived = record["derived"]
    drawn = {"fig2": plot_fig2(plt, derived["fig2"], logs, figures / "evaluation-fig2.png"),
             "fig10": plot_fig10(plt, derived["fig10"], logs, figures / "evaluation-fig10.png"),
             "fig11": plot_fig11(plt, derived["orders"], logs, figures / "evaluation-fig11.png"),
             "fig12": plot_fig12(plt, derived["orders"], logs, figures / "evaluation-fig12.png"),
             "fig14": plot_fig14(plt, derived["fig14"], logs, figures / "evaluation-fig14.png", wave),
             "fig15": plot_fig15(plt, derived["fig15"], logs, figures / "evaluation-fig15.png")}
    record["figure_files"] = {name: _shown(figures / f"evaluation-{name}.png") for name, made in drawn.items() if made}
    if doc is not None:
        fill_document(doc, render_blocks(record, logs, doc))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=pathlib.Path, help="LOG_DIR of run_evaluation.sh (or to fill, --simulated)")
    parser.add_argument("--out", type=pathlib.Path, help="the JSON record (default: bench/results/"
                                                         "h200-evaluation.json; --simulated: LOG_DIR/evaluation.json)")
    parser.add_argument("--figures", type=pathlib.Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--doc", type=pathlib.Path, default=ROOT / "docs" / "evaluation.md")
    parser.add_argument("--no-doc", action="store_true", help="leave the document alone")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--simulated", action="store_true", help="fill LOG_DIR from CPU runs first (no GPU)")
    parser.add_argument("--wavealign", default=str(ROOT / "build" / "wavealign"), help="--simulated: the CLI")
    parser.add_argument("--sim-frames", default="13,21,29,37", help="--simulated: reduced lengths, one per "
                                                                    "measured length (401,321,241,161 ascending)")
    parser.add_argument("--measured-frames", default="161,241,321,401", help="--simulated: the lengths they stand for")
    parser.add_argument("--sim-heads", type=int, default=2, help="--simulated: heads")
    args = parser.parse_args(argv)
    try:
        if args.simulated:
            simulate_logs(args.logs, args.wavealign, [int(f) for f in args.sim_frames.split(",")],
                          [int(f) for f in args.measured_frames.split(",")], args.sim_heads)
        logs = Logs(args.logs)
        if not logs.masks:
            raise LogError(f"{args.logs}/masks.jsonl holds no mask: nothing to collect")
        record = collect(logs, args.figures, None if args.no_doc else args.doc, args.date)
    except LogError as error:
        print(f"collect_evaluation.py: {error}", file=sys.stderr)
        return 1
    out = args.out or (args.logs / "evaluation.json" if logs.simulated else ROOT / "bench" / "results" /
                       "h200-evaluation.json")
    result_record.check(record, str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=_json_default) + "\n")
    print(f"wrote {out}, {len(record['figure_files'])} figures in {args.figures}"
          + ("" if args.no_doc else f", {args.doc}"))
    for note in record["notes"]:
        print(f"note: {note}")
    return 0


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


if __name__ == "__main__":
    raise SystemExit(main())
