"""Suite-wide rules of tests/python.

The packages that scripts/setup.sh installs for the tests (requirements-dev.txt: torch, hypothesis,
FlashAttention-4, diffusers) are required: when one is missing, the tests that need it skip as usual, but the
run fails at the end with a message naming the package, so a machine that was not set up cannot report "all
tests passed" with the torch integration untested. Set WAVEALIGN_TESTS_ALLOW_MISSING=1 to accept the skips
(for example to run the numpy-only part on purpose, or on a host without a package index).
GPU tests are not affected: without a CUDA device they skip with their reason and the run still passes.

Property-based tests run under one hypothesis profile: derandomized (the same examples on every run), no
example database written, no per-example deadline (a 2-core CI machine is noisy).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRED_PACKAGES = {"torch": "the torch integration, FlexAttention and torch.ops tests",
                     "hypothesis": "the property-based tests (test_properties.py)",
                     "flash_attn.cute": "FlashAttention-4's layout tests (test_fa4.py, pip package flash-attn-4)",
                     "diffusers": "the diffusers integration tests (test_diffusers.py)"}
ALLOW_MISSING = "WAVEALIGN_TESTS_ALLOW_MISSING"


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package that is not there, or fails to import
        return False


def missing_packages() -> dict[str, str]:
    return {name: what for name, what in REQUIRED_PACKAGES.items() if not _importable(name)}


def _missing_message(missing: dict[str, str]) -> str:
    names = ", ".join(missing)
    return (f"required test package(s) not installed: {names} ("
            + "; ".join(f"{name}: {what}" for name, what in missing.items())
            + f"). Run scripts/setup.sh, or set {ALLOW_MISSING}=1 to accept the skips.")


if importlib.util.find_spec("hypothesis") is not None:
    from hypothesis import HealthCheck, settings

    settings.register_profile("wavealign", derandomize=True, database=None, deadline=None, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile("wavealign")


def _enforced_missing() -> dict[str, str]:
    return {} if os.environ.get(ALLOW_MISSING, "") not in ("", "0") else missing_packages()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    missing = _enforced_missing()
    if missing:
        terminalreporter.write_sep("=", "FAILED: " + _missing_message(missing), red=True, bold=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if _enforced_missing() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
