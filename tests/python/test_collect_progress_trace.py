"""bench/gpu/collect_progress_trace.py on synthetic traces in wa_bench_attention's --progress-trace format: CTAs in
lockstep give no spread, CTAs at different rates a spread that grows, and files that are not traces are refused
with a reason."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu" / "collect_progress_trace.py"
spec = importlib.util.spec_from_file_location("collect_progress_trace", SCRIPT)
collect = importlib.util.module_from_spec(spec)
spec.loader.exec_module(collect)

CTAS, CAPACITY, EVERY = 8, 64, 32
KV_BLOCKS = 256  # 8 records per row
BLOCK_BYTES = 2 * 128 * 128 * 2


def write_trace(path, walks, ctas=CTAS, capacity=CAPACITY, meta_changes=None):
    """walks[cta] = list of (time_ns, ticket, head, position); the block is the position (dense walk)."""
    meta = {"format": "wavealign-progress-trace", "version": 1, "ctas": ctas, "records_per_cta": capacity,
            "record_bytes": 32, "every": EVERY, "kernel": "sm90_bf16_d128", "heads": 1, "tokens": KV_BLOCKS * 128,
            "block": 128, "head_dim": 128, "kv_blocks": KV_BLOCKS, "kv_block_bytes": BLOCK_BYTES,
            "l2_bytes": 8 * 2**20, "mode": "dense", "mask": "dense", "order": "dense"}
    meta.update(meta_changes or {})
    counts = np.zeros(ctas, dtype="<u4")
    slots = np.zeros((ctas, capacity), dtype=collect.RECORD)
    for cta, walk in enumerate(walks):
        counts[cta] = len(walk)
        for i, (time_ns, ticket, head, position) in enumerate(walk[:capacity]):
            slots[cta, i] = (time_ns, ticket, head, 0, position, position, cta)
    path.write_bytes(json.dumps(meta).encode() + b"\n" + counts.tobytes() + slots.tobytes())
    return path


def dense_walk(cta, rate_per_us, rows, start_ns=0):
    """Rows of KV_BLOCKS positions, one record per EVERY positions, at rate_per_us positions per microsecond;
    ticket cta + rows_done * CTAS."""
    walk, t = [], float(start_ns)
    step_ns = EVERY / rate_per_us * 1e3
    for row in range(rows):
        for position in range(0, KV_BLOCKS, EVERY):
            walk.append((int(t), cta + row * CTAS, 0, position))
            t += step_ns
    return walk


def test_lockstep_walk_has_no_spread(tmp_path):
    path = write_trace(tmp_path / "lockstep.bin", [dense_walk(c, 1.0, 6) for c in range(CTAS)])
    summary = collect.summarize(path, samples=50)
    assert summary["ctas_recording"] == CTAS
    assert summary["records"] == CTAS * 6 * KV_BLOCKS // EVERY
    assert summary["dropped_records"] == 0
    assert summary["items"] == CTAS * 6
    assert summary["spread_range"]["median"]["blocks"] == 0
    assert summary["rate_positions_per_us"]["median"] == pytest.approx(1.0, rel=1e-3)
    assert summary["rate_positions_per_us"]["cv"] == pytest.approx(0.0, abs=1e-3)
    assert summary["ctas_walking_median"] == CTAS
    assert summary["walked_range"]["median"]["blocks"] == 0


def test_ctas_at_different_rates_drift_apart(tmp_path):
    # CTA c runs 3 % x c faster: by the end the fastest is rows ahead, so the blocks in flight span the row.
    walks = [dense_walk(c, 1.0 + 0.03 * c, 7) for c in range(CTAS)]
    path = write_trace(tmp_path / "drift.bin", walks)
    summary = collect.summarize(path, samples=200)
    rng = summary["spread_range"]
    assert rng["first_tenth"]["blocks"] < rng["last_tenth"]["blocks"]
    assert rng["last_tenth"]["blocks"] >= 64
    assert summary["rate_positions_per_us"]["max"] / summary["rate_positions_per_us"]["min"] == pytest.approx(
        1.21, rel=1e-2)
    walked = summary["walked_range"]
    assert walked["first_tenth"]["blocks"] < walked["last_tenth"]["blocks"]
    # Spread in MiB and as L2 share follow from the block bytes and the L2 in the header.
    median = rng["median"]
    assert median["mib"] == pytest.approx(median["blocks"] * BLOCK_BYTES / 2**20, abs=0.1)
    assert median["l2_share"] == pytest.approx(median["mib"] / 8, abs=0.01)


def test_blocks_walked_since_the_launch_ignore_row_changes(tmp_path):
    # Dense CTAs 2 us apart (2 positions at 1 per us): the last is 14 positions behind the first, also while some
    # have moved on to their next rows and others not (their K/V block indices then differ by a whole row).
    walks = [dense_walk(c, 1.0, 6, start_ns=2_000 * c) for c in range(CTAS)]
    summary = collect.summarize(write_trace(tmp_path / "staggered.bin", walks), samples=400)
    walked = summary["walked_range"]
    assert walked["median"]["blocks"] == pytest.approx(14, abs=0.5)
    assert walked["p90"]["blocks"] == pytest.approx(14, abs=0.5)
    assert summary["walked_10_90"]["median"]["blocks"] < walked["median"]["blocks"]
    assert summary["spread_range"]["p90"]["blocks"] >= walked["p90"]["blocks"]
    # Sparse traces have no common row length: no walked spread.
    sparse = write_trace(tmp_path / "sparse.bin", walks, meta_changes={"mode": "sparse", "mask": "video"})
    assert "walked_range" not in collect.summarize(sparse, samples=50)


def test_heads_are_compared_apart(tmp_path):
    # Two groups on different heads, each in lockstep, half a row apart: no spread within a head.
    walks = [dense_walk(c, 1.0, 6, start_ns=0 if c < CTAS // 2 else 128_000) for c in range(CTAS)]
    walks = [[(t, k, 0 if c < CTAS // 2 else 1, p) for t, k, _, p in w] for c, w in enumerate(walks)]
    summary = collect.summarize(write_trace(tmp_path / "heads.bin", walks), samples=50)
    assert summary["spread_range"]["median"]["blocks"] == 0


def test_dropped_records_are_counted(tmp_path):
    walks = [dense_walk(c, 1.0, 10) for c in range(CTAS)]  # 80 records per CTA, capacity 64
    summary = collect.summarize(write_trace(tmp_path / "full.bin", walks), samples=20)
    assert summary["dropped_records"] == CTAS * (80 - CAPACITY)
    assert summary["records"] == CTAS * CAPACITY


def test_main_prints_and_writes_json(tmp_path, capsys):
    path = write_trace(tmp_path / "t.bin", [dense_walk(c, 1.0, 4) for c in range(CTAS)])
    out = tmp_path / "summary.json"
    assert collect.main([str(path), "--json", str(out), "--samples", "20"]) == 0
    printed = capsys.readouterr().out
    assert "K/V spread per head (range): median 0 blocks" in printed
    assert "blocks walked since the launch, spread over CTAs (range): median 0 blocks" in printed
    assert json.loads(out.read_text())[0]["items"] == CTAS * 4


@pytest.mark.parametrize("content, message", [
    (b"not a trace", "no JSON header line"),
    (b"{not json\n", "not JSON"),
    (json.dumps({"format": "other"}).encode() + b"\n", "format is 'other'"),
    (json.dumps({"format": "wavealign-progress-trace", "version": 2, "record_bytes": 32}).encode() + b"\n",
     "version 2"),
])
def test_not_a_trace_is_refused(tmp_path, content, message):
    path = tmp_path / "bad.bin"
    path.write_bytes(content)
    with pytest.raises(collect.TraceError, match=message):
        collect.read_trace(path)


def test_truncated_trace_and_empty_trace_are_refused(tmp_path, capsys):
    path = write_trace(tmp_path / "t.bin", [dense_walk(c, 1.0, 2) for c in range(CTAS)])
    path.write_bytes(path.read_bytes()[:-32])
    with pytest.raises(collect.TraceError, match="bytes after the header, expected"):
        collect.read_trace(path)
    empty = write_trace(tmp_path / "empty.bin", [[] for _ in range(CTAS)])
    with pytest.raises(collect.TraceError, match="no CTA recorded anything"):
        collect.read_trace(empty)
    assert collect.main([str(empty)]) == 1
    assert "no CTA recorded anything" in capsys.readouterr().err
