"""`wavealign bench`: the fused kernel on a mask in the original and the recommended order, next to the
simulator's prediction. Without a GPU (CI) it says so and prints the prediction alone; with one the measured
columns are filled (the H200 run checks those)."""
import json

import numpy as np
import pytest

SMALL = ("--frames", "9", "--heads", "1")


def test_bench_names_the_device_or_says_there_is_none(cli):
    out = cli("bench", *SMALL).stdout
    lines = out.splitlines()
    assert lines[0].startswith("workload: wan2.1-14b 9 frames, video mask")
    assert lines[1].startswith("device: ")
    rows = [line.split() for line in lines if line.startswith("wavealign-kernel")]
    assert [row[1] for row in rows][0] == "original"
    if lines[1].startswith("device: none"):
        assert "the simulator's prediction only" in lines[1]
        assert all(row[2] == "-" and row[3] == "-" for row in rows)  # nothing measured
        assert all(float(row[5]) > 0 for row in rows)  # predicted ms
    else:
        assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows)
    assert lines[-1].startswith("recommendation: ")


def test_bench_json_compares_the_recommended_order_with_the_original(cli):
    out = json.loads(cli("bench", *SMALL, "--json").stdout)
    recommended = out["recommendation"]["order"]
    kernel = [row for row in out["results"] if row["impl"] == "wavealign-kernel"]
    assert [row["order"] for row in kernel] == (["original"] if recommended == "original" else
                                                ["original", recommended])
    assert kernel[0]["predicted_speedup"] == 1.0
    for row in kernel:
        assert row["predicted_ms"] > 0
        if out["device"] is None:
            assert out["no_device"] and row["ms"] is None and row["tflops"] is None and row["speedup"] is None
        else:
            assert row["ms"] > 0 and row["tflops"] > 0 and row["speedup"] > 0


def test_bench_takes_an_order_and_a_mask_file(cli, tmp_path):
    mask = np.random.default_rng(0).random((2, 60, 60)) < 0.3
    np.save(tmp_path / "mask.npy", mask)
    out = json.loads(cli("bench", "--mask", tmp_path / "mask.npy", "--order", "s2", "--json").stdout)
    assert out["workload"]["mask"] == "file" and out["workload"]["heads"] == 2
    assert [row["order"] for row in out["results"] if row["impl"] == "wavealign-kernel"] == ["original", "s2"]


@pytest.mark.parametrize("flag,value", [("--iters", "0"), ("--warmup-ms", "nan"), ("--warmup-ms", "-1"),
                                        ("--head-dim", "96"), ("--l2", "hot"), ("--peers", "some"),
                                        ("--order", "sideways"), ("--precision", "fp8")])
def test_bench_refuses_bad_flags_naming_them(cli, flag, value):
    result = cli("bench", *SMALL, flag, value, check=False)
    assert result.returncode == 2 and flag in result.stderr, result.stderr


def test_bench_names_its_own_flags_and_keeps_the_recommendation(cli):
    # --order shuffled is compared with the original order; the recommendation is simulate's over its own orders,
    # so it never speaks of a --orders that bench does not have.
    out = cli("bench", *SMALL, "--order", "shuffled").stdout
    lines = out.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("wavealign-kernel")] == ["original", "shuffled"]
    assert "--orders" not in out and lines[-1].startswith("recommendation: ")


def test_bench_takes_the_profile_and_plan_cost_of_simulate(cli):
    statistics = json.loads(cli("bench", *SMALL, "--profile", "none", "--json").stdout)
    assert statistics["recommendation"]["source"] == "simulator"
    costly = json.loads(cli("bench", "--frames", "161", "--heads", "1", "--plan-cost", "1000", "--json").stdout)
    assert costly["recommendation"]["order"] == "original"
    for flag, value in (("--profile", "no-such-profile.json"), ("--plan-cost", "fast")):
        result = cli("bench", *SMALL, flag, value, check=False)
        assert result.returncode == 2 and flag in result.stderr, result.stderr


def test_bench_without_a_gpu_says_no_gpu_was_found(cli):
    device = cli("bench", *SMALL).stdout.splitlines()[1]
    assert "driver version is insufficient" not in device
    if device.startswith("device: none"):
        assert "no CUDA GPU found" in device or "built without its CUDA kernels" in device, device


def test_bench_quotes_the_simulated_speedup_of_its_table(cli, tmp_path):
    # One number for one quantity: the table's simulated speedup of the recommended order is the one the
    # recommendation attributes to the simulator; the profile's prediction is named as the profile's.
    np.save(tmp_path / "mask.npy", np.random.default_rng(4).random((1, 1200, 1200)) < 0.3)
    out = json.loads(cli("bench", "--mask", tmp_path / "mask.npy", "--json").stdout)
    recommendation = out["recommendation"]
    row = next(row for row in out["results"]
               if row["impl"] == "wavealign-kernel" and row["order"] == recommendation["order"] == "wavealign")
    assert row["predicted_speedup"] == pytest.approx(recommendation["simulated_speedup"])
    text = cli("bench", "--mask", tmp_path / "mask.npy").stdout.splitlines()
    cell = next(line for line in text if line.startswith("wavealign-kernel") and " wavealign " in line).split()[-1]
    assert f"the simulator's: {cell}" in text[-1] and "by the skip profile (NVIDIA H200" in text[-1]


def test_bench_int8_adds_the_8bit_rows_beside_the_bf16_ones(cli):
    out = json.loads(cli("bench", *SMALL, "--precision", "int8", "--json").stdout)
    kernel = [row["order"] for row in out["results"] if row["impl"] == "wavealign-kernel"]
    int8 = [row for row in out["results"] if row["impl"] == "wavealign-int8"]
    assert [row["order"] for row in int8] == kernel  # the same orders, each row measured or null
    for row in int8:
        assert row["predicted_ms"] is None  # the simulator models the bf16 kernel only
        if out["device"] is None:
            assert row["ms"] is None
        else:
            assert row["ms"] > 0 and row["tflops"] > 0
    text = cli("bench", *SMALL, "--precision", "int8").stdout
    assert any(line.startswith("wavealign-int8") for line in text.splitlines())
