"""bench/gpu/collect_mask_kernels.py on made-up Nsight Compute pages: launch durations summed per kernel (the
template arguments keep FlexPrefill's two fused passes apart, units scaled to ns), the detail page's stall
reasons ranked, the source page's executed instructions by opcode and its most-stalled instructions, and a
duration in an unknown unit refused rather than mis-scaled."""

import csv
import io
import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu" / "collect_mask_kernels.py"
HEADER = ["ID", "Process ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"]
PASS1 = "wavealign::<unnamed>::fused_tile_kernel<__nv_bfloat16, 128, false>(wavealign::<unnamed>::TileParams)"
PASS2 = "wavealign::<unnamed>::fused_tile_kernel<__nv_bfloat16, 128, true>(wavealign::<unnamed>::TileParams)"
POOL = "wavealign::cuda::masks::<unnamed>::pool_kernel(wavealign::cuda::masks::PoolParams)"


def times_page(rows):
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(HEADER)
    for i, (name, unit, value) in enumerate(rows):
        writer.writerow([str(i), "1", name, "gpu__time_duration.sum", unit, value])
    return "==PROF== Connected to process 1\n{\"json\": \"of the CLI\"}\n" + out.getvalue()


def detail_page(kernels):
    names = list(kernels[0])
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(names)
    writer.writerow([kernels[0][name][0] for name in names])
    for kernel in kernels:
        writer.writerow([kernel[name][1] for name in names])
    return out.getvalue()


def run(folder, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), str(folder), *extra], capture_output=True, text=True)


def test_launches_sum_per_kernel_and_stalls_rank(tmp_path):
    (tmp_path / "times.csv").write_text(times_page([
        (PASS1, "ns", "2,000,000"), (PASS2, "us", "3,000"), (POOL, "ns", "75,000"), (POOL, "usecond", "77")]))
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    kernel = {"Kernel Name": ("", PASS1), "gpu__time_duration.sum": ("ns", "2,000,000"),
              "launch__registers_per_thread": ("register/thread", "126"),
              stall.format("barrier"): ("", "0.5"), stall.format("math_pipe_throttle"): ("", "1.5"),
              stall.format("short_scoreboard"): ("", "0.9")}
    (tmp_path / "detail.csv").write_text(detail_page([kernel]))
    out = tmp_path / "kernels.json"
    result = run(tmp_path, "--json", str(out))
    assert result.returncode == 0, result.stderr
    record = json.loads(out.read_text())
    by_name = {item["kernel"]: item for item in record["kernels"]}
    assert by_name["fused_tile_kernel<__nv_bfloat16, 128, false>"]["ms"] == 2.0
    assert by_name["fused_tile_kernel<__nv_bfloat16, 128, true>"]["ms"] == 3.0
    assert by_name["pool_kernel"]["launches"] == 2 and abs(by_name["pool_kernel"]["ms"] - 0.152) < 1e-12
    assert abs(record["total_ms"] - 5.152) < 1e-12
    assert [item["kernel"] for item in record["kernels"]][0].endswith("true>")  # heaviest first
    (detail,) = record["details"]
    assert detail["registers"] == 126 and detail["duration_us"] == 2000
    assert list(detail["top_stalls"]) == ["math_pipe_throttle", "short_scoreboard", "barrier"]
    assert "| pool_kernel | 2 | 0.152 |" in result.stdout


def test_a_duration_in_an_unknown_unit_is_refused(tmp_path):
    (tmp_path / "times.csv").write_text(times_page([(POOL, "cycle", "75,000")]))
    result = run(tmp_path)
    assert result.returncode != 0
    assert "gpu__time_duration.sum in 'cycle'" in result.stderr


def test_a_page_without_launches_is_refused(tmp_path):
    (tmp_path / "times.csv").write_text("==PROF== nothing profiled\n")
    result = run(tmp_path)
    assert result.returncode != 0 and "holds no launch" in result.stderr


def test_the_source_page_gives_the_opcode_mix_and_the_stalled_instructions(tmp_path):
    (tmp_path / "times.csv").write_text(times_page([(PASS1, "ns", "1,000")]))
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(["Kernel Name", "fused_tile_kernel<__nv_bfloat16, (int)128, (bool)0>(TileParams)", ""])
    writer.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)",
                     "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed"])
    writer.writerow(["0x10", "HMMA.16816.F32.BF16 R4, R8, R12, R4", "30", "20", "6,400"])
    writer.writerow(["0x20", "@!P0 IMAD.MOV.U32 R1, RZ, RZ, R2", "5", "1", "3,200"])
    writer.writerow(["0x30", "IMAD R3, R4, R5, R6", "90", "60", "3,200"])
    writer.writerow(["0x40", "MUFU.EX2 R7, R7", "0", "0", "1,600"])
    writer.writerow(["", "", "", "", ""])  # ncu's blank separator rows are skipped
    (tmp_path / "source.csv").write_text("==PROF== noise\n" + out.getvalue())
    record_path = tmp_path / "k.json"
    result = run(tmp_path, "--json", str(record_path))
    assert result.returncode == 0, result.stderr
    source = json.loads(record_path.read_text())["source"]
    assert source["executed"] == 14400
    assert source["by_opcode"] == {"IMAD": 6400, "HMMA": 6400, "MUFU": 1600}
    assert [line["samples"] for line in source["top_stalled"]] == [90, 30, 5]  # MUFU has none: not listed
    assert "14,400 warp instructions executed" in result.stdout


def test_a_source_page_without_the_executed_column_is_refused(tmp_path):
    (tmp_path / "times.csv").write_text(times_page([(PASS1, "ns", "1,000")]))
    (tmp_path / "source.csv").write_text('"Address","Source"\n"0x10","HMMA R4, R8, R12, R4"\n')
    result = run(tmp_path)
    assert result.returncode != 0 and "instructions executed" in result.stderr


def test_short_name_reads_ncu_and_cupti_names():
    sys.path.insert(0, str(SCRIPT.parent))
    from collect_mask_kernels import short_name

    assert short_name(PASS1) == "fused_tile_kernel<__nv_bfloat16, 128, false>"
    cupti = ("void wavealign::cuda::masks::(anonymous namespace)::pool_kernel<4, true, false>"
             "(wavealign::cuda::masks::PoolParams)")
    assert short_name(cupti) == "pool_kernel<4, true, false>"
    assert short_name("wavealign::cuda::masks::(anonymous namespace)::select_kernel(SelectParams)") == "select_kernel"


def test_the_timeline_tool_takes_method_options_as_python_literals():
    """bench/gpu/trace_mask_kernels.py --option NAME=VALUE: the value a Python literal, a malformed one refused
    with a message that names it (the script itself needs a GPU; its option parser does not)."""
    import argparse
    import importlib.util

    import pytest

    path = SCRIPT.parent / "trace_mask_kernels.py"
    spec = importlib.util.spec_from_file_location("trace_mask_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.method_option("stride=16") == ("stride", 16)
    assert module.method_option("int8_estimate=True") == ("int8_estimate", True)
    assert module.method_option("threshold=0.3") == ("threshold", 0.3)
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=VALUE, got 'stride'"):
        module.method_option("stride")
    with pytest.raises(argparse.ArgumentTypeError, match="stride: 'sixteen' is not a Python literal"):
        module.method_option("stride=sixteen")
