"""End-to-end checks of the wavealign CLI: the documented calls, their JSON, files, and exit codes."""
import json
import os
import pathlib
import pty
import struct
import subprocess
import time

import numpy as np
import pytest

ORDERS = ["original", "s1", "s2", "wavealign", "shuffled"]
REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
H200_PROFILE = REPOSITORY / "bench" / "results" / "h200-skip-profile.json"


def test_documented_random_simulation_meets_the_targets(cli):
    result = cli("simulate", "--model", "wan2.1-14b", "--frames", "401", "--heads", "1", "--mask", "random",
                 "--density", "0.2", "--gpu", "h200", "--orders", ",".join(ORDERS), "--seed", "0", "--json")
    out = json.loads(result.stdout)
    workload = out["workload"]
    assert workload["tokens"] == 363600
    assert workload["q_blocks"] == workload["kv_blocks"] == 2841
    assert workload["heads"] == 1
    assert abs(workload["density"] - 0.2) < 0.01
    assert out["gpu"]["sms"] == 132
    rows = {row["order"]: row for row in out["results"]}
    assert list(rows) == ORDERS
    for row in rows.values():
        assert 0.0 <= row["l2_hit_ratio"] <= 1.0
        assert isinstance(row["hbm_read_bytes"], int) and row["hbm_read_bytes"] > 0
        assert row["plan_ms"] >= 0.0
    # Issue targets on this call: >= 1.5x the original hit ratio and <= 0.5x its HBM read bytes.
    assert rows["wavealign"]["l2_hit_ratio"] >= 1.5 * rows["original"]["l2_hit_ratio"]
    assert rows["wavealign"]["hbm_read_bytes"] <= 0.5 * rows["original"]["hbm_read_bytes"]


def test_documented_simulation_keeps_its_recorded_numbers(cli):
    # bench/results/cpu-simulator-sweep.json recorded this call's L2 hit ratios and HBM bytes; the skip decision
    # and the recommendation are added fields and change none of them.
    recorded = json.loads((REPOSITORY / "bench" / "results" / "cpu-simulator-sweep.json").read_text())["cases"]
    command = ("simulate --model wan2.1-14b --frames 401 --heads 1 --mask random --density 0.2 --gpu h200 --orders "
               "original,s1,s2,wavealign,shuffled --seed 0 --json --usable-l2 0.5 --jitter 0.25")
    cases = {case["order"]: case for case in recorded if case["command"] == command}
    assert sorted(cases) == sorted(ORDERS)
    rows = {row["order"]: row for row in json.loads(cli(*command.split()).stdout)["results"]}
    for order, case in cases.items():
        assert rows[order]["l2_hit_ratio"] == case["l2_hit_ratio"], order
        assert rows[order]["hbm_read_bytes"] == case["hbm_read_bytes"], order


def test_default_simulation_explains_its_columns_and_ends_with_a_recommendation(cli):
    lines = cli("simulate").stdout.strip().splitlines()
    table = "\n".join(lines)
    for order in ORDERS:
        assert any(line.startswith(order + " ") for line in lines), order
    assert "L2 hit" in table and "skip decision" in table
    legend = {line.split(":")[0].strip() for line in lines if line.startswith("  ") and ":" in line}
    assert {"pred. ms", "plan ms", "skip decision"} <= legend
    assert "max(C, M) + 0.23 x min(C, M)" in table and "the GPU planner's time on NVIDIA H200" in table
    # The target GPU's plan cost (about 0.12 ms per head on the H200), not this machine's CPU plan (milliseconds).
    wavealign = next(line for line in lines if line.startswith("wavealign "))
    assert wavealign.split()[5] == "reorder" and float(wavealign.split()[4]) < 0.5, wavealign
    last = lines[-1]
    assert last.startswith("recommendation: --order wavealign: predicted speedup over the original order ")
    assert "at 1 reuse" in last
    assert last.endswith("on your mask: wavealign reorder --mask MASK.npy --order wavealign --out perm.npy")


def test_readme_quotes_the_default_recommendation(cli):
    readme = (REPOSITORY / "README.md").read_text()
    quoted = readme.split("ends with one line to act on:")[1].split("```")[1]
    assert " ".join(quoted.split()) == cli("simulate").stdout.strip().splitlines()[-1]


def test_default_simulation_json_carries_the_decision_and_the_recommendation(cli):
    out = json.loads(cli("simulate", "--json").stdout)
    assert out["skip"]["gain"] == "profile" and out["skip"]["plan_cost"] == "profile"
    assert out["skip"]["profile"]["device"] == "NVIDIA H200"
    rows = {row["order"]: row for row in out["results"]}
    assert rows["original"]["plan_cost_ms"] == 0 and not rows["original"]["skip"]["skipped"]
    wavealign = rows["wavealign"]
    assert wavealign["skip"]["reordered_heads"] == 2 and not wavealign["skip"]["skipped"]
    heads = wavealign["skip"]["heads"]
    assert [head["code"] for head in heads] == ["none", "none"]
    assert wavealign["plan_cost_ms"] == pytest.approx(sum(head["plan_cost_ms"] for head in heads))
    for head in heads:
        assert head["gain_ms"] * out["skip"]["plan_reuse"] > head["plan_cost_ms"]
        assert "reordering can pay" in head["reason"] and "profile of NVIDIA H200" in head["reason"]
    recommendation = out["recommendation"]
    assert recommendation["order"] == "wavealign" and recommendation["source"] == "profile"
    assert recommendation["speedup"] > recommendation["speedup_with_plan"] > 1
    assert recommendation["command"] == "wavealign reorder --mask MASK.npy --order wavealign --out perm.npy"


def skip_decision(cli, tokens, density, *extra):
    out = json.loads(cli("skip", "--tokens", tokens, "--density", repr(density), "--json", *extra).stdout)
    return out["decisions"][0]


@pytest.mark.parametrize("args", [[], ["--plan-reuse", "0.1"], ["--frames", "41"]])
def test_simulate_and_skip_decide_alike(cli, args):
    # For every head that passes the statistics, simulate and skip read one profile at one point: the same gain,
    # the same plan cost, the same decision (at 0.1 reuse both keep the original order, at 161 frames both
    # reorder). At 41 frames the K/V of a head fits in the L2: the statistics skip it, and the profile agrees.
    out = json.loads(cli("simulate", "--orders", "original,wavealign", "--json", *args).stdout)
    tokens = out["workload"]["tokens"]
    reuse = args[1:] if args[:1] == ["--plan-reuse"] else []
    wavealign = next(row for row in out["results"] if row["order"] == "wavealign")
    for head in wavealign["skip"]["heads"]:
        by_skip = skip_decision(cli, tokens, head["density"], *(["--plan-reuse", *reuse] if reuse else []))
        assert head["skipped"] == by_skip["skipped"], (head, by_skip)
        if head["code"] in ("none", "no-gain"):
            assert head["gain_ms"] == by_skip["gain_ms"] and head["plan_cost_ms"] == by_skip["plan_ms"]
            assert head["reason"].endswith(by_skip["reason"])
        else:
            assert head["code"] == "working-set-fits" and args == ["--frames", "41"]
    expected = "original" if args else "wavealign"
    assert out["recommendation"]["order"] == expected


def test_skip_reads_the_built_in_profile_of_the_gpu(cli):
    args = ["--tokens", "25200,147600,363600", "--density", "0.05,0.28,0.5", "--json"]
    built_in = json.loads(cli("skip", *args).stdout)
    from_file = json.loads(cli("skip", "--profile", H200_PROFILE, *args).stdout)
    assert built_in["decisions"] == from_file["decisions"]
    assert built_in["profile"] == "built-in bench/results/h200-skip-profile.json"
    result = cli("skip", "--gpu", "a40", "--tokens", "1000", "--density", "0.2", check=False)
    assert result.returncode == 2 and "--profile" in result.stderr and "a40" in result.stderr


def test_simulate_plan_cost_choices(cli):
    base = ["simulate", "--orders", "original,wavealign", "--json"]
    cpu = json.loads(cli(*base, "--plan-cost", "cpu").stdout)
    assert cpu["skip"]["plan_cost"] == "cpu" and cpu["skip"]["gain"] == "profile"
    cpu_row = cpu["results"][1]
    assert cpu_row["plan_cost_ms"] > 0 and "this machine's CPU plan" in cpu_row["skip"]["heads"][0]["reason"]
    fixed = json.loads(cli(*base, "--plan-cost", "1000").stdout)
    assert fixed["skip"]["plan_cost"] == "fixed" and fixed["skip"]["fixed_plan_cost_ms"] == 1000
    assert [head["plan_cost_ms"] for head in fixed["results"][1]["skip"]["heads"]] == [1000, 1000]
    assert fixed["results"][1]["skip"]["skipped"] and fixed["recommendation"]["order"] == "original"
    free = json.loads(cli(*base, "--plan-cost", "0").stdout)
    assert free["recommendation"]["speedup_with_plan"] == free["recommendation"]["speedup"]
    # Without a profile the statistics alone decide, as in the planners; the plan cost charged in the table is
    # then this machine's CPU plan.
    statistics = json.loads(cli(*base, "--profile", "none").stdout)
    assert statistics["skip"]["gain"] == "none" and statistics["skip"]["plan_cost"] == "cpu"
    assert statistics["skip"]["profile"] is None
    for head in statistics["results"][1]["skip"]["heads"]:
        assert head["reason"].endswith("decided by the statistics only (no predicted gain)") and head["gain_ms"] is None


def test_a_gpu_without_a_profile_says_so(cli):
    text = cli("simulate", "--gpu", "h100", "--orders", "original,wavealign").stdout
    assert "no skip profile for h100" in text and "this machine's CPU plan time" in text
    assert text.strip().splitlines()[-1].startswith("recommendation: ")
    out = json.loads(cli("simulate", "--gpu", "h100", "--orders", "original,wavealign", "--json").stdout)
    assert out["skip"]["gain"] == "none" and out["skip"]["plan_cost"] == "cpu"
    # A profile file stands in for the missing one, and the recommended command carries it.
    given = json.loads(cli("simulate", "--gpu", "h100", "--orders", "original,wavealign", "--profile", H200_PROFILE,
                           "--json").stdout)
    assert given["skip"]["gain"] == "profile" and given["skip"]["profile"]["origin"] == str(H200_PROFILE)
    assert f"--gpu h100" in given["recommendation"]["command"]
    assert f"--profile {H200_PROFILE}" in given["recommendation"]["command"]


def test_simulate_of_a_mask_file_recommends_the_command_for_that_file(cli, tmp_path):
    mask = write_mask(tmp_path / "m.npy", np.random.default_rng(3).random((1, 1200, 1200)) < 0.3)
    out = json.loads(cli("simulate", "--mask", mask, "--json").stdout)
    assert out["recommendation"]["order"] == "wavealign"
    assert out["recommendation"]["command"] == f"wavealign reorder --mask {mask} --order wavealign --out perm.npy"


def write_mask(path, mask):
    np.save(path, mask)
    return path


def test_reorder_writes_a_permutation_per_head(cli, tmp_path):
    rng = np.random.default_rng(0)
    mask = rng.random((2, 300, 280)) < 0.3
    masks = write_mask(tmp_path / "mask.npy", mask)
    perm_path = tmp_path / "perm.npy"
    result = cli("reorder", "--mask", masks, "--out", perm_path, "--order", "wavealign", "--wave-size", "32",
                 "--skip", "never", "--json")
    summary = json.loads(result.stdout)
    assert summary["heads"] == 2 and summary["q_blocks"] == 300 and summary["wave_size"] == 32
    perm = np.load(perm_path)
    assert perm.dtype == np.int32 and perm.shape == (2, 300)
    for h in range(2):
        assert sorted(perm[h]) == list(range(300))
        nnz = mask[h].sum(axis=1)[perm[h]]
        for start in range(0, 300, 32):
            wave = nnz[start:start + 32]
            assert all(wave[k] >= wave[k + 1] for k in range(len(wave) - 1))


def test_reorder_skips_by_default_where_reordering_cannot_pay(cli, tmp_path):
    # 280 KV blocks x 64 KiB = 17.5 MiB fit in the H200's usable 30 MiB: the adaptive skip (the default) keeps the
    # original order; --skip never reorders.
    masks = write_mask(tmp_path / "mask.npy", np.random.default_rng(0).random((2, 300, 280)) < 0.3)
    auto = json.loads(cli("reorder", "--mask", masks, "--out", tmp_path / "auto.npy", "--json").stdout)
    assert auto["skip"] == "auto" and auto["skipped_heads"] == 2
    assert [head["code"] for head in auto["head_plans"]] == ["working-set-fits"] * 2
    assert (np.load(tmp_path / "auto.npy") == np.arange(300)).all()
    never = json.loads(cli("reorder", "--mask", masks, "--out", tmp_path / "never.npy", "--skip", "never",
                           "--json").stdout)
    assert never["skipped_heads"] == 0 and not (np.load(tmp_path / "never.npy") == np.arange(300)).all()
    text = cli("reorder", "--mask", masks, "--out", tmp_path / "p.npy").stdout
    assert "2 head(s) kept the original order" in text and "fits in the usable L2" in text


def test_reorder_decides_with_the_built_in_profile(cli, tmp_path):
    # 1,200 x 1,200 blocks at density 0.3 pass the statistics; the profile of the H200 read at 153,600 tokens
    # pays for the plan at 1 reuse and not at 0.01.
    masks = write_mask(tmp_path / "mask.npy", np.random.default_rng(4).random((1, 1200, 1200)) < 0.3)
    paid = json.loads(cli("reorder", "--mask", masks, "--out", tmp_path / "p.npy", "--json").stdout)
    assert paid["profile"] == "built-in bench/results/h200-skip-profile.json" and paid["skipped_heads"] == 0
    assert "profile of NVIDIA H200 at L = 153600 tokens" in paid["head_plans"][0]["reason"]
    rare = json.loads(cli("reorder", "--mask", masks, "--out", tmp_path / "p.npy", "--plan-reuse", "0.01",
                          "--json").stdout)
    assert rare["skipped_heads"] == 1 and rare["head_plans"][0]["code"] == "no-gain"
    short = json.loads(cli("reorder", "--mask", masks, "--out", tmp_path / "p.npy", "--tokens", "25200",
                           "--json").stdout)
    assert short["head_plans"][0]["code"] == "no-gain" and "L = 25200 tokens" in short["head_plans"][0]["reason"]
    file = json.loads(cli("reorder", "--mask", masks, "--out", tmp_path / "p.npy", "--profile", H200_PROFILE,
                          "--json").stdout)
    assert file["head_plans"][0]["reason"] == paid["head_plans"][0]["reason"]


def test_reorder_accepts_a_single_head_uint8_mask(cli, tmp_path):
    mask = (np.random.default_rng(1).random((64, 64)) < 0.5).astype(np.uint8)
    cli("reorder", "--mask", write_mask(tmp_path / "m.npy", mask), "--out", tmp_path / "p.npy")
    assert np.load(tmp_path / "p.npy").shape == (1, 64)


def test_simulate_takes_a_mask_file(cli, tmp_path):
    mask = np.random.default_rng(2).random((1, 700, 700)) < 0.2
    out = json.loads(cli("simulate", "--mask", write_mask(tmp_path / "m.npy", mask), "--orders",
                         "original,wavealign", "--json").stdout)
    assert out["workload"]["q_blocks"] == 700
    assert [row["order"] for row in out["results"]] == ["original", "wavealign"]


def test_generate_then_viz_writes_a_png(cli, tmp_path):
    mask_path = tmp_path / "video.npy"
    cli("generate", "--frames", "81", "--heads", "1", "--mask", "video", "--density", "0.3", "--out", mask_path)
    mask = np.load(mask_path)
    assert mask.dtype == np.bool_ and mask.shape[0] == 1
    png_path = tmp_path / "mask.png"
    cli("viz", "--mask", mask_path, "--head", "0", "--out", png_path)
    data = png_path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > mask.shape[2] and height >= mask.shape[1]  # two panels side by side


@pytest.mark.parametrize("args, named", [
    (["simulate", "--density", "1.5"], "--density"),
    (["simulate", "--density", "nan"], "--density"),
    (["simulate", "--density", "0"], "--density"),
    (["simulate", "--orders", "original,zigzag"], "--orders"),
    (["simulate", "--gpu", "b200"], "--gpu"),
    (["simulate", "--model", "wan3"], "--model"),
    (["simulate", "--traversal", "zigzag"], "--traversal"),
    (["simulate", "--head-order", "random"], "--head-order"),
    (["simulate", "--cache-model", "lru"], "--cache-model"),
    (["simulate", "--frames", "400"], "--frames"),
    (["simulate", "--frames", "0"], "--frames"),
    (["simulate", "--frames", "1e3"], "--frames"),
    (["simulate", "--heads", "0"], "--heads"),
    (["simulate", "--heads", "41"], "--heads"),
    (["simulate", "--mask", "no-such-file.npy"], "--mask"),
    (["simulate", "--block", "96"], "--block"),
    (["simulate", "--block", "-64"], "--block"),
    (["simulate", "--seed", "-1"], "--seed"),
    (["simulate", "--seed", "18446744073709551616"], "--seed"),
    (["simulate", "--seed", "1.5"], "--seed"),
    (["simulate", "--wave-size", "-3"], "--wave-size"),
    (["simulate", "--wave-size", "99999999999"], "--wave-size"),
    (["simulate", "--iterations", "0"], "--iterations"),
    (["simulate", "--iterations", "1001"], "--iterations"),
    (["simulate", "--usable-l2", "7"], "--usable-l2"),
    (["simulate", "--usable-l2", "0"], "--usable-l2"),
    (["simulate", "--usable-l2", "inf"], "--usable-l2"),
    (["simulate", "--jitter", "nan"], "--jitter"),
    (["simulate", "--jitter", "1"], "--jitter"),
    (["simulate", "--jitter", "-0.1"], "--jitter"),
    (["simulate", "--plan-reuse", "-1"], "--plan-reuse"),
    (["simulate", "--plan-reuse", "0"], "--plan-reuse"),
    (["simulate", "--plan-reuse", "nan"], "--plan-reuse"),
    (["simulate", "--plan-reuse", "inf"], "--plan-reuse"),
    (["simulate", "--plan-cost", "fast"], "--plan-cost"),
    (["simulate", "--plan-cost", "-2"], "--plan-cost"),
    (["simulate", "--plan-cost", "nan"], "--plan-cost"),
    (["simulate", "--profile", "no-such-profile.json"], "--profile"),
    (["simulate", "--profile", "a40"], "--profile"),
    (["skip", "--tokens", "1000", "--density", "0.2", "--profile", "none"], "--profile"),
    (["generate", "--frames", "4497", "--out", "x.npy"], "--allow-large-output"),
    (["generate", "--mask", "file.npy", "--out", "x.npy"], "--mask"),
    (["generate", "--density", "-0.5", "--out", "x.npy"], "--density"),
    (["reorder", "--mask", "no-such-file.npy", "--out", "x.npy"], "--mask"),
    (["simulate", "--no-such-flag"], "--no-such-flag"),
    (["reorder"], "--mask"),
    (["skip", "--tokens", "1000", "--density", "0.2", "--heads", "0"], "--heads"),
    (["skip", "--tokens", "1000", "--density", "0.2", "--plan-cost-ms", "nan"], "--plan-cost-ms"),
    (["skip", "--tokens", "1000", "--density", "0.2", "--plan-reuse", "inf"], "--plan-reuse"),
    (["skip", "--tokens", "1000", "--density", "0.2", "--gpu", "b200"], "--gpu"),
])
def test_bad_arguments_exit_2_with_a_named_message(cli, args, named):
    result = cli(*args, check=False)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


@pytest.fixture
def small_mask(tmp_path):
    return write_mask(tmp_path / "small.npy", np.random.default_rng(5).random((2, 64, 64)) < 0.3)


@pytest.mark.parametrize("command, args, named", [
    ("reorder", ["--seed", "-1"], "--seed"),
    ("reorder", ["--seed", "18446744073709551616"], "--seed"),
    ("reorder", ["--wave-size", "-3"], "--wave-size"),
    ("reorder", ["--iterations", "0"], "--iterations"),
    ("reorder", ["--threads", "-2"], "--threads"),
    ("reorder", ["--plan-reuse", "nan"], "--plan-reuse"),
    ("reorder", ["--plan-reuse", "-1"], "--plan-reuse"),
    ("reorder", ["--tokens", "0"], "--tokens"),
    ("reorder", ["--block", "0"], "--block"),
    ("reorder", ["--skip", "sometimes"], "--skip"),
    ("reorder", ["--order", "zigzag"], "--order"),
    ("reorder", ["--gpu", "b200"], "--gpu"),
    ("reorder", ["--profile", "no-such-profile.json"], "--profile"),
    ("viz", ["--wave-size", "-3"], "--wave-size"),
    ("viz", ["--seed", "-1"], "--seed"),
    ("viz", ["--head", "-1"], "--head"),
    ("viz", ["--head", "2"], "--head"),
    ("viz", ["--max-pixels", "0"], "--max-pixels"),
    ("viz", ["--max-pixels", "8"], "--max-pixels"),
    ("viz", ["--order", "zigzag"], "--order"),
    ("viz", ["--gpu", "b200"], "--gpu"),
])
def test_bad_numbers_of_mask_commands_exit_2_with_the_flag(cli, tmp_path, small_mask, command, args, named):
    out = tmp_path / ("x.png" if command == "viz" else "x.npy")
    result = cli(command, "--mask", small_mask, "--out", out, *args, check=False)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr
    assert "'max_pixels'" not in result.stderr and "'config'" not in result.stderr
    assert not out.exists()


def test_viz_rejects_a_permutation_that_is_not_one(cli, tmp_path, small_mask):
    duplicated = np.tile(np.arange(64, dtype=np.int32), (2, 1))
    duplicated[0, 1] = 0
    np.save(tmp_path / "perm.npy", duplicated)
    result = cli("viz", "--mask", small_mask, "--perm", tmp_path / "perm.npy", "--out", tmp_path / "x.png", check=False)
    assert result.returncode == 2 and "--perm" in result.stderr, result.stderr


@pytest.mark.parametrize("shape", [(0, 5, 5), (2, 0, 5), (2, 5, 0), (0, 5)])
@pytest.mark.parametrize("command", ["reorder", "viz", "simulate"])
def test_masks_with_an_empty_dimension_exit_2(cli, tmp_path, shape, command):
    mask = write_mask(tmp_path / "empty.npy", np.zeros(shape, bool))
    out = tmp_path / ("x.png" if command == "viz" else "x.npy")
    args = ["--mask", mask] + ([] if command == "simulate" else ["--out", out])
    result = cli(command, *args, check=False)
    assert result.returncode == 2, result.stderr
    assert "--mask" in result.stderr and "empty dimension" in result.stderr and "empty.npy" in result.stderr


def test_malformed_mask_file_exits_2(cli, tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'")
    result = cli("reorder", "--mask", bad, "--out", tmp_path / "p.npy", check=False)
    assert result.returncode == 2
    assert "bad.npy" in result.stderr


def write_profile(path):
    """A 2 x 2 grid measured with 2 heads whose original kernel time per head is 1e-6 ms x d x L^2 (0.1, 0.5,
    1.6 and 8.0 ms), with relative gains 1 - wavealign / original of -0.1 / 0.3 at L = 1,000 and 0.4 / 0.6 at
    L = 4,000 (densities 0.1 / 0.5): per-head gains -0.01 / 0.15 and 0.64 / 4.8 ms; plan 0.25 ms per head
    everywhere."""
    relative = {(1000, 0.1): -0.1, (1000, 0.5): 0.3, (4000, 0.1): 0.4, (4000, 0.5): 0.6}
    points = []
    for (t, d), gain in relative.items():
        original = 2 * 1e-6 * d * t * t
        points.append({"tokens": t, "density": d, "mask": "video", "heads": 2, "original_ms": original,
                       "wavealign_ms": original * (1 - gain), "plan_ms": 0.5})
    path.write_text(json.dumps({"format": "wavealign-skip-profile", "version": 1, "device": "test GPU",
                                "commit": "abc", "date": "2026-11-29", "points": points}))
    return path


def test_skip_reads_the_profile_and_interpolates(cli, tmp_path):
    profile = write_profile(tmp_path / "profile.json")
    result = cli("skip", "--profile", profile, "--tokens", "1000,2000,4000", "--density", "0.1,0.3,0.5", "--json")
    report = json.loads(result.stdout)
    assert report["device"] == "test GPU"
    decisions = {(row["tokens"], row["density"]): row for row in report["decisions"]}
    assert len(decisions) == 9
    # Grid points give the measured per-head gains (original - wavealign) / heads.
    assert decisions[(1000, 0.1)]["gain_ms"] == pytest.approx(-0.1 * 0.1)
    assert decisions[(1000, 0.5)]["gain_ms"] == pytest.approx(0.3 * 0.5)
    assert decisions[(4000, 0.5)]["gain_ms"] == pytest.approx(0.6 * 8.0)
    # L = 2,000 is the midpoint in ln L, density 0.3 in density: the relative gain (-0.1 + 0.3 + 0.4 + 0.6) / 4
    # = 0.3 times the kernel time 1e-6 x 0.3 x 2000^2 = 1.2 ms, 0.36 ms (the absolute gains' mean would say
    # 1.395 ms).
    assert decisions[(2000, 0.3)]["gain_ms"] == pytest.approx(0.3 * 1e-6 * 0.3 * 2000 ** 2)
    assert all(row["plan_ms"] == pytest.approx(0.25) for row in decisions.values())
    assert decisions[(1000, 0.1)]["skipped"] and decisions[(1000, 0.5)]["skipped"]
    assert not decisions[(4000, 0.5)]["skipped"] and not decisions[(2000, 0.3)]["skipped"]
    assert "test GPU" in decisions[(2000, 0.3)]["reason"]
    # Half a call per plan halves the gain that pays for the plan: 0.36 x 0.5 < 0.25.
    halved = json.loads(cli("skip", "--profile", profile, "--tokens", "2000", "--density", "0.3",
                            "--plan-reuse", "0.5", "--json").stdout)
    assert halved["decisions"][0]["skipped"]
    # The printed gain covers --heads heads; the decision stays per head.
    four = json.loads(cli("skip", "--profile", profile, "--tokens", "4000", "--density", "0.5", "--heads", "4",
                          "--json").stdout)["decisions"][0]
    assert four["gain_ms"] == pytest.approx(4 * 4.8) and not four["skipped"]
    # Past the longest length the relative gain stays at the edge's and the kernel time grows with L^2.
    longer = json.loads(cli("skip", "--profile", profile, "--tokens", "8000", "--density", "0.5",
                            "--json").stdout)["decisions"][0]
    assert longer["gain_ms"] == pytest.approx(4 * 4.8)
    table = cli("skip", "--profile", profile, "--tokens", "1000", "--density", "0.1").stdout
    assert "skip" in table.splitlines()[-1]


@pytest.mark.parametrize("args, named", [
    (["--tokens", "1000", "--density", "1.5"], "--density"),
    (["--tokens", "1000", "--density", "0.2,nan"], "--density"),
    (["--tokens", "0", "--density", "0.2"], "--tokens"),
    (["--tokens", "1000,-5", "--density", "0.2"], "--tokens"),
    (["--tokens", "1000", "--density", "0.2", "--plan-reuse", "0"], "--plan-reuse"),
    (["--tokens", "1000", "--density", "0.2", "--plan-reuse", "nan"], "--plan-reuse"),
    (["--tokens", "1000", "--density", "0.2", "--plan-cost-ms", "-1"], "--plan-cost-ms"),
])
def test_skip_rejects_bad_queries(cli, tmp_path, args, named):
    profile = write_profile(tmp_path / "profile.json")
    result = cli("skip", "--profile", profile, *args, check=False)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


def test_skip_names_a_malformed_profile(cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "wavealign-skip-profile", "version": 1, "device": "x", "points": []}')
    result = cli("skip", "--profile", bad, "--tokens", "1000", "--density", "0.2", check=False)
    assert result.returncode == 2
    assert "bad.json" in result.stderr


# ---- one screen, one number ------------------------------------------------------------------------------------

def test_simulate_names_the_profile_gain_apart_from_the_simulated_rows(cli):
    # The shuffled order simulates slower than the original, yet the planners reorder it: with a profile they
    # compare the profile's measured WaveAlign gain for whichever order is asked. The column says it is the
    # profile's gain, and the legend says why a row's decision does not follow from its pred. ms.
    text = cli("simulate", "--frames", "401", "--mask", "random", "--density", "0.2").stdout
    rows = {line.split()[0]: line for line in text.splitlines() if line.split() and line.split()[0] in ORDERS}
    assert float(rows["shuffled"].split()[3]) > float(rows["original"].split()[3])
    assert "head 0: profile gain " in rows["shuffled"] and "predicted kernel gain" not in rows["shuffled"]
    assert "a row's decision does not follow from its pred. ms" in text


def write_partly_skipped_mask(path):
    """Heads 0 and 1: 1,200 x 1,200 blocks at density 0.3 (they pass the statistics and the H200 profile pays for
    them); head 2: every row the same 900 blocks (adjacent Jaccard 1: the statistics keep its original order)."""
    rng = np.random.default_rng(8)
    mask = rng.random((3, 1200, 1200)) < 0.3
    mask[2] = False
    mask[2][:, rng.permutation(1200)[:900]] = True
    return write_mask(path, mask)


def test_simulate_shows_the_row_skip_auto_runs_and_the_recommendation_quotes_it(cli, tmp_path):
    mask = write_partly_skipped_mask(tmp_path / "m.npy")
    args = ["simulate", "--mask", mask, "--orders", "original,wavealign"]
    lines = cli(*args).stdout.splitlines()
    row = next(line for line in lines if line.startswith("wavealign "))
    auto = next(line for line in lines if line.startswith("wavealign auto "))
    assert "reorder 2 of 3 heads; head 2 skips: adjacent rows" in row
    assert "what --skip auto runs: 2 heads in wavealign order, 1 in the original order" in auto
    plan_all, plan_auto = row.split()[4], auto.split()[5]
    assert float(plan_auto) < float(plan_all)
    last = lines[-1]
    assert last.startswith("recommendation: --order wavealign (2 of 3 heads reordered): ")
    assert f"with its {plan_auto} ms plan" in last and "(rows original and 'wavealign auto')" in last
    profile = next(line for line in lines if line.startswith("profile: NVIDIA H200"))
    # The JSON carries the same numbers: the simulator's speedup is the rows' pred. ms, the profile's its line's.
    out = json.loads(cli(*args, "--json").stdout)
    original, wavealign = out["results"]
    adaptive = wavealign["adaptive"]
    recommendation = out["recommendation"]
    assert f"{adaptive['plan_cost_ms']:.3f}" == plan_auto and f"{adaptive['predicted_kernel_ms']:.3f}" == auto.split()[4]
    assert recommendation["simulated_speedup"] == pytest.approx(
        original["predicted_kernel_ms"] / adaptive["predicted_kernel_ms"])
    assert f"the simulator's: {recommendation['simulated_speedup']:.3f}x" in last
    assert f"{recommendation['profile_original_ms']:.3f} ms in the original order" in profile
    assert f"{recommendation['profile_ms']:.3f} ms in the wavealign order" in profile
    assert recommendation["speedup"] == pytest.approx(recommendation["profile_original_ms"] / recommendation["profile_ms"])
    assert f"order {recommendation['speedup']:.3f}x (kernel)" in last


# ---- the skip decision: one profile rule, extrapolation marked ---------------------------------------------------

def test_reorder_takes_a_preset_name_or_none_as_its_profile(cli, tmp_path):
    masks = write_mask(tmp_path / "mask.npy", np.random.default_rng(4).random((1, 1200, 1200)) < 0.3)

    def reasons(*args):
        out = json.loads(cli("reorder", "--mask", masks, "--out", tmp_path / "p.npy", "--json", *args).stdout)
        return out["profile"], [head["reason"] for head in out["head_plans"]]

    origin, default = reasons()
    assert origin == "built-in bench/results/h200-skip-profile.json"
    assert reasons("--profile", "h200") == (origin, default)
    # Another preset's model (its usable L2) with the H200's profile: the same profile comparison.
    assert reasons("--gpu", "h100", "--profile", "h200")[1][0].split("; ")[1] == default[0].split("; ")[1]
    none_origin, statistics = reasons("--profile", "none")
    assert none_origin == "none" and statistics[0].endswith("decided by the statistics only (no predicted gain)")
    assert reasons("--gpu", "h100")[0] == "none (no built-in profile for h100)"
    refused = cli("reorder", "--mask", masks, "--out", tmp_path / "p.npy", "--profile", "h100", check=False)
    assert refused.returncode == 2 and "invalid argument '--profile': 'h100' has no built-in skip profile" in refused.stderr
    far = reasons("--tokens", "1000000")[1][0]
    assert "extrapolated: L above the measured 25200-363600 tokens" in far


def test_skip_marks_points_outside_the_profile_grid(cli):
    longest = 2 ** 63 - 1
    out = json.loads(cli("skip", "--tokens", f"{longest},147600,1000", "--density", "0.28,0.9", "--json").stdout)
    assert out["grid"] == {"min_tokens": 25200, "max_tokens": 363600, "min_density": 0.02, "max_density": 0.57}
    rows = {(row["tokens"], row["density"]): row for row in out["decisions"]}
    assert not rows[(147600, 0.28)]["extrapolated"] and rows[(147600, 0.28)]["extrapolation"] == ""
    assert rows[(147600, 0.9)]["extrapolation"] == "density above the measured 2.0-57.0%"
    assert rows[(1000, 0.28)]["extrapolation"] == "L below the measured 25200-363600 tokens"
    far = rows[(longest, 0.28)]
    assert far["extrapolated"] and far["extrapolation"] == "L above the measured 25200-363600 tokens"
    assert far["reason"].endswith("; extrapolated: L above the measured 25200-363600 tokens)")
    text = cli("skip", "--tokens", f"{longest},147600", "--density", "0.28").stdout.splitlines()
    assert text[1].endswith("extrapolated: L above the measured 25200-363600 tokens") and "e+27" in text[1]
    assert "extrapolated" not in text[2]
    assert text[-1].startswith("extrapolated: outside the profile's measured grid (L 25200-363600 tokens")
    inside = cli("skip", "--tokens", "147600", "--density", "0.28").stdout
    assert "extrapolated" not in inside


# ---- outputs: never over an input, confirmation above 1 GB, progress on a terminal --------------------------------

def test_an_output_that_is_an_input_is_refused(cli, tmp_path, small_mask):
    original = small_mask.read_bytes()
    np.save(tmp_path / "perm.npy", np.tile(np.arange(64, dtype=np.int32), (2, 1)))
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.npy").symlink_to(small_mask)
    cases = [
        (["reorder", "--mask", small_mask, "--out", small_mask], "--mask"),
        (["reorder", "--mask", small_mask, "--out", tmp_path / "sub" / ".." / small_mask.name], "--mask"),
        (["reorder", "--mask", small_mask, "--out", tmp_path / "link.npy"], "--mask"),
        (["viz", "--mask", small_mask, "--out", small_mask], "--mask"),
        (["viz", "--mask", small_mask, "--perm", tmp_path / "perm.npy", "--out", tmp_path / "perm.npy"], "--perm"),
    ]
    for args, named in cases:
        result = cli(*args, check=False)
        assert result.returncode == 2, (args, result.stderr)
        assert f"invalid argument '--out': names the same file as {named}" in result.stderr, result.stderr
    assert small_mask.read_bytes() == original


def test_generate_refuses_an_output_over_1_gb_before_generating_it(cli, tmp_path):
    # 4,497 frames of Wan2.1 at 720p: 1,125 latent frames of 3,600 tokens, 31,641 blocks of 128 a side: one
    # head's bool mask is 1,001,152,881 bytes, just over the limit. Refused at once, nothing allocated or written.
    out = tmp_path / "big.npy"
    started = time.monotonic()
    result = cli("generate", "--frames", "4497", "--heads", "1", "--out", out, check=False)
    assert result.returncode == 2, result.stderr
    assert ("invalid argument '--out': would be 1.0 GB (1001152881 bytes: bool [1, 31641, 31641]); outputs over 1 GB "
            "(1000000000 bytes) are written only with --allow-large-output") in result.stderr
    assert not out.exists() and time.monotonic() - started < 10


def run_on_a_terminal(binary, *args):
    """Runs the CLI with stderr on a pseudo-terminal; returns (exit status, what it wrote to stderr)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen([str(binary), *map(str, args)], stdout=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    written = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the CLI closed its end
            break
        if not chunk:
            break
        written += chunk
    os.close(controller)
    return process.wait(timeout=600), written.decode()


def test_long_work_shows_progress_on_a_terminal_unless_quiet(request):
    # 6 heads of 2,841 x 2,841 blocks in 5 orders: several seconds of planning and simulating.
    binary = pathlib.Path(request.config.getoption("--wavealign")).resolve()
    work = ["simulate", "--frames", "401", "--heads", "6"]
    status, shown = run_on_a_terminal(binary, *work)
    assert status == 0
    assert "s] planning and simulating order " in shown and shown.endswith("\r\x1b[K")  # cleared at the end
    for quiet in (["--quiet", *work], [*work, "--quiet"], ["-q", *work]):
        status, shown = run_on_a_terminal(binary, *quiet)
        assert status == 0 and shown == "", quiet
    piped = subprocess.run([str(binary), *work], capture_output=True, text=True, timeout=600)
    assert piped.returncode == 0 and piped.stderr == ""  # not a terminal: no progress line
