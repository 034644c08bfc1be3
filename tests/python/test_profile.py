"""wavealign.plan(profile=..., tokens=...): the calibrated skip profile (docs/skip-profile.md) from Python.

The profile here is synthetic: a 2 x 2 grid (L = 1024 and 65536 tokens x density 0.1 and 0.5, one head) where
the kernel time is c x density x L^2, the relative gain 1 - wavealign_ms / original_ms is 1% at density 0.1 and
50% at 0.5, and the plan costs 8 ms per head everywhere. The test masks have 512 x 1024 blocks of 128 tokens, so
they are read at L = 65536, a grid length: there the predicted gain is about 1 ms at density 0.15 and about
20 ms at 0.45 (3 ms and 22 ms if the absolute gain were interpolated instead of the relative one), against the
8 ms plan: the low-density heads are skipped and the dense ones reordered, with a margin of 2.5x or more either
way. At L = 1024 the gain is under 0.01 ms for every head. Both kinds of head pass every statistics test (64 MiB
working sets, adjacent Jaccard about 0.1-0.3), so the profile alone decides.
"""

import copy
import json
import os
import pathlib
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

import wavealign
from wavealign import _profile
from wa_testing import host_block

try:
    import torch
except ImportError:
    torch = None

DEVICE = "Synthetic GPU 9000"
LOW, HIGH = 0.15, 0.45
HEAD_DENSITIES = (LOW, HIGH, LOW, HIGH)
LOW_HEADS = [density == LOW for density in HEAD_DENSITIES]
Q_BLOCKS, KV_BLOCKS, BLOCK = 512, 1024, 128
TOKENS = Q_BLOCKS * BLOCK  # the default read point: q_blocks x kv_block


def synthetic_profile(plan_ms: float = 8.0, device: str = DEVICE) -> dict:
    kernel_ms_at_full_density = 100.0  # c x L^2 at L = 65536
    points = []
    for tokens in (1024, 65536):
        for density, relative_gain in ((0.1, 0.01), (0.5, 0.5)):
            original = kernel_ms_at_full_density * density * (tokens / 65536) ** 2
            points.append({"tokens": tokens, "density": density, "mask": "random", "heads": 1,
                           "original_ms": original, "wavealign_ms": original * (1 - relative_gain),
                           "plan_ms": plan_ms})
    return {"format": "wavealign-skip-profile", "version": 1, "device": device, "commit": "test",
            "date": "2026-01-01", "points": points}


def two_density_mask(seed: int = 3) -> np.ndarray:
    """bool [4, 512, 1024]: heads 0 and 2 keep 15% of their blocks, heads 1 and 3 keep 45%."""
    rng = np.random.default_rng(seed)
    densities = np.array(HEAD_DENSITIES)[:, None, None]
    return rng.random((len(HEAD_DENSITIES), Q_BLOCKS, KV_BLOCKS)) < densities


@pytest.fixture(scope="module")
def mask():
    return two_density_mask()


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "synthetic-profile.json"
    path.write_text(json.dumps(synthetic_profile(), indent=1))
    return path


def test_profile_skips_exactly_the_low_density_heads(mask):
    plan = wavealign.plan(mask, skip="auto", profile=synthetic_profile())
    assert plan.skipped == LOW_HEADS
    assert plan.stats["skipped_heads"] == 2
    for h, low in enumerate(LOW_HEADS):
        assert DEVICE in plan.reason[h] and f"L = {TOKENS} tokens" in plan.reason[h]
        if low:
            assert "<= plan cost 8.000 ms" in plan.reason[h]
            assert np.array_equal(plan.permutation[h], np.arange(Q_BLOCKS))
        else:
            assert "reordering can pay" in plan.reason[h] and "> plan cost 8.000 ms" in plan.reason[h]
            assert not np.array_equal(plan.permutation[h], np.arange(Q_BLOCKS))
    # A skipped head is decided before its plan: no plan time.
    assert all(plan.stats["plan_ms"][h] == 0 for h, low in enumerate(LOW_HEADS) if low)


def test_profile_decisions_follow_plan_reuse_and_the_plan_cost(mask):
    reused = wavealign.plan(mask, skip="auto", profile=synthetic_profile(), plan_reuse=1e6)
    assert reused.skipped == [False] * 4
    assert all("x 1000000 reuse >" in reason for reason in reused.reason)
    free = wavealign.plan(mask, skip="auto", profile=synthetic_profile(plan_ms=0.0))
    assert free.skipped == [False] * 4
    costly = wavealign.plan(mask, skip="auto", profile=synthetic_profile(plan_ms=1e4))
    assert costly.skipped == [True] * 4
    # Reordered heads get the plan of skip="never".
    never = wavealign.plan(mask, skip="never")
    assert np.array_equal(reused.permutation, never.permutation)


def test_tokens_sets_the_sequence_length_the_profile_is_read_at(mask):
    short = wavealign.plan(mask, skip="auto", profile=synthetic_profile(), tokens=1024)
    assert short.skipped == [True] * 4
    assert all("L = 1024 tokens" in reason for reason in short.reason)
    explicit = wavealign.plan(mask, skip="auto", profile=synthetic_profile(), tokens=TOKENS)
    default = wavealign.plan(mask, skip="auto", profile=synthetic_profile(), tokens=0)
    assert explicit.skipped == default.skipped == LOW_HEADS
    assert explicit.reason == default.reason


def test_dict_json_text_and_path_give_the_same_plan(mask, profile_file):
    data = synthetic_profile()
    plans = [wavealign.plan(mask, skip="auto", profile=source)
             for source in (data, json.dumps(data), str(profile_file), profile_file)]
    for plan in plans[1:]:
        assert plan.skipped == plans[0].skipped == LOW_HEADS
        assert plan.reason == plans[0].reason
        assert np.array_equal(plan.permutation, plans[0].permutation)


def test_other_skip_policies_check_the_profile_but_ignore_it(mask):
    never = wavealign.plan(mask, skip="never")
    with_profile = wavealign.plan(mask, skip="never", profile=synthetic_profile(plan_ms=1e4))
    assert with_profile.skipped == [False] * 4 and with_profile.reason == ["skip policy 'never'"] * 4
    assert np.array_equal(with_profile.permutation, never.permutation)
    always = wavealign.plan(mask, skip="always", profile=synthetic_profile(plan_ms=0.0))
    assert always.skipped == [True] * 4
    bad = synthetic_profile()
    del bad["device"]
    for skip in ("never", "always"):
        with pytest.raises(ValueError, match=r"invalid argument 'profile: device'"):
            wavealign.plan(mask[:, :8, :8], skip=skip, profile=bad)


def test_profile_none_decides_by_the_statistics_alone(mask):
    # No profile: a head that passes the statistics is reordered, as the GPU planner decides without one; no
    # simulated gain and no measured plan time enter the decision.
    plan = wavealign.plan(mask, skip="auto", profile="none")
    assert plan.skipped == [False] * 4
    assert all(reason.endswith("decided by the statistics only (no predicted gain)") for reason in plan.reason)
    assert _profile.resolve("none").core is None and _profile.resolve("none").key == "none"


REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
H200_FILE = REPOSITORY / "bench" / "results" / "h200-skip-profile.json"


def test_the_default_is_the_built_in_profile_of_the_gpu(mask):
    default = wavealign.plan(mask, skip="auto")
    named = wavealign.plan(mask, skip="auto", profile="h200")
    from_file = wavealign.plan(mask, skip="auto", profile=H200_FILE)
    assert default.skipped == named.skipped == from_file.skipped
    assert default.reason == named.reason == from_file.reason
    assert all("profile of NVIDIA H200" in reason for reason in default.reason)
    built_in = _profile.resolve(None, "h200")
    assert built_in is _profile.resolve("h200") and built_in.origin == "built-in bench/results/h200-skip-profile.json"
    assert built_in.key == _profile.resolve(H200_FILE).key  # the package carries the repository's profile
    # A preset without a built-in profile: no profile by default, an error when asked for by name.
    assert all("statistics only" in reason for reason in wavealign.plan(mask, skip="auto", gpu="h100").reason)
    with pytest.raises(ValueError, match=r"^invalid argument 'profile': 'h100' has no built-in skip profile"):
        wavealign.plan(mask, profile="h100")
    # Integrations parse their profile before the preset is known: the default waits for plan()'s gpu.
    assert _profile.resolve(None) is None and _profile.resolve("") is None


def test_the_decision_is_the_same_in_every_run(mask):
    # Neither the default profile nor the statistics read a clock: ten plans, ten identical decisions.
    for profile in (None, "none"):
        reasons = {tuple(wavealign.plan(mask, skip="auto", profile=profile).reason) for _ in range(10)}
        assert len(reasons) == 1, reasons


def test_plan_decides_as_the_cli_reorder_does(tmp_path):
    # The reproduction: `wavealign generate` then `reorder` against wavealign.plan() with default
    # arguments. Both take the built-in H200 profile: the same heads reordered for the same reasons.
    cli = os.environ.get("WAVEALIGN_CLI")
    if not cli or not pathlib.Path(cli).exists():
        pytest.skip("the wavealign CLI is not built (WAVEALIGN_CLI unset)")
    mask_file, perm_file = tmp_path / "mask.npy", tmp_path / "p.npy"
    subprocess.run([cli, "generate", "--frames", "401", "--heads", "4", "--mask", "video", "--density", "0.28",
                    "--out", str(mask_file)], check=True, capture_output=True, timeout=300)
    result = subprocess.run([cli, "reorder", "--mask", str(mask_file), "--out", str(perm_file), "--json"],
                            check=True, capture_output=True, text=True, timeout=300)
    reordered = json.loads(result.stdout)
    plan = wavealign.plan(np.load(mask_file))
    assert plan.skipped == [head["skipped"] for head in reordered["head_plans"]] == [False] * 4
    assert plan.reason == [head["reason"] for head in reordered["head_plans"]]
    assert np.array_equal(plan.permutation, np.load(perm_file))


def test_flex_mask_reads_the_profile_at_its_query_length(mask):
    counts = mask.sum(-1).astype(np.int32)[None]
    indices = np.argsort(~mask, axis=-1, kind="stable").astype(np.int32)[None]
    q_len = TOKENS - 100  # a partial last query block: 512 blocks, 65436 tokens
    flex = SimpleNamespace(kv_num_blocks=counts, kv_indices=indices, BLOCK_SIZE=(BLOCK, BLOCK),
                           seq_lengths=(q_len, KV_BLOCKS * BLOCK))
    plan = wavealign.plan(flex, skip="auto", profile=synthetic_profile())
    assert plan.skipped == LOW_HEADS
    assert all(f"L = {q_len} tokens" in reason for reason in plan.reason)
    overridden = wavealign.plan(flex, skip="auto", profile=synthetic_profile(), tokens=1024)
    assert overridden.skipped == [True] * 4


def test_csr_mask_takes_the_profile_too(mask):
    rows = mask.reshape(-1, KV_BLOCKS)
    row_ptr = np.concatenate([[0], np.cumsum(rows.sum(1))]).astype(np.int64)
    col_idx = np.nonzero(rows)[1].astype(np.int32)
    plan = wavealign.plan((row_ptr, col_idx), heads=4, kv_blocks=KV_BLOCKS, skip="auto",
                          profile=synthetic_profile())
    assert plan.skipped == LOW_HEADS


def _bad_profiles():
    missing_cell = synthetic_profile()
    missing_cell["points"].pop()
    negative = synthetic_profile()
    negative["points"][2]["original_ms"] = -1.0
    repeated = synthetic_profile()
    repeated["points"][1] = copy.deepcopy(repeated["points"][0])
    return [
        (missing_cell, r"'profile: points'"),
        (negative, r"'profile: points\[2\]\.original_ms'"),
        (repeated, r"'profile: points\[1\]'"),
        (dict(synthetic_profile(), version=2), r"'profile: version'"),
        ("{not json", r"'profile: json'"),
        ("[1, 2]", r"'profile: json'"),
        ({"format": "wavealign-skip-profile"}, r"'profile: version'"),
        ({"bad": {1, 2}}, r"'profile'.*JSON-serializable"),
        (42, r"'profile': must be None, 'none', a GPU preset's name, a path, JSON text or a dict"),
    ]


@pytest.mark.parametrize("bad,match", _bad_profiles())
def test_malformed_profiles_raise_value_error_naming_profile(bad, match):
    with pytest.raises(ValueError, match=r"^invalid argument " + match):
        wavealign.plan(np.ones((1, 4, 4), bool), skip="auto", profile=bad)


def test_bad_profile_files_raise_value_error_naming_profile(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(ValueError, match=r"^invalid argument 'profile: .*missing\.json': cannot be opened"):
        wavealign.plan(np.ones((1, 4, 4), bool), profile=missing)
    malformed = tmp_path / "malformed.json"
    data = synthetic_profile()
    data["points"][0]["plan_ms"] = "fast"
    malformed.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"^invalid argument 'profile: .*malformed\.json: points\[0\]\.plan_ms'"):
        wavealign.plan(np.ones((1, 4, 4), bool), profile=str(malformed))


@pytest.mark.parametrize("tokens,match", [(-1, "must be >= 0"), (1.5, "must be an int"), (True, "must be an int")])
def test_bad_tokens_raise_value_error(tokens, match):
    with pytest.raises(ValueError, match=rf"^invalid argument 'tokens': {match}"):
        wavealign.plan(np.ones((1, 4, 4), bool), profile=synthetic_profile(), tokens=tokens)


def test_a_profile_is_parsed_once_per_file_version(mask, profile_file, monkeypatch):
    _profile.clear_cache()
    calls = []
    parse = wavealign._core.skip_profile_from_file
    monkeypatch.setattr(wavealign._core, "skip_profile_from_file", lambda path: calls.append(path) or parse(path))
    first = wavealign.plan(mask, skip="auto", profile=profile_file)
    second = wavealign.plan(mask, skip="auto", profile=str(profile_file))
    assert len(calls) == 1 and first.skipped == second.skipped == LOW_HEADS
    # Rewritten in place (a new modification time): read again, and the new numbers decide.
    profile_file.write_text(json.dumps(synthetic_profile(plan_ms=0.0)))
    stat = profile_file.stat()
    os.utime(profile_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    third = wavealign.plan(mask, skip="auto", profile=profile_file)
    assert len(calls) == 2 and third.skipped == [False] * 4


def test_parsed_profiles_are_keyed_by_content():
    _profile.clear_cache()
    data = synthetic_profile()
    from_dict = _profile.resolve(data)
    assert _profile.resolve(copy.deepcopy(data)) is from_dict            # the same text: cached
    assert _profile.resolve(json.dumps(data, indent=2)).key == from_dict.key  # other text, same profile
    assert _profile.resolve(synthetic_profile(plan_ms=1.0)).key != from_dict.key
    assert _profile.resolve(synthetic_profile(device="Other GPU")).key != from_dict.key
    assert from_dict.device == DEVICE and from_dict.core.points == 4
    assert _profile.resolve(None) is None


@pytest.mark.skipif(not wavealign._core.has_gpu_plan, reason="wavealign was built without its CUDA code")
def test_gpu_planner_decodes_profile_decisions_like_the_cpu_plan(mask):
    # kNoGain (6) with a profile: the decoder states the profile's numbers, as the CPU plan does (no device
    # needed: the planner's constructor and decode() run on the host).
    cpu = wavealign.plan(mask, skip="auto", profile=synthetic_profile(), wave_size=132)
    layout = np.dtype([("nnz", "<i8"), ("density", "<f8"), ("kv_working_set_bytes", "<i8"),
                       ("usable_l2_bytes", "<i8"), ("adjacent_jaccard", "<f8"), ("wave_working_set_bytes", "<i8")])
    stats = np.zeros(4, layout)
    for name in layout.names:
        stats[name] = cpu.stats[name]
    profile = _profile.resolve(synthetic_profile())
    planner = wavealign._core.GpuPlanner(4, Q_BLOCKS, KV_BLOCKS, "wavealign", "h200", 132, 10, 0, "auto", 128, 2,
                                         BLOCK, 1.0, profile.core, 0)
    assert planner.tokens == TOKENS and planner.has_profile
    flags = np.array([6 if low else 0 for low in LOW_HEADS], np.uint8)
    _, skipped, reasons, _ = planner.decode(host_block(stats, flags))
    assert skipped == cpu.skipped == LOW_HEADS
    assert reasons == cpu.reason
    with pytest.raises(ValueError, match=r"invalid argument 'tokens'"):
        wavealign._core.GpuPlanner(4, Q_BLOCKS, KV_BLOCKS, "wavealign", "h200", 132, 10, 0, "auto", 128, 2,
                                   BLOCK, 1.0, profile.core, -1)


# ---- the GPU planner on CUDA masks (skipped without torch, a CUDA device or the package's CUDA code) ---------

def _cuda_skip_reason() -> str | None:
    if torch is None:
        return "PyTorch is not installed: the GPU tests are skipped"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not wavealign._core.has_gpu_plan:
        return "wavealign was built without its CUDA code (no GPU plan)"
    return None


needs_cuda = pytest.mark.skipif(_cuda_skip_reason() is not None, reason=_cuda_skip_reason() or "")


@needs_cuda
@pytest.mark.parametrize("options", [{}, {"plan_reuse": 1e6}, {"tokens": 1024}, {"wave_size": 64}])
def test_gpu_plan_skips_the_heads_the_cpu_plan_skips(mask, options):
    data = synthetic_profile()
    cpu = wavealign.plan(mask, skip="auto", profile=data, **options)
    gpu = wavealign.plan(torch.from_numpy(mask).cuda(), skip="auto", profile=data, **options)
    assert gpu.planner == "gpu" and cpu.planner == "cpu"
    assert gpu.skipped == cpu.skipped
    assert gpu.reason == cpu.reason
    permutation = gpu.permutation.cpu().numpy()
    for h, skipped in enumerate(cpu.skipped):
        if skipped:
            assert np.array_equal(permutation[h], np.arange(Q_BLOCKS))


@needs_cuda
def test_gpu_planner_cache_tells_profiles_apart(mask):
    device_mask = torch.from_numpy(mask).cuda()
    costly = wavealign.plan(device_mask, skip="auto", profile=synthetic_profile())
    free = wavealign.plan(device_mask, skip="auto", profile=synthetic_profile(plan_ms=0.0))
    none = wavealign.plan(device_mask, skip="auto", profile="none")
    again = wavealign.plan(device_mask, skip="auto", profile=synthetic_profile())
    assert costly.skipped == again.skipped == LOW_HEADS
    assert free.skipped == [False] * 4
    assert none.skipped == [False] * 4 and all("statistics only" in reason for reason in none.reason)


@needs_cuda
def test_gpu_plan_of_a_flex_mask_reads_the_profile_at_its_query_length(mask):
    counts = torch.from_numpy(mask.sum(-1).astype(np.int32)[None]).cuda()
    indices = torch.from_numpy(np.argsort(~mask, axis=-1, kind="stable").astype(np.int32)[None]).cuda()
    q_len = TOKENS - 100
    flex = SimpleNamespace(kv_num_blocks=counts, kv_indices=indices, full_kv_num_blocks=None,
                           full_kv_indices=None, BLOCK_SIZE=(BLOCK, BLOCK), seq_lengths=(q_len, KV_BLOCKS * BLOCK))
    plan = wavealign.plan(flex, skip="auto", profile=synthetic_profile())
    assert plan.planner == "gpu" and plan.skipped == LOW_HEADS
    assert all(f"L = {q_len} tokens" in reason for reason in plan.reason)


@needs_cuda
def test_gpu_plan_rejects_a_malformed_profile_before_planning(mask):
    bad = synthetic_profile()
    bad["points"].pop()
    with pytest.raises(ValueError, match=r"invalid argument 'profile: points'"):
        wavealign.plan(torch.from_numpy(mask).cuda(), skip="auto", profile=bad)


def test_profile_file_paths_are_accepted_as_pathlike(profile_file):
    assert isinstance(profile_file, pathlib.Path)
    plan = wavealign.plan(np.ones((1, 4, 4), bool), skip="auto", profile=profile_file)
    assert plan.skipped == [True]  # 4 x 4 blocks fit in L2: the statistics skip before the profile is read
