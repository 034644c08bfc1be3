"""The one schema of the files in bench/results: a JSON object whose first members say where its numbers come
from, then the records.

    {"device": ..., "commit": ..., "date": "YYYY-MM-DD", "command": ..., <records>}

`device` is the machine that measured, `commit` the code it ran (a short hash; a file merged from several calls
names each call's commit, and rows of such a file carry their own), `date` the day of the measurement, `command`
what reproduces it. A file holds the current record only; earlier measurements live in git, and
docs/experiments.md names the commit that still has them. Every collector that writes a results file builds it
with `make` and writes it with `write`, which refuse a record without these members.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import platform
import re
import subprocess

FIELDS = ("device", "commit", "date", "command")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
ROOT = pathlib.Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """The short hash of the checkout's HEAD, or "unknown" outside a git checkout."""
    try:
        result = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, else what the platform module knows."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def check(record: object, source: str) -> None:
    """Raises ValueError naming `source` and the member when `record` does not follow the schema."""
    if not isinstance(record, dict):
        raise ValueError(f"{source}: a results file holds one JSON object, got {type(record).__name__}")
    for field in FIELDS:
        if field not in record:
            raise ValueError(f"{source}: no '{field}' member")
        if not isinstance(record[field], str) or not record[field].strip():
            raise ValueError(f"{source}: '{field}' must be a non-empty string, got {record[field]!r}")
    if not DATE.fullmatch(record["date"]):
        raise ValueError(f"{source}: 'date' must be YYYY-MM-DD, got {record['date']!r}")
    if len(record) == len(FIELDS):
        raise ValueError(f"{source}: no records after {', '.join(FIELDS)}")


def make(device: str, command: str, commit: str | None = None, date: str | None = None, **records) -> dict:
    """A record in the schema: the four members first (commit: HEAD's, date: today's by default), then `records`."""
    return {"device": device, "commit": commit or git_commit(), "date": date or datetime.date.today().isoformat(),
            "command": command, **records}


def write(path: pathlib.Path | str, record: dict) -> None:
    """Checks `record` and writes it as the results file `path` (one-space indentation, a final newline)."""
    path = pathlib.Path(path)
    check(record, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
