"""bench/gpu/collect_side_by_side.py on made-up Nsight Compute raw pages: cycles and instructions per block
from the duration, clock and launch counts; a metric in an unexpected unit is refused, not mis-scaled."""

import csv
import io
import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu" / "collect_side_by_side.py"

BASE = {  # metric: (unit, value)
    "Kernel Name": ("", "kernel"), "gpu__time_duration.sum": ("ns", "100,000,000"),
    "sm__cycles_elapsed.avg.per_second": ("hz", "1,500,000,000"), "device__attribute_multiprocessor_count": ("", "132"),
    "sm__cycles_active.avg": ("cycle", "135,000,000"), "smsp__inst_executed.sum": ("inst", "40,000,000,000"),
    "sm__inst_issued.avg.per_cycle_active": ("inst/cycle", "1.6"),
    "sm__issue_active.avg.pct_of_peak_sustained_elapsed": ("%", "40"),
    "sm__instruction_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "80"),
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": ("%", "15"),
    "smsp__thread_inst_executed_per_inst_executed.ratio": ("", "31.5"),
    "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio": ("", "31"),
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": ("", "2.0"),
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": ("", "0.1"),
    "launch__registers_per_thread": ("register/thread", "168"),
    "launch__shared_mem_per_block_dynamic": ("byte/block", "163,840"),
    "launch__shared_mem_per_block_static": ("byte/block", "0 (0)"), "launch__block_size": ("", "384"),
    "launch__grid_size": ("", "132"), "lts__t_sector_hit_rate.pct": ("%", "70"),
    "dram__bytes.sum.per_second": ("byte/s", "1,000,000,000,000"),
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "20"),
}


def raw_page(*kernels):
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    names = list(kernels[0])
    writer.writerow(names)
    writer.writerow([kernels[0][name][0] for name in names])
    for kernel in kernels:
        writer.writerow([kernel[name][1] for name in names])
    return "==PROF== noise\n" + out.getvalue()


def write_logs(folder, ours=BASE):
    (folder / "ours-sparse.csv").write_text(raw_page(ours))
    (folder / "ours-dense.csv").write_text(raw_page(ours))
    (folder / "fa4.csv").write_text('{"impl": "flashattention4"}\n' + raw_page(BASE, BASE))
    (folder / "side-cases.jsonl").write_text(json.dumps({"nnz_blocks": 1000, "shape": [1, 10, 200]}) + "\n")


def test_per_block_figures_come_from_duration_clock_and_counts(tmp_path):
    write_logs(tmp_path)
    out = tmp_path / "side.json"
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--json", str(out), "--markdown",
                             "--device", "made-up GPU", "--commit", "abc1234"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    record = json.loads(out.read_text())
    assert (record["device"], record["commit"]) == ("made-up GPU", "abc1234")
    assert "collect_side_by_side.py" in record["command"] and len(record["date"]) == 10
    kernels = record["kernels"]
    sparse, dense = kernels["ours sparse"], kernels["FA4 dense"]
    assert sparse["sm_cycles_per_block"] == pytest.approx(0.1 * 1.5e9 * 132 / 1000)  # 150 M cycles x 132 SMs
    assert dense["sm_cycles_per_block"] == pytest.approx(0.1 * 1.5e9 * 132 / 2000)
    assert sparse["warp_instructions_per_block"] == pytest.approx(4e10 / 1000)
    assert sparse["dram_gb"] == pytest.approx(100.0)  # 1 TB/s for 100 ms
    assert sparse["shared_kb_per_cta"] == pytest.approx(160.0)
    assert list(sparse["top_stalls_per_issue"]) == ["wait", "barrier"]
    assert "| SM cycles per 128 x 128 block |" in result.stdout


def test_a_metric_in_another_unit_is_refused(tmp_path):
    write_logs(tmp_path, {**BASE, "gpu__time_duration.sum": ("usecond", "100,000")})
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode != 0 and "gpu__time_duration.sum is in 'usecond', expected 'ns'" in result.stderr


SOURCE_COLUMNS = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
                  "Instructions Executed", "stall_wait", "stall_long_sb", "stall_wait (Not Issued)"]


def source_page(instructions):
    """ncu's source page in SASS: (sass, executed, all samples, wait samples, long_sb samples) per instruction."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(["Kernel Name", "kernel", ""])
    writer.writerow(SOURCE_COLUMNS)
    for address, (sass, executed, samples, wait, long_sb) in enumerate(instructions):
        writer.writerow([hex(0x1000 + 16 * address), f"      {sass}", samples, samples, f"{executed:,}", wait, long_sb, 0])
    return "==PROF== Connected\n" + out.getvalue()


LOOP = [  # 1,000 blocks: consumer instructions run 8,000 times, the producer's 1,000
    ("@!P0 BRA 0x2000", 8000, 200, 0, 150),
    ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], RZ, !UPT", 8000, 300, 100, 0),
    ("HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR16].tnspB, R88", 8000, 100, 100, 0),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 8000, 100, 0, 0),
    ("FMNMX R189, R4, R15, !PT", 8000, 300, 300, 0),
    ("YIELD", 8000, 0, 0, 0),
    ("UTMALDG.2D [UR8], [UR4]", 1000, 5000, 0, 5000),
]


def test_source_phases_split_the_consumer_loop_at_its_landmarks(tmp_path):
    write_logs(tmp_path)
    for name in ("ours", "fa4"):
        (tmp_path / f"{name}-source.csv").write_text(source_page(LOOP))
    out = tmp_path / "side.json"
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--source", "--json", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    loop = json.loads(out.read_text())["source_phases"]["ours"]
    assert loop["loop_instructions"] == 6  # the producer's instruction is not in the loop
    assert loop["reconvergence_in_loop"] == {"YIELD": 1}
    cycles = [phase["cycles_per_warp"] for phase in loop["phases"]]
    per_block = 0.1 * 1.5e9 * 132 / 1000
    assert sum(cycles) == pytest.approx(per_block)  # the loop's 1,000 samples carry all of a block's cycles
    assert cycles == pytest.approx([0.2 * per_block, 0.3 * per_block, 0.1 * per_block, 0.1 * per_block, 0.3 * per_block])
    s_gemm = loop["phases"][1]
    assert s_gemm["instructions_per_warp"] == pytest.approx(1.0)
    # 300 samples at the S GEMM's first wgmma, 100 of them with a named reason: 200 waited for the tensor core
    assert list(s_gemm["top_reasons_cycles"]) == ["wgmma issue (no named reason)", "wait"]
    assert s_gemm["top_reasons_cycles"]["wgmma issue (no named reason)"] == pytest.approx(0.2 * per_block)
    assert "| S GEMM issue |" in result.stdout


def test_a_source_page_without_the_landmarks_is_refused(tmp_path):
    write_logs(tmp_path)
    no_pv = [row for row in LOOP if "tnspB" not in row[0]]
    for name in ("ours", "fa4"):
        (tmp_path / f"{name}-source.csv").write_text(source_page(no_pv))
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--source"], capture_output=True, text=True)
    assert result.returncode != 0 and "the loop has no wgmma with a transposed B" in result.stderr


def test_the_sparse_launches_alone_without_the_dense_pages(tmp_path):
    write_logs(tmp_path)
    (tmp_path / "ours-dense.csv").unlink()
    out = tmp_path / "side.json"
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--json", str(out)], capture_output=True, text=True)
    assert result.returncode != 0 and "expected the sparse one (no ours-dense.csv)" in result.stderr
    (tmp_path / "fa4.csv").write_text(raw_page(BASE))
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--json", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert list(json.loads(out.read_text())["kernels"]) == ["ours sparse", "FA4 sparse"]
