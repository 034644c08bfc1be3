"""Each case of bad_inputs.py gets the outcome and message it lists, and docs/bad-inputs.md shows that list."""

import importlib.util
import os
import pathlib

import pytest

import bad_inputs
import wavealign


def _skip_reason(case):
    if (case.run is None or case.needs == "cli") and not os.environ.get("WAVEALIGN_CLI"):
        return "the wavealign CLI is not built (WAVEALIGN_CLI unset)"
    if case.needs in ("torch", "fa4", "cuda") and importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed"
    if case.needs == "fa4" and importlib.util.find_spec("flash_attn") is None:
        return "FlashAttention-4 (flash-attn-4) is not installed"
    if case.needs == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device"
        if not wavealign._core.has_gpu_plan:
            return "wavealign was built without its CUDA code"
    return None


def _param(case):
    marks = [pytest.mark.xfail(strict=True, reason=f"fixed on branch {case.pending}")] if case.pending else []
    return pytest.param(case, marks=marks, id=f"{case.section}: {bad_inputs.shown(case.tried)}")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return bad_inputs.Env(tmp_path_factory.mktemp("bad-inputs"), os.environ.get("WAVEALIGN_CLI"))


@pytest.mark.parametrize("case", [_param(case) for case in bad_inputs.CASES])
def test_case_gets_its_outcome(case, env):
    reason = _skip_reason(case)
    if reason:
        pytest.skip(reason)
    gets, message = bad_inputs.outcome(case, env)
    expected = env.expand(case.message)
    assert (gets, expected in message) == (case.gets, True), f"got {gets}: {message!r}"


def test_the_doc_table_is_the_case_list():
    document = pathlib.Path(bad_inputs.DOC).read_text()
    assert document == bad_inputs.document_with_table(document), \
        "docs/bad-inputs.md is out of date: run python3 tests/python/bad_inputs.py --write-docs"


def test_cases_are_unique_and_named():
    tried = [(case.section, case.tried) for case in bad_inputs.CASES]
    assert len(tried) == len(set(tried))
    assert all(case.section in bad_inputs.SECTIONS for case in bad_inputs.CASES)
    assert all(case.message for case in bad_inputs.CASES)
