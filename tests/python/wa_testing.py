"""Oracles and inputs shared by the Python tests: masks, a float64 dense attention, layout helpers."""

from __future__ import annotations

import numpy as np


def random_mask(rng: np.random.Generator, heads: int, q_blocks: int, kv_blocks: int, density: float = 0.3,
                dtype: type = np.bool_) -> np.ndarray:
    """Bernoulli mask [heads, q_blocks, kv_blocks] with the block diagonal kept (no empty rows)."""
    mask = rng.random((heads, q_blocks, kv_blocks)) < density
    rows = np.arange(q_blocks)
    mask[:, rows, rows * kv_blocks // q_blocks] = True
    return mask.astype(dtype)


def csr_of(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row_ptr int64 [H*MB+1], col_idx int32 [nnz]) of a dense [H, MB, NB] mask, columns ascending."""
    rows = mask.reshape(-1, mask.shape[-1]).astype(bool)
    counts = rows.sum(axis=1)
    row_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    col_idx = np.nonzero(rows)[1].astype(np.int32)
    return row_ptr, col_idx


def flex_of(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FlexAttention layout of a dense [H, MB, NB] mask: counts [1, H, MB] and indices [1, H, MB, NB]."""
    mask = mask.astype(bool)
    counts = mask.sum(axis=-1).astype(np.int32)
    indices = np.argsort(~mask, axis=-1, kind="stable").astype(np.int32)
    return counts[None], indices[None]


class FlexLike:
    """Duck-typed FlexAttention BlockMask over numpy arrays (what wavealign.plan reads from one)."""

    def __init__(self, mask: np.ndarray, block: int, seq_len: int) -> None:
        self.kv_num_blocks, self.kv_indices = flex_of(mask)
        self.full_kv_num_blocks = None
        self.full_kv_indices = None
        self.BLOCK_SIZE = (block, block)
        self.seq_lengths = (seq_len, seq_len)


def expand_mask(mask: np.ndarray, seq_len: int, q_block: int, kv_block: int) -> np.ndarray:
    """Token mask [..., L, L] of a block mask [..., MB, NB]."""
    tokens = np.repeat(np.repeat(mask.astype(bool), q_block, axis=-2), kv_block, axis=-1)
    return tokens[..., :seq_len, :seq_len]


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, token_mask: np.ndarray,
                    scale: float) -> tuple[np.ndarray, np.ndarray]:
    """float64 softmax attention restricted to token_mask [..., L, L]: (O [..., L, d], LSE [..., L]).

    Fully masked rows give O = 0 and LSE = -inf, the convention of the library.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scores = np.einsum("...id,...jd->...ij", q, k) * scale
    scores = np.where(token_mask, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(row_max)
    weights = np.exp(scores - np.where(empty, 0.0, row_max))
    denominator = weights.sum(axis=-1, keepdims=True)
    o = np.einsum("...ij,...jd->...id", weights, v) / np.where(empty, 1.0, denominator)
    with np.errstate(divide="ignore"):
        lse = np.where(empty[..., 0], -np.inf, (row_max + np.log(np.where(empty, 1.0, denominator)))[..., 0])
    return np.where(empty, 0.0, o), lse


def transposed_layout(x: np.ndarray) -> np.ndarray:
    """The same values as x [B, H, L, d] viewed from a [B, L, H, d] buffer (the usual projection layout)."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


def host_block(stats: np.ndarray, flags: np.ndarray, record: np.ndarray | None = None) -> np.ndarray:
    """The host block of a plan buffer (wavealign/plan_buffers.h) as the host reads it back: the 40-byte
    validation record (zeros: a valid mask), the MaskStats array, then one skip code per head."""
    record = np.zeros(40, np.uint8) if record is None else record.view(np.uint8)
    return np.concatenate([record, stats.view(np.uint8), flags.astype(np.uint8)])


def launch_processes(worker, args: tuple, world: int, folder, preload: list[str], timeout_s: float,
                     collective_timeout) -> dict:
    """Runs worker(rank, world, port, *args) on `world` processes and returns {rank: torch.load(folder/rankN.pt)}.

    The workers meet at a TCPStore on 127.0.0.1 (its port is their third argument). forkserver: children fork
    from a server that imported `preload` once (a plain fork of the test process could inherit a used OpenMP
    pool, which hangs; spawn would import torch in every child). Processes still alive after `timeout_s` are
    killed and the launch raises TimeoutError.
    """
    import multiprocessing
    import pathlib
    import time

    import torch
    import torch.distributed as dist
    import torch.multiprocessing

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=collective_timeout)
    multiprocessing.set_forkserver_preload(preload)
    context = torch.multiprocessing.start_processes(worker, args=(world, store.port, *args), nprocs=world,
                                                    join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world} processes did not finish within {timeout_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return {rank: torch.load(pathlib.Path(folder) / f"rank{rank}.pt") for rank in range(world)}
