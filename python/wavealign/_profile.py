"""The `profile=` argument of wavealign.plan(): the calibrated skip profile (docs/skip-profile.md), parsed once.

Which profile a choice names is the library's rule (skip_profile_choice in wavealign/skip_profile.h), the one
the CLI's --profile follows, so that wavealign.plan(mask) decides as `wavealign reorder --mask mask.npy` does:

    None or ""          the built-in profile of the plan's `gpu` (no profile for a preset without one)
    "none"              no profile: the adaptive skip decides by the mask statistics alone
    "h200"              that GPU preset's built-in profile (compiled into the extension)
    anything else       a path (str or os.PathLike) to a profile JSON file

and, in Python only, JSON text or a dict of that JSON. The C++ parser reads every profile, so the checks and
their messages are the library's; the errors name the argument first ("invalid argument 'profile: points[3]
.original_ms': ...").

Parsed profiles are cached (the _CACHE_SIZE most recent): a file by its path, modification time and size, JSON
text by its text, a built-in profile by its preset, so a plan() call per mask re-reads nothing. Each parsed
profile carries `key`, a digest of its canonical JSON ("none" without a profile), which tells profiles apart
where a plan config is cached (the GPU planners).
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
    """A resolved profile choice: `core` (the _core.SkipProfile that plans read; None: no profile), `key` (its
    content digest) and `origin` (where it came from, e.g. "built-in bench/results/h200-skip-profile.json")."""

    __slots__ = ("core", "key", "origin")

    def __init__(self, core: Any, origin: str) -> None:
        self.core = core
        self.origin = origin
        self.key: str = "none" if core is None else hashlib.sha256(core.json().encode()).hexdigest()

    @property
    def device(self) -> str | None:
        return None if self.core is None else self.core.device

    def __repr__(self) -> str:
        if self.core is None:
            return f"wavealign skip profile: {self.origin}"
        return (f"wavealign skip profile of {self.core.device!r} ({self.core.points} points, {self.key[:12]}, "
                f"{self.origin})")


def resolve(profile: Any, gpu: str | None = None) -> Profile | None:
    """The Profile of the `profile` argument for the GPU preset `gpu`; ValueError naming 'profile' when invalid.

    The default (None or "") needs the preset: without `gpu` it stays None, for the plan to resolve once its
    preset is known (the integrations parse their profile argument before they plan).
    """
    if isinstance(profile, Profile):
        return profile
    if profile is None:
        profile = ""
    if isinstance(profile, dict):
        try:
            text = json.dumps(profile)
        except (TypeError, ValueError) as error:
            raise invalid("profile", f"the dict is not JSON-serializable ({error})") from error
        return _cached(("json", text), lambda: Profile(_core.skip_profile_from_json(text), "JSON text"))
    if isinstance(profile, str) and profile.lstrip()[:1] in ("{", "["):
        return _cached(("json", profile), lambda: Profile(_core.skip_profile_from_json(profile), "JSON text"))
    if not isinstance(profile, (str, os.PathLike)):
        raise invalid("profile", f"must be None, 'none', a GPU preset's name, a path, JSON text or a dict, got "
                                 f"{type(profile).__name__}")
    try:
        choice = os.fspath(profile)
    except TypeError as error:
        raise invalid("profile", f"is not a path ({error})") from error
    if isinstance(choice, bytes):
        choice = os.fsdecode(choice)
    if not choice and gpu is None:
        return None
    # The preset only decides the default (""), which has been handled when it is unknown.
    kind, detail, origin = _core.skip_profile_choice(choice, gpu or "h200")
    if kind == "none":
        return Profile(None, origin)
    if kind == "builtin":
        return _cached(("builtin", detail), lambda: Profile(_core.builtin_skip_profile(detail), origin))
    try:
        status = os.stat(detail)
    except OSError as error:
        raise invalid(f"profile: {detail}", f"cannot be opened for reading ({error.strerror})") from None
    key = ("file", os.path.abspath(detail), status.st_mtime_ns, status.st_size)
    return _cached(key, lambda: Profile(_core.skip_profile_from_file(detail), origin))


def _cached(key: tuple, parse: Any) -> Profile:
    with _lock:
        entry = _cache.get(key)
        if entry is not None:
            _cache.move_to_end(key)
            return entry
    entry = parse()  # parsed outside the lock: a bad profile raises here and is not cached
    with _lock:
        _cache[key] = entry
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return entry


def clear_cache() -> None:
    """Drops the parsed profiles."""
    with _lock:
        _cache.clear()
