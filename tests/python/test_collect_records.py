"""The results schema (bench/result_record.py) and how the collectors that merge several calls into one record
keep each row's provenance: bench_masks.py by case, collect_attention.py's FlexAttention/SDPA/ncu call."""

from __future__ import annotations

import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import bench_masks  # noqa: E402
import collect_attention  # noqa: E402
import result_record  # noqa: E402


def test_a_record_names_device_commit_date_and_command_then_holds_records():
    record = result_record.make("GPU", "bench/x.py", commit="abc1234", date="2026-12-04", rows=[1])
    assert list(record) == ["device", "commit", "date", "command", "rows"]
    result_record.check(record, "x.json")


@pytest.mark.parametrize("change, message", [
    ({"device": None}, "'device' must be a non-empty string, got None"),
    ({"command": " "}, "'command' must be a non-empty string"),
    ({"date": "12/04/2026"}, "'date' must be YYYY-MM-DD, got '12/04/2026'"),
])
def test_a_record_with_a_bad_member_is_refused_naming_it(change, message):
    record = {**result_record.make("GPU", "cmd", commit="abc1234", date="2026-12-04", rows=[]), **change}
    with pytest.raises(ValueError, match=re.escape(message)):
        result_record.check(record, "x.json")


def test_a_record_without_a_member_or_records_is_refused(tmp_path):
    with pytest.raises(ValueError, match="x.json: no 'commit' member"):
        result_record.check({"device": "GPU", "date": "2026-12-04", "command": "cmd", "rows": []}, "x.json")
    with pytest.raises(ValueError, match="no records after"):
        result_record.check(result_record.make("GPU", "cmd", commit="c", date="2026-12-04"), "x.json")
    with pytest.raises(ValueError, match="one JSON object"):
        result_record.check([], "x.json")
    out = tmp_path / "r.json"
    with pytest.raises(ValueError):
        result_record.write(out, {"rows": []})
    assert not out.exists()


def test_masks_a_call_replaces_the_rows_of_its_cases_and_keeps_the_others_with_their_stamps():
    old = {"commit": "old", "date": "2026-12-01", "command": "bench_masks.py BUILD"}
    previous = [{"case": "sparge", "mask_ms": 1.0, **old}, {"case": "flexprefill", "mask_ms": 9.0, **old}]
    new = {"commit": "new", "date": "2026-12-04", "command": "bench_masks.py BUILD --cases flexprefill"}
    rows = bench_masks.merged_runs(previous, [{"case": "flexprefill", "mask_ms": 5.0}], new)
    assert rows == [{"case": "sparge", "mask_ms": 1.0, **old}, {"case": "flexprefill", "mask_ms": 5.0, **new}]


def attention_record(commit: str, impls: tuple[str, ...], l2: float | None = None) -> dict:
    cases = [{"impl": impl, "l2_hit_ratio": l2} for impl in impls]
    return result_record.make("GPU", "run", commit=commit, date="2026-12-04", cases=cases, checks=[], skipped=[])


def test_attention_a_call_without_peers_keeps_the_last_call_that_had_them():
    peers_call = attention_record("p1", ("wavealign-kernel", "flexattention", "sdpa"))
    fa4_call = attention_record("k1", ("wavealign-kernel", "flashattention4"))
    merged = collect_attention.with_peers(fa4_call, peers_call)
    assert merged["commit"] == "k1" and merged[collect_attention.PEERS] == peers_call
    later = collect_attention.with_peers(attention_record("k2", ("wavealign-kernel",)), merged)
    assert later["commit"] == "k2" and later[collect_attention.PEERS] == peers_call


def test_attention_a_call_with_peers_or_ncu_figures_stands_alone():
    previous = attention_record("p1", ("flexattention",))
    ncu_call = attention_record("n1", ("wavealign-kernel",), l2=0.7)
    assert collect_attention.with_peers(ncu_call, previous) == ncu_call
    assert collect_attention.with_peers(attention_record("k1", ("wavealign-kernel",)), None)["commit"] == "k1"


def test_the_recorded_attention_file_keeps_flexattention_beside_our_kernel_of_its_call():
    path = ROOT / "bench" / "results" / "h200-attention.json"
    if not path.exists():
        pytest.skip("bench/results is not part of this tree (an sdist leaves it out)")
    record = json.loads(path.read_text())
    peers = record[collect_attention.PEERS]
    assert not collect_attention.has_peers_or_ncu(record) and collect_attention.has_peers_or_ncu(peers)
    assert {case["impl"] for case in peers["cases"]} >= {"wavealign-kernel", "flexattention", "sdpa"}


def test_the_mask_bench_prints_both_xattention_estimates():
    common = {"density": 0.178, "mask_ms": 111.3, "attention_ms": 788.0, "mask_share": 0.14, "target_share": 0.05,
              "meets_target": False, "floor_ms": 124.0, "floor_gemm_tflops": 682.0}
    sixteen = bench_masks.summary({**common, "case": "xattention-s16", "estimate": "fused", "floor_ratio": 1.391,
                                   "cublas_mask_ms": 210.9, "target_floor_ratio": 1.25,
                                   "blocks_differing_from_cublas": 13})
    assert "cuBLAS path   210.90 ms" in sixteen and "mask / floor 1.391 (target 1.25, MISSED)" in sixteen
    int8 = bench_masks.summary({**common, "case": "xattention-s16-int8", "estimate": "fused-int8",
                                "floor_ratio": 0.898, "jaccard_vs_16bit": 0.9971, "blocks_differing_from_16bit": 42})
    assert "mask / floor 0.898 (the bf16 floor), Jaccard with the 16-bit mask 0.9971 (42 blocks differ)" in int8


def test_a_mask_record_merged_from_several_calls_names_every_commit():
    record = {"device": "GPU", "commit": "new", "date": "2026-12-05", "command": "bench_masks.py BUILD --cases x"}
    previous = [{"case": "y", "commit": "old", "date": "2026-12-01", "command": "bench_masks.py BUILD --cases y"}]
    merged = bench_masks.merged_record(record, previous, [{"case": "x"}])
    assert merged["commit"] == "old,new" and merged["command"] == bench_masks.MERGED_COMMAND
    alone = bench_masks.merged_record(record, [], [{"case": "x"}])
    assert alone["commit"] == "new" and alone["command"] == record["command"]
