"""Moving query blocks of [..., L, d] numpy arrays into plan order and back (the plug-in path; the torch
versions are the ops of wavealign.ops).

Both directions gather whole tokens: output token t of block p comes from token index[p] * block + t % block
of the input. Permuting pads a partial last block with zeros first, so the permuted tensor always holds
q_blocks * block tokens; unpermuting can drop that padding again (`seq_len`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._util import heads_view_shape, invalid


def _token_index_numpy(block_index: np.ndarray, block: int, length: int) -> np.ndarray:
    """[heads, q_blocks] block order -> [heads, length] int64 token order."""
    heads, q_blocks = block_index.shape
    tokens = block_index.astype(np.int64)[:, :, None] * block + np.arange(block, dtype=np.int64)
    return tokens.reshape(heads, q_blocks * block)[:, :length]


def _check_rows(x_shape: tuple[int, ...], argument: str) -> None:
    if len(x_shape) < 2:
        raise invalid(argument, f"must be [..., L, d], got shape {list(x_shape)}")


def permute_numpy(x: np.ndarray, permutation: np.ndarray, block: int, argument: str = "x") -> np.ndarray:
    """x [..., L, d] -> [..., q_blocks*block, d] with query blocks in plan order (zero padding at the end)."""
    _check_rows(x.shape, argument)
    heads, q_blocks = permutation.shape
    length = x.shape[-2]
    padded = q_blocks * block
    if not (padded - block < length <= padded):
        raise invalid(argument, f"has {length} tokens, expected {padded - block + 1}..{padded} "
                                f"for {q_blocks} query blocks of {block}")
    if length != padded:
        pad = [(0, 0)] * x.ndim
        pad[-2] = (0, padded - length)
        x = np.pad(x, pad)
    view = heads_view_shape(x.shape[:-2], heads, argument)
    index = _token_index_numpy(permutation, block, padded).reshape(*view, padded, 1)
    return np.take_along_axis(x, index, axis=-2)


def unpermute_numpy(x: np.ndarray, inverse: np.ndarray, block: int, seq_len: int | None,
                    argument: str = "o") -> np.ndarray:
    """Inverse of permute_numpy: x [..., q_blocks*block, d] -> [..., seq_len, d] in the original order."""
    _check_rows(x.shape, argument)
    heads, q_blocks = inverse.shape
    padded = q_blocks * block
    if x.shape[-2] != padded:
        raise invalid(argument, f"has {x.shape[-2]} tokens, expected q_blocks*block = {padded} "
                                "(the output of a plan-order call)")
    length = check_seq_len(seq_len, q_blocks, block)
    view = heads_view_shape(x.shape[:-2], heads, argument)
    index = _token_index_numpy(inverse, block, length).reshape(*view, length, 1)
    return np.take_along_axis(x, index, axis=-2)


def check_seq_len(seq_len: Any, q_blocks: int, block: int) -> int:
    """Tokens kept by unpermute: q_blocks*block for None, else a length whose blocks are the plan's."""
    padded = q_blocks * block
    if seq_len is None:
        return padded
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)):
        raise invalid("seq_len", f"must be an int or None, got {type(seq_len).__name__}")
    if not (padded - block < int(seq_len) <= padded):
        raise invalid("seq_len", f"= {seq_len} does not match {q_blocks} query blocks of {block} tokens")
    return int(seq_len)
