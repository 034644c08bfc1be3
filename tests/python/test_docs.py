"""The docs hold: the Python examples of docs/python.md and docs/diffusers.md run as written (an excerpt of a file
is that file's text), every commit and result file the ledger docs/experiments.md cites exists in the
repository, and every file in bench/results follows the one schema."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "python.md"
DIFFUSERS_DOC = ROOT / "docs" / "diffusers.md"
EXCERPT = "# excerpt of "  # the first line of a python block that quotes a file of the repository
LEDGER = ROOT / "docs" / "experiments.md"
RESULTS = ROOT / "bench" / "results"
HASH = r"[0-9a-f]{7,40}"
RESULT_FILE = re.compile(rf"`(bench/results/[\w.-]+)(?:@({HASH}))?`")


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


def test_diffusers_routes_run_and_excerpts_quote_their_file():
    pytest.importorskip("torch", reason="PyTorch is not installed: docs/diffusers.md's examples are skipped")
    pytest.importorskip("diffusers", reason="diffusers is not installed: docs/diffusers.md's examples are skipped")
    namespace: dict = {}
    ran = excerpts = 0
    for block in re.findall(r"```python\n(.*?)```", DIFFUSERS_DOC.read_text(), re.S):
        if block.startswith(EXCERPT):
            path, _, text = block[len(EXCERPT):].partition("\n")
            assert text in (ROOT / path).read_text(), f"docs/diffusers.md quotes {path}, which no longer says:\n{text}"
            excerpts += 1
            continue
        exec(compile(block, str(DIFFUSERS_DOC), "exec"), namespace)
        ran += 1
    assert (ran, excerpts) == (2, 1)


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def require_git_checkout() -> None:
    try:
        inside = git("rev-parse", "--is-inside-work-tree").stdout.strip() == "true"
    except OSError:
        inside = False
    if not inside:
        pytest.skip("not a git checkout (an sdist, say): the ledger's commits cannot be looked up")


def is_commit(name: str) -> bool:
    return git("cat-file", "-e", f"{name}^{{commit}}").returncode == 0


def ledger_rows() -> list[list[str]]:
    """The cells of every data row of the ledger's tables (header and separator rows left out)."""
    rows = []
    for line in LEDGER.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells and cells[0] != "idea" and not set(cells[0]) <= {"-", " "}:
            rows.append(cells)
    return rows


def test_every_ledger_line_has_idea_commit_result_file_and_verdict():
    rows = ledger_rows()
    assert len(rows) >= 50
    for cells in rows:
        assert len(cells) == 4, f"docs/experiments.md: not idea | commit | result file | verdict: {cells}"
        idea, commit, result, verdict = cells
        assert idea and verdict, cells
        assert re.fullmatch(rf"`{HASH}`", commit), f"docs/experiments.md: the commit cell is not one hash: {cells}"
        assert result == "none" or RESULT_FILE.match(result), f"docs/experiments.md: result file: {cells}"


def test_every_commit_the_ledger_cites_exists():
    require_git_checkout()
    text = LEDGER.read_text()
    cited = set(re.findall(rf"`({HASH})`", text)) | set(re.findall(rf"@({HASH})`", text))
    missing = sorted(name for name in cited if not is_commit(name))
    assert not missing, f"docs/experiments.md cites commits this repository does not have: {missing}"


def test_every_result_file_the_ledger_cites_exists_where_it_says():
    require_git_checkout()
    for path, commit in RESULT_FILE.findall(LEDGER.read_text()):
        if commit:
            assert git("cat-file", "-e", f"{commit}:{path}").returncode == 0, f"{path} is not in commit {commit}"
        else:
            assert (ROOT / path).exists(), f"docs/experiments.md cites {path}, which is not in the tree"


def results_files() -> list[pathlib.Path]:
    files = sorted(RESULTS.glob("*.json"))
    if not files:
        pytest.skip("bench/results is not part of this tree (an sdist leaves it out)")
    return files


def test_every_results_file_follows_the_one_schema():
    sys.path.insert(0, str(ROOT / "bench"))
    import result_record
    for path in results_files():
        result_record.check(json.loads(path.read_text()), str(path.relative_to(ROOT)))


def commits_in(value, found: list[str]) -> list[str]:
    """Every "commit" member's text, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("commit") and isinstance(item, str):
                found.append(item)
            commits_in(item, found)
    elif isinstance(value, list):
        for item in value:
            commits_in(item, found)
    return found


def test_every_commit_a_results_file_names_exists():
    require_git_checkout()
    for path in results_files():
        names = {name for text in commits_in(json.loads(path.read_text()), [])
                 for name in re.findall(rf"\b{HASH}\b", text)}
        missing = sorted(name for name in names if not is_commit(name))
        assert not missing, f"{path.relative_to(ROOT)} names commits this repository does not have: {missing}"
