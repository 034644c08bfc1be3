"""End-to-end checks of `wavealign mask`: the mask file, the JSON summary, Q/K files, force-dense and the flag
errors (exit status 2, the message names the flag). The CPU reference runs (--device cpu), so these pass on
any machine."""
import json

import numpy as np


def write_qk(tmp_path, heads=2, tokens=300, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, tokens, dim)).astype(np.float32)
    k = (q + 0.5 * rng.standard_normal(q.shape)).astype(np.float32)
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "k.npy", k)
    return tmp_path / "q.npy", tmp_path / "k.npy"


def test_synthetic_workload_mask_and_summary(cli, tmp_path):
    out = tmp_path / "mask.npy"
    result = cli("mask", "--method", "sparge", "--heads", "1", "--frames", "5", "--simthreshd1", "-1",
                 "--device", "cpu", "--out", out, "--json")
    summary = json.loads(result.stdout)
    assert summary["method"] == "sparge" and summary["device"] == "cpu"
    assert summary["inputs"]["tokens"] == 7200 and summary["inputs"]["head_dim"] == 128
    assert summary["q_blocks"] == summary["kv_blocks"] == 57
    mask = np.load(out)
    assert mask.dtype == np.bool_ and mask.shape == (1, 57, 57)
    assert abs(mask.mean() - summary["density"]) < 1e-12
    assert 0 < summary["density"] < 1


def test_qk_files_every_method_deterministic(cli, tmp_path):
    q, k = write_qk(tmp_path)
    for method in ("xattention", "sparge", "minference", "flexprefill"):
        first, second = tmp_path / f"{method}_1.npy", tmp_path / f"{method}_2.npy"
        for out in (first, second):
            cli("mask", "--method", method, "--q", q, "--k", k, "--block", "64", "--device", "cpu", "--out", out)
        a, b = np.load(first), np.load(second)
        assert a.shape == (2, 5, 5)
        assert (a == b).all(), method
        assert a.any(), method


def test_force_dense_and_block_size(cli, tmp_path):
    q, k = write_qk(tmp_path, tokens=200)
    out = tmp_path / "dense.npy"
    cli("mask", "--method", "xattention", "--q", q, "--k", k, "--block", "64", "--force-dense", "--device", "cpu",
        "--out", out)
    mask = np.load(out)
    assert mask.shape == (2, 4, 4) and mask.all()


def test_per_head_thresholds(cli, tmp_path):
    q, k = write_qk(tmp_path, tokens=512)
    low, high = tmp_path / "low.npy", tmp_path / "high.npy"
    cli("mask", "--method", "xattention", "--q", q, "--k", k, "--block", "64", "--threshold", "0.3,0.99",
        "--stride", "16", "--no-first-kblock", "--device", "cpu", "--out", low)
    mask = np.load(low)
    assert mask[0].sum() < mask[1].sum()


def test_int8_estimate_flag(cli, tmp_path):
    q, k = write_qk(tmp_path, tokens=1024)
    exact, int8 = tmp_path / "exact.npy", tmp_path / "int8.npy"
    cli("mask", "--method", "xattention", "--q", q, "--k", k, "--block", "64", "--threshold", "0.8",
        "--device", "cpu", "--out", exact)
    cli("mask", "--method", "xattention", "--q", q, "--k", k, "--block", "64", "--threshold", "0.8",
        "--int8-estimate", "--device", "cpu", "--out", int8)
    a, b = np.load(exact), np.load(int8)
    assert 0 < b.mean() < 1 and np.logical_and(a, b).sum() / np.logical_or(a, b).sum() >= 0.9
    result = cli("mask", "--method", "sparge", "--int8-estimate", "--q", q, "--k", k, "--device", "cpu",
                 "--out", tmp_path / "bad.npy", check=False)
    assert result.returncode == 2 and "'--int8-estimate'" in result.stderr and "xattention" in result.stderr


def test_table1_preset_and_given_flags_win(cli, tmp_path):
    q, k = write_qk(tmp_path, tokens=512)
    masks = {}
    for name, flags in {"preset": ["--preset", "table1"], "explicit": ["--gamma", "0.965"],
                        "override": ["--preset", "table1", "--gamma", "0.6"], "default": []}.items():
        out = tmp_path / f"{name}.npy"
        result = cli("mask", "--method", "flexprefill", "--q", q, "--k", k, "--block", "64", "--device", "cpu",
                     "--out", out, "--json", *flags)
        masks[name] = np.load(out)
        assert json.loads(result.stdout)["preset"] == ("table1" if "--preset" in flags else "default")
    assert (masks["preset"] == masks["explicit"]).all() and (masks["override"] == masks["default"]).all()
    result = cli("mask", "--method", "flexprefill", "--preset", "paper", "--q", q, "--k", k, "--device", "cpu",
                 "--out", tmp_path / "bad.npy", check=False)
    assert result.returncode == 2 and "'--preset'" in result.stderr


def test_flag_errors_name_the_flag(cli, tmp_path):
    q, k = write_qk(tmp_path)
    out = tmp_path / "mask.npy"
    result = cli("mask", "--method", "sparge", "--threshold", "0.5", "--q", q, "--k", k, "--out", out, check=False)
    assert result.returncode == 2 and "'--threshold'" in result.stderr and "xattention" in result.stderr
    result = cli("mask", "--method", "xattention", "--stride", "3", "--q", q, "--k", k, "--device", "cpu",
                 "--out", out, check=False)
    assert result.returncode == 2 and "'--stride'" in result.stderr
    result = cli("mask", "--method", "flexprefill", "--gamma", "1.5", "--q", q, "--k", k, "--device", "cpu",
                 "--out", out, check=False)
    assert result.returncode == 2 and "'--gamma'" in result.stderr
    result = cli("mask", "--method", "nope", "--q", q, "--k", k, "--out", out, check=False)
    assert result.returncode == 2 and "'--method'" in result.stderr
    result = cli("mask", "--method", "sparge", "--q", q, "--out", out, check=False)
    assert result.returncode == 2 and "'--k'" in result.stderr
    np.save(tmp_path / "bad.npy", np.zeros((2, 3, 4, 5), np.float32))
    result = cli("mask", "--method", "sparge", "--q", tmp_path / "bad.npy", "--k", tmp_path / "bad.npy", "--out",
                 out, check=False)
    assert result.returncode == 2 and "'--q'" in result.stderr


def test_a_bad_q_or_k_file_is_named_by_its_flag(cli, tmp_path):
    q, k = write_qk(tmp_path)
    garbage = tmp_path / "extra.npy"
    garbage.write_bytes(b"not a .npy file")
    out = tmp_path / "mask.npy"
    for args, flag in (([garbage, "--k", k], "--q"), ([q, "--k", garbage], "--k"),
                       ([tmp_path / "missing.npy", "--k", k], "--q")):
        result = cli("mask", "--q", *args, "--device", "cpu", "--out", out, check=False)
        assert result.returncode == 2, result.stderr
        assert f"invalid argument '{flag}': " in result.stderr and "'--extra.npy'" not in result.stderr
    # A stray word after the flags is reported as it was written.
    stray = cli("mask", "--q", q, "--k", k, "extra.npy", "--device", "cpu", "--out", out, check=False)
    assert stray.returncode == 2 and "not expected: extra.npy" in stray.stderr
    assert not out.exists()


def test_an_output_over_1_gb_needs_confirmation(cli, tmp_path):
    # 506,000 tokens in blocks of 16 tokens: a bool [1, 31625, 31625] mask of 1,000,140,625 bytes, refused before
    # the method runs (the Q/K files are 2 MB each).
    q, k = write_qk(tmp_path, heads=1, tokens=506_000, dim=1)
    out = tmp_path / "mask.npy"
    result = cli("mask", "--method", "xattention", "--q", q, "--k", k, "--block", "16", "--device", "cpu",
                 "--out", out, check=False)
    assert result.returncode == 2, result.stderr
    assert "invalid argument '--out': would be 1.0 GB (1000140625 bytes: bool [1, 31625, 31625])" in result.stderr
    assert "--allow-large-output" in result.stderr and not out.exists()
