"""bench/gpu/collect_kernel_variants.py on synthetic logs of run_kernel_variants.sh (wa_bench_attention --variants
lines): medians per variant and case, ncu counts per 128 x 128 block, run.json."""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu" / "collect_kernel_variants.py"
spec = importlib.util.spec_from_file_location("collect_kernel_variants", SCRIPT)
collect = importlib.util.module_from_spec(spec)
spec.loader.exec_module(collect)


def bench_line(variant, round_, mode, tflops, clock=1500.0):
    run = {"variant": variant, "round": round_, "impl": "wavealign-kernel", "mode": mode, "mask": "dense" if mode == "dense" else "video",
           "order": "dense" if mode == "dense" else "wavealign", "tokens": 363600, "heads": 4, "head_dim": 128,
           "block": 128,
           "density": 1.0 if mode == "dense" else 0.28, "nnz_blocks": 100, "ms": 1.0, "tflops": tflops,
           "sm_clock_mhz": clock, "power_w": 699.0, "power_capped": 1.0}
    return json.dumps(run)


NCU = '''# case dense 8x32768
==PROF== Connected to process 1 (wa_bench_attention)
{"impl": "wavealign-kernel", "mode": "dense", "nnz_blocks": 524288, "tflops": 600.0}
"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","void fwd_kernel_sm90<a, b>(c)","Command line profiler metrics","gpu__time_duration.sum","ms","6.50"
"0","1","void fwd_kernel_sm90<a, b>(c)","Command line profiler metrics","sm__cycles_elapsed.avg","cycle","10,485,760"
"0","1","void fwd_kernel_sm90<a, b>(c)","Command line profiler metrics","smsp__inst_executed.sum","inst","2,097,152,000"
"0","1","void fwd_kernel_sm90<a, b>(c)","Command line profiler metrics","smsp__thread_inst_executed_per_inst_executed.ratio","","31.23"
"0","1","void fwd_kernel_sm90<a, b>(c)","Command line profiler metrics","smsp__thread_inst_executed_pred_on_per_inst_executed.ratio","","30.82"
# case video 0.28 wavealign
{"impl": "wavealign-kernel", "mode": "sparse", "nnz_blocks": 1000}
'''


def test_summary_and_run_json(tmp_path, capsys):
    lines = [bench_line("default", 1, "dense", 600.0), bench_line("default", 2, "dense", 610.0),
             bench_line("default", 1, "sparse", 500.0), bench_line("kv-in-order", 1, "dense", 640.0, None)]
    (tmp_path / "variants.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "ncu_kv-in-order.txt").write_text(NCU)
    collect.main([str(tmp_path), "--commit", "abc1234"])
    out = capsys.readouterr().out
    table = collect.timing_table(collect.read_runs(tmp_path))
    assert table["default"]["dense"] == (605.0, 1500.0, 2)
    assert table["default"]["video 0.28 wavealign"] == (500.0, 1500.0, 1)
    assert table["kv-in-order"]["dense"] == (640.0, None, 1)
    assert "605.0 (1500) x2" in out and "640.0 x1" in out
    # 2,097,152,000 instructions / 524,288 blocks; 10,485,760 cycles x 132 SMs / 524,288 blocks. The second
    # case has no metrics (the profile was cut short) and is left out.
    assert "kv-in-order                dense 8x32768" in out and "    4000  31.23 / 30.82     2640" in out
    assert "video 0.28 wavealign" not in out.split("ncu, one launch")[1]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["commit"] == "abc1234" and len(run["cases"]) == 4
    assert run["cases"][0]["variant"] == "default" and run["cases"][0]["round"] == 1
    assert "--variants default,kv-in-order --rounds 2" in run["command"]


def test_command_names_the_variants_that_ran():
    runs = [json.loads(bench_line(v, 1, "dense", 600.0)) for v in ("kv-in-order", "default", "kv-in-order")]
    assert "--variants kv-in-order,default " in collect.command_of(runs)


def test_case_labels():
    run = json.loads(bench_line("default", 1, "dense", 600.0))
    assert collect.case_of(run) == "dense"
    assert collect.case_of({**run, "head_dim": 64, "tokens": 32768}) == "dense d64 L32768"
    assert collect.case_of({**run, "block": 64, "tokens": 32768}) == "dense 64x64 L32768"
    assert collect.case_of(json.loads(bench_line("default", 1, "sparse", 500.0))) == "video 0.28 wavealign"


def test_ncu_per_block_values(tmp_path):
    path = tmp_path / "ncu.txt"
    path.write_text(NCU)
    [(label, values)] = collect.read_ncu(path, sms=132)
    assert label == "dense 8x32768"
    assert values["instructions_per_block"] == pytest.approx(4000.0)
    assert values["sm_cycles_per_block"] == pytest.approx(2640.0)
    assert values["active_threads"] == pytest.approx(31.23)


def test_ncu_memory_metrics_when_profiled(tmp_path):
    row = '"0","1","void fwd_kernel_sm90<a, b>(c)","Command line profiler metrics","{}","{}","{}"\n'
    dense_401 = ("# case dense 401 frames\n"
                 + '{"impl": "wavealign-kernel", "mode": "dense", "nnz_blocks": 32285124}\n'
                 + row.format("sm__cycles_elapsed.avg", "cycle", "624,587,606")
                 + row.format("smsp__inst_executed.sum", "inst", "1")
                 + row.format("smsp__thread_inst_executed_per_inst_executed.ratio", "", "31.1")
                 + row.format("smsp__thread_inst_executed_pred_on_per_inst_executed.ratio", "", "30.7")
                 + row.format("lts__t_sector_hit_rate.pct", "%", "54.09")
                 + row.format("dram__bytes_read.sum", "Gbyte", "689.15"))
    path = tmp_path / "ncu.txt"
    path.write_text(NCU + dense_401)
    cases = dict(collect.read_ncu(path, sms=132))
    assert "l2_hit_pct" not in cases["dense 8x32768"]  # not profiled there
    assert cases["dense 401 frames"]["l2_hit_pct"] == pytest.approx(54.09)
    assert cases["dense 401 frames"]["dram_read_gb"] == pytest.approx(689.15)
    path.write_text(NCU + dense_401.replace('"Gbyte"', '"furlong"'))
    with pytest.raises(SystemExit, match="dram__bytes_read.sum in 'furlong'"):
        collect.read_ncu(path, sms=132)
