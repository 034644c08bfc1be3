import pathlib
import subprocess

import pytest


def pytest_addoption(parser):
    parser.addoption("--wavealign", action="store", default="build/wavealign", help="path of the CLI binary")


@pytest.fixture(scope="session")
def cli(request):
    binary = pathlib.Path(request.config.getoption("--wavealign")).resolve()
    if not binary.exists():
        pytest.fail(f"CLI binary not found: {binary}")

    def run(*args, check=True):
        result = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=600)
        if check and result.returncode != 0:
            raise AssertionError(f"wavealign {' '.join(map(str, args))} exited {result.returncode}:\n{result.stderr}")
        return result

    return run
