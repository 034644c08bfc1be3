"""End-to-end checks of the wavealign CLI: the documented calls, their JSON, files, and exit codes."""
import json
import struct

import numpy as np
import pytest

ORDERS = ["original", "s1", "s2", "wavealign", "shuffled"]


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


def test_default_simulation_prints_a_table(cli):
    result = cli("simulate")
    for order in ORDERS:
        assert order in result.stdout
    assert "L2 hit" in result.stdout and "skip decision" in result.stdout


def write_mask(path, mask):
    np.save(path, mask)
    return path


def test_reorder_writes_a_permutation_per_head(cli, tmp_path):
    rng = np.random.default_rng(0)
    mask = rng.random((2, 300, 280)) < 0.3
    masks = write_mask(tmp_path / "mask.npy", mask)
    perm_path = tmp_path / "perm.npy"
    result = cli("reorder", "--mask", masks, "--out", perm_path, "--order", "wavealign", "--wave-size", "32", "--json")
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
    (["simulate", "--orders", "original,zigzag"], "order"),
    (["simulate", "--gpu", "b200"], "gpu"),
    (["simulate", "--frames", "400"], "frames"),
    (["simulate", "--mask", "no-such-file.npy"], "--mask"),
    (["simulate", "--block", "96"], "--block"),
    (["reorder", "--mask", "no-such-file.npy", "--out", "x.npy"], "--mask"),
    (["simulate", "--no-such-flag"], "--no-such-flag"),
    (["reorder"], "--mask"),
])
def test_bad_arguments_exit_2_with_a_named_message(cli, args, named):
    result = cli(*args, check=False)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


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
    (["--tokens", "0", "--density", "0.2"], "--tokens"),
    (["--tokens", "1000", "--density", "0.2", "--plan-reuse", "0"], "--plan-reuse"),
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
