"""The `profile=` argument of wavealign.plan(): a calibrated skip profile (docs/skip-profile.md), parsed once.

A profile comes in as a path (str or os.PathLike) to its JSON file, as JSON text, or as a dict of that JSON. The
C++ parser reads it (parse_skip_profile / load_skip_profile), so the checks and their messages are the
library's; the errors name the argument first ("invalid argument 'profile: points[3].original_ms': ...").

Parsed profiles are cached (the _CACHE_SIZE most recent): a file by its path, modification time and size, JSON
text by its text, so a plan() call per mask re-reads nothing. Each parsed profile carries `key`, a digest of its
canonical JSON, which tells profiles apart where a plan config is cached (the GPU planners).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from typing import Any

from . import _core
from ._util import invalid

_CACHE_SIZE = 8
_cache: OrderedDict[tuple, Profile] = OrderedDict()
_lock = threading.Lock()


class Profile:
    """A parsed skip profile: `core` (the _core.SkipProfile that plans read) and `key` (its content digest)."""

    __slots__ = ("core", "key")

    def __init__(self, core: Any) -> None:
        self.core = core
        self.key: str = hashlib.sha256(core.json().encode()).hexdigest()

    @property
    def device(self) -> str:
        return self.core.device

    def __repr__(self) -> str:
        return f"wavealign skip profile of {self.core.device!r} ({self.core.points} points, {self.key[:12]})"


def resolve(profile: Any) -> Profile | None:
    """The parsed profile of the `profile` argument (None for None); ValueError naming 'profile' when invalid."""
    if profile is None:
        return None
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, dict):
        try:
            text = json.dumps(profile)
        except (TypeError, ValueError) as error:
            raise invalid("profile", f"the dict is not JSON-serializable ({error})") from error
        return _cached(("json", text), lambda: _core.skip_profile_from_json(text))
    if isinstance(profile, str) and profile.lstrip()[:1] in ("{", "["):
        return _cached(("json", profile), lambda: _core.skip_profile_from_json(profile))
    if isinstance(profile, (str, os.PathLike)):
        try:
            path = os.fspath(profile)
        except TypeError as error:
            raise invalid("profile", f"is not a path ({error})") from error
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not path:
            raise invalid("profile", "is an empty path (expected a profile JSON file, JSON text or a dict)")
        try:
            status = os.stat(path)
        except OSError as error:
            raise invalid(f"profile: {path}", f"cannot be opened for reading ({error.strerror})") from None
        key = ("file", os.path.abspath(path), status.st_mtime_ns, status.st_size)
        return _cached(key, lambda: _core.skip_profile_from_file(path))
    raise invalid("profile", f"must be a path, JSON text, a dict or None, got {type(profile).__name__}")


def _cached(key: tuple, parse: Any) -> Profile:
    with _lock:
        entry = _cache.get(key)
        if entry is not None:
            _cache.move_to_end(key)
            return entry
    entry = Profile(parse())  # parsed outside the lock: a bad profile raises here and is not cached
    with _lock:
        _cache[key] = entry
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return entry


def clear_cache() -> None:
    """Drops the parsed profiles."""
    with _lock:
        _cache.clear()
