"""Helpers shared by the package: framework detection without importing torch, argument errors, options."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from . import _core


def invalid(argument: str, message: str) -> ValueError:
    """The ValueError of a bad argument, worded like the C++ library's InvalidArgument."""
    return ValueError(f"invalid argument '{argument}': {message}")


# Option spellings from the C++ name tables, read once: a plain dict keeps the Python entry points free of
# extension calls, so torch.compile can trace them.
_CHOICES: dict[str, tuple[str, ...]] = {kind: tuple(_core.enum_names(kind))
                                        for kind in ("order", "gpu", "skip", "head_order", "traversal", "kernel",
                                                     "precision")}
_torch: Any = None


def torch_or_none() -> Any:
    """The torch module once the caller has imported it, else None (never imports torch itself)."""
    global _torch
    if _torch is None:
        _torch = sys.modules.get("torch")
    return _torch


def is_torch_tensor(value: Any) -> bool:
    torch = torch_or_none()
    return torch is not None and isinstance(value, torch.Tensor)


def require_torch(feature: str) -> Any:
    """Imports torch for a feature that needs it, with an error that says which feature."""
    try:
        import torch
    except ImportError as error:
        raise ImportError(f"wavealign: {feature} needs PyTorch (import torch failed: {error})") from error
    return torch


def host_array(value: Any, argument: str) -> np.ndarray:
    """A host numpy view of `value` (numpy, torch, any CPU DLPack producer, or an array-like).

    torch CPU tensors and DLPack producers are viewed without a copy; torch CUDA tensors are copied to the
    host (a device synchronization). Other device arrays are rejected.
    """
    if isinstance(value, np.ndarray):
        return value
    if is_torch_tensor(value):
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        return tensor.numpy()
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError) as error:
            raise invalid(argument, f"cannot be read on the host through DLPack ({error})") from error
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as error:
        raise invalid(argument, f"is not an array ({type(value).__name__})") from error


def check_choice(value: Any, argument: str, kind: str) -> str:
    """Validates an option against the C++ name table of `kind` (order, gpu, skip, head_order, traversal,
    kernel, precision)."""
    names = _CHOICES[kind]
    if not isinstance(value, str) or value not in names:
        raise invalid(argument, f"unknown value {value!r} (expected one of: {', '.join(names)})")
    return value


# Ranges of the C++ integer types behind the arguments: a Python int outside them would otherwise reach the
# extension and fail there with a TypeError that names no argument.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


def check_int(value: Any, argument: str, minimum: int | None = None, maximum: int = INT32_MAX) -> int:
    """An int (not a bool) in minimum..maximum; maximum defaults to the range of a C++ int."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise invalid(argument, f"must be an int, got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise invalid(argument, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise invalid(argument, f"must be <= {maximum}, got {value}")
    return value


def block_pair(block_size: Any) -> tuple[int, int]:
    """(query block, KV block) from an int or a pair."""
    if isinstance(block_size, (tuple, list)):
        if len(block_size) != 2:
            raise invalid("block_size", f"must be an int or a (q_block, kv_block) pair, got {block_size!r}")
        return check_int(block_size[0], "block_size", 1), check_int(block_size[1], "block_size", 1)
    size = check_int(block_size, "block_size", 1)
    return size, size


def blocks_for(tokens: int, block: int) -> int:
    """Blocks that cover `tokens` (the last one may be partial)."""
    return -(-tokens // block)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_scale_value(scale: Any) -> float:
    """A softmax scale the user gave: a finite positive float that float32 holds (the kernels, the CPU reference
    and the mask methods all compute in float32). None means 1/sqrt(head_dim) everywhere; 0 is refused."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise invalid("scale", f"must be a float or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise invalid("scale", f"must be finite and > 0 (None = 1/sqrt(head_dim)), got {scale}")
    if scale > FLOAT32_MAX:
        raise invalid("scale", f"must be at most {FLOAT32_MAX:.7g} (the kernels compute in float32), got {scale:g}")
    return scale


def check_scale(scale: Any, head_dim: int) -> float:
    """The softmax scale: 1/sqrt(head_dim) for None, else check_scale_value."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    return check_scale_value(scale)


def check_flag(value: Any, argument: str) -> bool:
    """A bool (numpy's included); anything else, a truthy string among them, is refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(argument, f"must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def heads_view_shape(lead: tuple[int, ...], heads: int, argument: str) -> tuple[int, ...]:
    """How a per-head [heads, ...] array lines up with the leading dimensions of a [..., L, d] tensor.

    The mask's heads are the shortest suffix of `lead` whose product equals `heads` (so [B, H] takes an
    H-head mask, broadcast over the batch, or a B*H-head mask); a one-head mask is broadcast over all.
    Returns `lead` with the dimensions outside that suffix set to 1.
    """
    if heads == 1:
        return (1,) * len(lead)
    product = 1
    for k in range(1, len(lead) + 1):
        product *= lead[-k]
        if product == heads:
            return (1,) * (len(lead) - k) + tuple(lead[-k:])
        if product > heads:
            break
    raise invalid(argument, f"leading dimensions {list(lead)} do not end in the mask's {heads} heads "
                            f"(expected [..., {heads}, L, d] or batch*heads = {heads})")
