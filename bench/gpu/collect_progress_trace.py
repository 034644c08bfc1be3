#!/usr/bin/env python3
"""Reads the progress traces of wa_bench_attention --progress-trace (a build with -DWA_SM90_PROGRESS_TRACE=ON) and
says how closely the CTAs of one head walk through K/V together.

    collect_progress_trace.py TRACE [TRACE ...] [--json OUT] [--samples 400]

Per trace: the records per CTA (and any dropped past the capacity), the items and blocks walked, each CTA's rate
(walk positions per microsecond, over its own records) and how much the rates differ between CTAs, and the
K/V spread: at evenly spaced times inside the launch (the middle 90 %), every CTA's current K/V block (its
latest record), grouped by head; the spread of a head is the range of those blocks (max - min, and the 10-90 %
range) over its CTAs, and a time's spread is the mean over heads weighted by their CTAs. In blocks, in MiB
(x the K/V bytes of a block) and as a share of the L2: a dense launch whose spread stays well inside the L2
reads each K/V block from HBM about once; one whose spread exceeds it reads it once per CTA. The first and
the last tenth of the samples are reported apart (as medians), so a spread that grows during the launch shows.
In dense mode, where every row has the same blocks, also the spread over CTAs of the blocks walked since the
launch (interpolated between records): the lockstep itself, free of the jump in block index where CTAs move on
to their next rows at slightly different times.

The trace format is progress_trace.h's, behind a JSON line (written by bench_attention.cu's
write_progress_trace): uint32 record counts per CTA, then 32-byte records (time_ns u64, ticket, head, q_block,
position, block i32, sm u32) per CTA at a fixed capacity.
"""

import argparse
import json
import pathlib
import sys

import numpy as np

RECORD = np.dtype([("time_ns", "<u8"), ("ticket", "<i4"), ("head", "<i4"), ("q_block", "<i4"),
                   ("position", "<i4"), ("block", "<i4"), ("sm", "<u4")])
FORMAT = "wavealign-progress-trace"


class TraceError(ValueError):
    pass


def read_trace(path):
    """(meta, records of every CTA as one structured array with a 'cta' column, counts per CTA)."""
    path = pathlib.Path(path)
    data = path.read_bytes()
    newline = data.find(b"\n")
    if newline < 0:
        raise TraceError(f"{path}: no JSON header line (not a progress trace)")
    try:
        meta = json.loads(data[:newline])
    except json.JSONDecodeError as error:
        raise TraceError(f"{path}: the header line is not JSON ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise TraceError(f"{path}: format is {meta.get('format') if isinstance(meta, dict) else None!r}, "
                         f"expected {FORMAT!r}")
    if meta.get("version") != 1 or meta.get("record_bytes") != RECORD.itemsize:
        raise TraceError(f"{path}: version {meta.get('version')} with {meta.get('record_bytes')}-byte records; "
                         f"this reader knows version 1 with {RECORD.itemsize}-byte records")
    ctas, capacity = int(meta["ctas"]), int(meta["records_per_cta"])
    body = memoryview(data)[newline + 1:]
    expected = 4 * ctas + RECORD.itemsize * ctas * capacity
    if len(body) != expected:
        raise TraceError(f"{path}: {len(body)} bytes after the header, expected {expected} "
                         f"({ctas} CTAs x {capacity} records)")
    counts = np.frombuffer(body[:4 * ctas], dtype="<u4").astype(np.int64)
    slots = np.frombuffer(body[4 * ctas:], dtype=RECORD).reshape(ctas, capacity)
    kept = np.minimum(counts, capacity)
    parts = []
    for cta in np.flatnonzero(kept):
        part = np.empty(kept[cta], dtype=RECORD.descr + [("cta", "<i4")])
        for name in RECORD.names:
            part[name] = slots[cta, :kept[cta]][name]
        part["cta"] = cta
        parts.append(part)
    if not parts:
        raise TraceError(f"{path}: no CTA recorded anything (kernel {meta.get('kernel')!r}: only the sm90 kernel of "
                         f"a -DWA_SM90_PROGRESS_TRACE=ON build records)")
    return meta, np.concatenate(parts), counts


def by_cta(records):
    """(cta, its records in time order) for every CTA that recorded."""
    for cta in np.unique(records["cta"]):
        yield int(cta), records[records["cta"] == cta]


def sample_times(records, samples):
    """`samples` evenly spaced times (ns) inside the middle 90 % of the trace."""
    times = records["time_ns"].astype(np.int64)
    t0, t1 = times.min(), times.max()
    return t0 + (t1 - t0) * (0.05 + 0.9 * (np.arange(samples) + 0.5) / samples)


def cta_rates(records):
    """Walk positions per microsecond of each CTA: positions advanced between consecutive records of one item,
    over the time they took."""
    rates = {}
    for cta, own in by_cta(records):
        same_item = own["ticket"][1:] == own["ticket"][:-1]
        positions = (own["position"][1:] - own["position"][:-1])[same_item].sum()
        micros = (own["time_ns"][1:].astype(np.int64) - own["time_ns"][:-1].astype(np.int64))[same_item].sum() / 1e3
        if micros > 0:
            rates[cta] = positions / micros
    return rates


def spreads(records, samples):
    """Per sample time: the CTA-weighted mean over heads of the range and of the 10-90 % range of the CTAs'
    current K/V blocks, and how many CTAs were walking."""
    grid = sample_times(records, samples)
    per_cta = []
    for _, own in by_cta(records):
        own_times = own["time_ns"].astype(np.int64)
        gaps = np.diff(own_times)
        # A CTA that has not recorded for 4 of its typical gaps has finished (or not started) by then.
        stale = 4 * (np.median(gaps) if gaps.size else 0)
        per_cta.append((own, own_times, stale))
    full, central, walking = [], [], []
    for t in grid:
        by_head = {}
        for own, own_times, stale in per_cta:
            i = np.searchsorted(own_times, t, side="right") - 1
            if i < 0 or (i == own_times.size - 1 and t - own_times[i] > stale):
                continue
            by_head.setdefault(int(own["head"][i]), []).append(int(own["block"][i]))
        weight = total_range = total_central = 0.0
        for blocks in by_head.values():
            if len(blocks) < 2:
                continue
            blocks = np.asarray(blocks)
            total_range += len(blocks) * (blocks.max() - blocks.min())
            p10, p90 = np.percentile(blocks, [10, 90])
            total_central += len(blocks) * (p90 - p10)
            weight += len(blocks)
        walking.append(sum(len(b) for b in by_head.values()))
        if weight > 0:
            full.append(total_range / weight)
            central.append(total_central / weight)
    return np.asarray(full), np.asarray(central), np.asarray(walking)


def progress_spreads(records, samples, row_blocks):
    """Dense mode: per sample time, the range and the 10-90 % range over the walking CTAs of the blocks each has
    walked since the launch (every row has row_blocks), interpolated between its records. CTAs in lockstep have
    walked the same number whatever rows they are on, so unlike the K/V block index this has no jump where the
    CTAs wrap to their next rows."""
    grid = sample_times(records, samples)
    walked = []
    for _, own in by_cta(records):
        new_item = np.concatenate([[False], own["ticket"][1:] != own["ticket"][:-1]])
        progress = own["position"] + row_blocks * np.cumsum(new_item)
        own_times = own["time_ns"].astype(np.int64)
        inside = (grid >= own_times[0]) & (grid <= own_times[-1])
        walked.append(np.where(inside, np.interp(grid, own_times, progress), np.nan))
    walked = np.asarray(walked)
    full, central = [], []
    for column in walked.T:
        column = column[~np.isnan(column)]
        if column.size >= 2:
            full.append(column.max() - column.min())
            p10, p90 = np.percentile(column, [10, 90])
            central.append(p90 - p10)
    return np.asarray(full), np.asarray(central)


def summarize(path, samples=400):
    meta, records, counts = read_trace(path)
    capacity = int(meta["records_per_cta"])
    rates = cta_rates(records)
    rate_values = np.asarray(list(rates.values())) if rates else np.zeros(1)
    full, central, walking = spreads(records, samples)
    if full.size == 0:
        raise TraceError(f"{path}: no sample time had two CTAs on one head")
    block_mib = meta["kv_block_bytes"] / 2**20
    l2_mib = meta["l2_bytes"] / 2**20 if meta.get("l2_bytes") else None

    def in_units(blocks):
        out = {"blocks": round(float(blocks), 1), "mib": round(float(blocks) * block_mib, 1)}
        if l2_mib:
            out["l2_share"] = round(float(blocks) * block_mib / l2_mib, 3)
        return out

    def spread_entry(values):
        tenth = max(1, values.size // 10)  # first and last tenth as medians: a sample at a row change is one value
        return {"median": in_units(np.median(values)), "p90": in_units(np.percentile(values, 90)),
                "first_tenth": in_units(np.median(values[:tenth])), "last_tenth": in_units(np.median(values[-tenth:]))}

    duration_ms = (int(records["time_ns"].max()) - int(records["time_ns"].min())) / 1e6
    summary = {
        "trace": str(path),
        "case": {k: meta.get(k) for k in ("kernel", "mode", "mask", "order", "heads", "tokens", "block",
                                          "head_dim", "kv_blocks")},
        "ctas_recording": int(np.count_nonzero(counts)),
        "records": int(records.size),
        "dropped_records": int(np.maximum(counts - capacity, 0).sum()),
        "items": int(np.unique(records["ticket"]).size),
        "duration_ms": round(duration_ms, 3),
        "rate_positions_per_us": {"median": round(float(np.median(rate_values)), 4),
                                  "min": round(float(rate_values.min()), 4),
                                  "max": round(float(rate_values.max()), 4),
                                  "cv": round(float(rate_values.std() / rate_values.mean()), 4)
                                  if rate_values.mean() > 0 else None},
        "ctas_walking_median": int(np.median(walking)),
        "spread_range": spread_entry(full),
        "spread_10_90": spread_entry(central),
    }
    if meta.get("mode") == "dense":
        walked_full, walked_central = progress_spreads(records, samples, int(meta["kv_blocks"]))
        if walked_full.size:
            summary["walked_range"] = spread_entry(walked_full)
            summary["walked_10_90"] = spread_entry(walked_central)
    return summary


def describe(summary):
    case = summary["case"]
    rate = summary["rate_positions_per_us"]
    rng, mid = summary["spread_range"], summary["spread_10_90"]

    def fmt(entry):
        share = f", {100 * entry['l2_share']:.0f} % of L2" if "l2_share" in entry else ""
        return f"{entry['blocks']:.0f} blocks ({entry['mib']:.0f} MiB{share})"

    lines = [f"{summary['trace']}: {case['kernel']} {case['mode']} {case['mask']} {case['order']}, "
             f"{case['heads']} heads x {case['tokens']} tokens, {summary['ctas_recording']} CTAs, "
             f"{summary['items']} items, {summary['duration_ms']:.1f} ms",
             f"  records {summary['records']} (dropped {summary['dropped_records']}); CTAs walking (median) "
             f"{summary['ctas_walking_median']}",
             f"  rate per CTA: median {rate['median']:.3f} positions/us, min {rate['min']:.3f}, max {rate['max']:.3f},"
             f" cv {rate['cv']}",
             f"  K/V spread per head (range): median {fmt(rng['median'])}, p90 {fmt(rng['p90'])}; first tenth "
             f"{fmt(rng['first_tenth'])}, last tenth {fmt(rng['last_tenth'])}",
             f"  K/V spread per head (10-90 %): median {fmt(mid['median'])}, p90 {fmt(mid['p90'])}; first tenth "
             f"{fmt(mid['first_tenth'])}, last tenth {fmt(mid['last_tenth'])}"]
    for key, label in (("walked_range", "range"), ("walked_10_90", "10-90 %")):
        if key in summary:
            entry = summary[key]
            lines.append(f"  blocks walked since the launch, spread over CTAs ({label}): median "
                         f"{fmt(entry['median'])}, p90 {fmt(entry['p90'])}; first tenth {fmt(entry['first_tenth'])}, last tenth "
                         f"{fmt(entry['last_tenth'])}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path, help="write the summaries as a JSON list")
    parser.add_argument("--samples", type=int, default=400, help="sample times per trace (default 400)")
    args = parser.parse_args(argv)
    if args.samples < 10:
        parser.error(f"--samples must be >= 10, got {args.samples}")
    summaries = []
    for path in args.traces:
        try:
            summary = summarize(path, args.samples)
        except (OSError, TraceError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(describe(summary))
        summaries.append(summary)
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
