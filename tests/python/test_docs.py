"""The Python examples of docs/python.md run as written."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def run_examples(include_torch: bool) -> int:
    """Runs the doc's python blocks in order in one namespace; returns how many ran."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    namespace: dict = {}
    ran = 0
    for block in blocks:
        if "torch" in block and not include_torch:
            continue
        exec(compile(block, str(DOC), "exec"), namespace)
        ran += 1
    return ran


def test_numpy_examples_run():
    assert run_examples(include_torch=False) >= 4


def test_torch_examples_run():
    pytest.importorskip("torch", reason="PyTorch is not installed: the torch examples of docs/python.md are skipped")
    assert run_examples(include_torch=True) >= 6
