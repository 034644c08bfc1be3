"""wavealign.distributed: sequence-parallel (Ulysses) block-sparse attention with one WaveAlign plan per rank.

    attention = wavealign.distributed.UlyssesAttention(mask_method=my_method)   # or block_mask= / plan= per call
    o = attention(q, k, v)          # q, k, v: this rank's sequence shard [B, H, L_r, d]; o: the same shard

Each of the P ranks of a process group holds a contiguous shard of the sequence for all H heads. One
all-to-all per tensor turns that into the whole sequence for H/P heads ([B, H/P, L, d]); there each rank runs
the mask method, `wavealign.plan` (on the GPU for CUDA masks) and `wavealign.sparse_attention` (the fused
kernel on CUDA, the float32 reference on CPU) for its own heads, and one all-to-all brings the output back to
the sequence shard. Every head's attention depends on that head alone, so the result equals the one-process
result on the whole tensors (bit for bit where the arithmetic is the same: see docs/distributed.md).

In a diffusers model, take diffusers' own context parallelism instead: `set_attention_backend("wavealign")` and
`enable_parallelism(ContextParallelConfig(ulysses_degree=P))` run the same all-to-alls and the same per-head
plans inside the model (docs/diffusers.md, route 3). This layer is for attention outside diffusers.

NCCL serves CUDA tensors, gloo CPU tensors. Importing this module sets NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 where they are unset: the all-to-all needs no
NVLink multicast, and on a shared host a process that creates multicast objects can take the GPUs out of
service. Import it before the process group's first collective.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import _core
from ._attention import sparse_attention
from ._plan import Plan, plan as make_plan
from ._util import INT64_MAX, blocks_for, check_int, invalid
from .nn import SparseAttention

MULTICAST_OFF = (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1"))
for _name, _value in MULTICAST_OFF:
    os.environ.setdefault(_name, _value)

LAYOUTS = ("bhld", "blhd")
# The process-group backends that move tensors of each device type.
_BACKENDS = {"cuda": ("nccl",), "cpu": ("gloo", "mpi")}


def shard_sizes(seq_len: int, ranks: int) -> list[int]:
    """Tokens of each rank's sequence shard, torch.tensor_split's rule: the first seq_len % ranks ranks hold
    one token more than the others."""
    seq_len = check_int(seq_len, "seq_len", 1, INT64_MAX)
    ranks = check_int(ranks, "ranks", 1)
    base, extra = divmod(seq_len, ranks)
    return [base + (rank < extra) for rank in range(ranks)]


def _group_shape(group: Any) -> tuple[int, int]:
    """(ranks, rank) of a process group (None: the default group)."""
    if not dist.is_available() or not dist.is_initialized():
        raise invalid("group", "torch.distributed has no process group: call torch.distributed."
                               "init_process_group (nccl for CUDA tensors, gloo for CPU tensors) first")
    return dist.get_world_size(group), dist.get_rank(group)


def shard_sequence(x: torch.Tensor, group: Any = None, *, layout: str = "bhld") -> torch.Tensor:
    """This rank's sequence shard of a whole tensor [B, H, L, ...] ("bhld") or [B, L, H, ...] ("blhd"): the
    slice torch.tensor_split gives this rank (a view)."""
    _check_layout(layout)
    ranks, rank = _group_shape(group)
    dim = 2 if layout == "bhld" else 1
    if not isinstance(x, torch.Tensor) or x.dim() <= dim:
        raise invalid("x", f"must be a torch.Tensor with a sequence dimension {dim} (layout {layout!r}), got "
                           f"{getattr(x, 'shape', type(x).__name__)}")
    sizes = shard_sizes(int(x.shape[dim]), ranks)
    return x.narrow(dim, sum(sizes[:rank]), sizes[rank])


def shard_heads(block_mask: Any, group: Any = None, *, batch: int = 1) -> Any:
    """This rank's heads of a dense mask of all heads: rows r*H/P .. (r+1)*H/P - 1 of a bool/uint8
    [H, MB, NB] mask (torch tensor or numpy array), or of each batch entry of a [B*H, MB, NB] mask (pass
    batch=B). The result is what UlyssesAttention takes as this rank's block_mask."""
    ranks, rank = _group_shape(group)
    batch = check_int(batch, "batch", 1)
    shape = tuple(getattr(block_mask, "shape", ()))
    if len(shape) != 3:
        raise invalid("block_mask", f"must be a dense [H, MB, NB] or [B*H, MB, NB] mask (a torch tensor or numpy "
                                    f"array) to be split by heads, got {type(block_mask).__name__} of shape "
                                    f"{list(shape)}")
    if shape[0] % batch:
        raise invalid("batch", f"is {batch}, which does not divide the mask's {shape[0]} heads")
    heads = shape[0] // batch
    if heads % ranks:
        raise invalid("block_mask", f"has {heads} heads per batch entry, which the {ranks} ranks of the group "
                                    f"cannot share evenly (a multiple of {ranks} is needed)")
    local = heads // ranks
    per_entry = block_mask.reshape(batch, heads, *shape[1:])[:, rank * local:(rank + 1) * local]
    return per_entry.reshape(batch * local, *shape[1:])


def _check_layout(layout: Any) -> None:
    if layout not in LAYOUTS:
        raise invalid("layout", f"unknown value {layout!r} (expected one of: {', '.join(LAYOUTS)})")


@dataclass(frozen=True)
class _Split:
    """The geometry of one call: how the sequence and the heads are cut over the ranks."""

    layout: str
    ranks: int
    rank: int
    batch: int
    heads: int          # H of q, all ranks together
    seq_len: int        # L, all shards together
    sizes: list[int]    # tokens of each rank's shard
    head_dim: int

    @property
    def local_heads(self) -> int:
        return self.heads // self.ranks


def _split_of(q: Any, k: Any, v: Any, group: Any, layout: str, seq_len: Any) -> _Split:
    """Checks one call on this rank's host, before any communication, and returns its geometry."""
    _check_layout(layout)
    ranks, rank = _group_shape(group)
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        axes = "[B, H, L_r, d]" if layout == "bhld" else "[B, L_r, H, d]"
        raise invalid("q", f"must be a 4-D torch.Tensor {axes} (layout {layout!r}), got "
                           f"{getattr(q, 'shape', type(q).__name__)}")
    for x, name in ((k, "k"), (v, "v")):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(q.shape):
            raise invalid(name, f"must be a torch.Tensor of q's shape {list(q.shape)}, got "
                                f"{getattr(x, 'shape', type(x).__name__)}")
        if x.dtype != q.dtype or x.device != q.device:
            raise invalid(name, f"is {x.dtype} on {x.device}, q is {q.dtype} on {q.device}")
    backend = str(dist.get_backend(group))
    accepted = _BACKENDS.get(q.device.type, ())
    if not any(name in backend for name in accepted):
        raise invalid("group", f"has backend {backend!r}, which does not move {q.device.type} tensors "
                               f"(expected {' or '.join(accepted) or 'a backend for this device'})")
    if layout == "bhld":
        batch, heads, local_len, head_dim = (int(n) for n in q.shape)
    else:
        batch, local_len, heads, head_dim = (int(n) for n in q.shape)
    if heads % ranks:
        raise invalid("q", f"has {heads} heads, which the {ranks} ranks of the group cannot share evenly: each "
                           f"rank runs H/P whole heads, so H must be a multiple of {ranks}")
    if seq_len is None:
        sizes = _agreed_shard_lengths(local_len, group, q.device, rank)
    else:
        sizes = shard_sizes(seq_len, ranks)
        if sizes[rank] != local_len:
            raise invalid("q", f"holds {local_len} tokens on rank {rank}, but seq_len={seq_len} over {ranks} ranks "
                               f"gives shards of {sizes} tokens (torch.tensor_split's rule: the first "
                               f"seq_len % P ranks hold one token more), so rank {rank} must hold {sizes[rank]}")
    if sum(sizes) < 1:
        raise invalid("q", f"has an empty sequence: {local_len} tokens on each of {ranks} ranks")
    return _Split(layout, ranks, rank, batch, heads, sum(sizes), sizes, head_dim)


def _agreed_shard_lengths(local_len: int, group: Any, device: torch.device, rank: int) -> list[int]:
    """Every rank's shard length when the call gives no seq_len: they must all be equal (the all-to-alls split
    the sequence evenly), and every rank must find out before any of them posts an all-to-all of unequal
    sizes (which gloo answers with an abort, NCCL with a hang). One all-gather of one integer per rank, the
    same on every rank, so that every rank raises the same ValueError (on NCCL reading it waits for the
    device: pass seq_len to skip it)."""
    mine = torch.tensor([local_len], dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    sizes = [int(length) for length in torch.cat(everyone).tolist()]
    if len(set(sizes)) != 1:
        raise invalid("seq_len", f"is needed: the ranks hold shards of {sizes} tokens (rank {rank}: {local_len}), "
                                 f"and without seq_len every shard must hold L/P tokens; pass seq_len={sum(sizes)} "
                                 "(the shards then follow torch.tensor_split's rule)")
    return sizes


# ---- the all-to-alls ------------------------------------------------------------------------------------------
#
# Both directions move one buffer per tensor and put each rank's part in one contiguous piece:
#   to heads:    send [P, L_r, B, H/P, ...] (piece p: this shard's tokens of rank p's heads), receive
#                [L, B, H/P, ...] (piece p: rank p's tokens, so the pieces land in sequence order);
#   to sequence: send [L, B, H/P, ...] split by the shard sizes, receive [P, L_r, B, H/P, ...].
# The received [L, B, H/P, d] buffer is read as [B, H/P, L, d] (a view the kernel takes without a copy, like the
# [B, H, L, d] view of a [B, L, H, d] projection), and the kernel's output keeps that layout, so the way back
# sends it as it is. Each direction costs one copy per tensor: packing the send buffer on the way in,
# unpacking the received one on the way out.

def _start_to_heads(x: torch.Tensor, split: _Split, group: Any) -> tuple[Any, torch.Tensor]:
    """Starts the all-to-all of a sequence shard [B, H, L_r, ...] / [B, L_r, H, ...] to this rank's heads.
    Returns (work, buffer [L, B, H/P, ...]); the buffer is valid once the work is waited for."""
    ranks, local = split.ranks, split.local_heads
    if split.layout == "bhld":
        pieces = x.unflatten(1, (ranks, local)).permute(1, 3, 0, 2, *range(4, x.dim() + 1))
    else:
        pieces = x.unflatten(2, (ranks, local)).permute(2, 1, 0, 3, *range(4, x.dim() + 1))
    send = pieces.contiguous()
    receive = torch.empty((split.seq_len, split.batch, local, *x.shape[3:]), dtype=x.dtype, device=x.device)
    work = dist.all_to_all_single(receive, send, output_split_sizes=split.sizes, group=group, async_op=True)
    return work, receive


def _start_to_sequence(tokens_major: torch.Tensor, split: _Split, group: Any) -> tuple[Any, torch.Tensor]:
    """Starts the all-to-all of this rank's heads [L, B, H/P, ...] back to its sequence shard.
    Returns (work, buffer [P, L_r, B, H/P, ...])."""
    send = tokens_major.contiguous()
    local_len = split.sizes[split.rank]
    receive = torch.empty((split.ranks, local_len, *send.shape[1:]), dtype=send.dtype, device=send.device)
    work = dist.all_to_all_single(receive, send, input_split_sizes=split.sizes, group=group, async_op=True)
    return work, receive


def _sequence_shard(received: torch.Tensor, split: _Split) -> torch.Tensor:
    """[P, L_r, B, H/P, ...] -> the shard in the caller's layout: [B, H, L_r, ...] or [B, L_r, H, ...]."""
    rest = tuple(range(4, received.dim()))
    if split.layout == "bhld":
        return received.permute(2, 0, 3, 1, *rest).flatten(1, 2)
    return received.permute(2, 1, 0, 3, *rest).flatten(2, 3)


def _heads_view(tokens_major: torch.Tensor) -> torch.Tensor:
    """[L, B, H/P, d] -> [B, H/P, L, d] (a view)."""
    return tokens_major.permute(1, 2, 0, 3)


class _Clock:
    """Marks between the phases of one call: CUDA events on the compute stream for CUDA tensors (no host
    synchronization until read), the host clock otherwise (gloo's waits block the host)."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.marks: list[tuple[str, Any]] = []

    def mark(self, phase: str) -> None:
        """Ends `phase` (the first mark starts the clock)."""
        if self.stream is None:
            self.marks.append((phase, time.perf_counter()))
        else:
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.stream)
            self.marks.append((phase, event))

    def milliseconds(self) -> dict[str, float]:
        if self.stream is not None:
            self.marks[-1][1].synchronize()
        times = {}
        for (_, start), (phase, stop) in zip(self.marks, self.marks[1:]):
            times[phase] = start.elapsed_time(stop) if self.stream is not None else (stop - start) * 1e3
        times["total_ms"] = sum(times.values())
        return times


# ---- the layer -----------------------------------------------------------------------------------------------

class UlyssesAttention(torch.nn.Module):
    """Sequence-parallel block-sparse attention in WaveAlign order, one plan per rank for its heads.

    In a diffusers model, diffusers' own context parallelism does what this layer does: with the attention
    backend "wavealign" (wavealign.diffusers) and enable_parallelism(ContextParallelConfig(ulysses_degree=P)),
    diffusers' Ulysses all-to-all gives each rank H/P heads over the whole sequence, the backend runs the mask
    method, the plan and the kernel on them, and the result equals one process's (docs/diffusers.md). That is
    the route to take there. This layer is for attention outside diffusers, and has what diffusers' route does
    not: uneven shards on any process-group backend (seq_len), plans given or cached by mask_key, packing and
    planning overlapped with the transfers, phase timings, and LSE.

    forward(q, k, v, block_mask=None, *, plan=None, mask_key=None, seq_len=None, return_lse=False) -> O
    (and LSE) as this rank's sequence shard, in q's layout. q, k, v: this rank's shard of the sequence for all
    H heads, [B, H, L_r, d] (layout "bhld") or [B, L_r, H, d] ("blhd"), one dtype and device; H must be a
    multiple of the group's P ranks. Rank r holds tokens sum(sizes[:r]) .. sum(sizes[:r+1]) - 1 with sizes =
    shard_sizes(L, P) (torch.tensor_split's rule); pass seq_len=L when L is not a multiple of P. Without it,
    every shard must hold L/P tokens: the ranks all-gather their shard lengths first (one integer each; on NCCL
    the host waits for it) and, should they differ, every rank raises the same ValueError naming seq_len, before
    any all-to-all. Every rank calls forward with the same arguments apart from its shard.

    The rank's heads are r*H/P .. (r+1)*H/P - 1. Their mask comes, in this order of precedence, from:
      - plan: a Plan of those heads (H/P mask heads, or B*H/P for one mask per batch entry), used as it is;
      - mask_key with a cached plan: that plan (the mask method is not run);
      - block_mask: the rank's mask in any form wavealign.plan takes (shard_heads cuts it from a dense mask
        of all heads); cached like wavealign.nn.SparseAttention (by mask_key, or by a host mask's content; a
        CUDA mask without mask_key is planned on every call);
      - mask_method: a callable (q, k) -> block mask, called with the rank's [B, H/P, L, d] views of q and k
        (whole sequence); its mask is planned on every call, or once per mask_key.

    Args: group (None: the default process group), layout, mask_method; block_size, wave_size, order,
    iterations, seed, skip, gpu, plan_reuse, profile: as in wavealign.plan(); scale, traversal, head_order,
    kernel: as in wavealign.sparse_attention(); cache_size: plans kept (see wavealign.nn.SparseAttention);
    record_timings: mark the phases of every call for timings() (CUDA events, no host synchronization).
    Eager only (no torch.compile), inference only (no backward), like the calls it makes.
    """

    def __init__(self, group: Any = None, *, layout: str = "bhld", mask_method: Callable[[Any, Any], Any] | None = None,
                 block_size: int | tuple[int, int] = 128, wave_size: int | None = None, order: str = "wavealign",
                 iterations: int = 10, seed: int = 0, skip: str = "auto", gpu: str = "h200", plan_reuse: float = 1.0,
                 profile: Any = None, scale: float | None = None, traversal: str = "ascending",
                 head_order: str = "sequential", kernel: str = "auto", cache_size: int = 8,
                 record_timings: bool = False) -> None:
        super().__init__()
        _check_layout(layout)
        if mask_method is not None and not callable(mask_method):
            raise invalid("mask_method", f"must be a callable (q, k) -> block mask, got {type(mask_method).__name__}")
        self.group = group
        self.layout = layout
        self.mask_method = mask_method
        self.local = SparseAttention(block_size=block_size, wave_size=wave_size, order=order, iterations=iterations,
                                     seed=seed, skip=skip, gpu=gpu, plan_reuse=plan_reuse, profile=profile,
                                     scale=scale, traversal=traversal, head_order=head_order, kernel=kernel,
                                     cache_size=cache_size)
        self.record_timings = record_timings
        self._clock: _Clock | None = None

    def extra_repr(self) -> str:
        return f"layout={self.layout!r}, mask_method={getattr(self.mask_method, '__name__', self.mask_method)!r}"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any = None, *,
                plan: Plan | None = None, mask_key: Any = None, seq_len: int | None = None,
                return_lse: bool = False) -> Any:
        split = _split_of(q, k, v, self.group, self.layout, seq_len)
        if plan is None and block_mask is None:
            if mask_key is not None:
                plan = self._cached_plan(mask_key)
            if plan is None and self.mask_method is None:
                given = f"mask_key {mask_key!r} has no cached plan" if mask_key is not None else "no plan is given"
                raise invalid("block_mask", f"is None, {given}, and the layer has no mask_method")
        if plan is not None:
            _check_plan(plan, "plan", split)
        clock = self._clock = _Clock(q.device) if self.record_timings else None
        mark = clock.mark if clock is not None else lambda phase: None
        mark("start")
        # Issued in the order they are needed: the mask method reads q and k, the kernel all three. On NCCL each
        # runs on the communicator's stream, so packing k and v, and then the mask and the plan, overlap the
        # transfers still in flight; the compute stream waits for a buffer only where it reads it.
        flights = [_start_to_heads(x, split, self.group) for x in (q, k, v)]
        mark("pack_ms")
        try:
            if plan is None:
                plan = self._rank_plan(split, flights, block_mask, mask_key)
            if plan.planner == "gpu":
                # The kernel reads the mask as CSR, whose size only the device knows: derive it now (one host
                # synchronization per new plan), while v may still be arriving.
                plan.csr()
            mark("plan_ms")
        finally:
            # Every rank has posted these all-to-alls: complete them even when planning failed, so that the
            # group stays usable after the error.
            for work, _ in flights:
                work.wait()
        mark("wait_ms")
        heads_q, heads_k, heads_v = (_heads_view(receive) for _, receive in flights)
        local = self.local
        o, lse = sparse_attention(heads_q, heads_k, heads_v, plan, scale=local.scale, return_lse=True,
                                  traversal=local.traversal, head_order=local.head_order, kernel=local.kernel)
        mark("attention_ms")
        back = [_start_to_sequence(o.permute(2, 0, 1, 3), split, self.group)]
        if return_lse:
            back.append(_start_to_sequence(lse.permute(2, 0, 1), split, self.group))
        shards = []
        for work, receive in back:
            work.wait()
            shards.append(_sequence_shard(receive, split))
        mark("to_sequence_ms")
        return (shards[0], shards[1]) if return_lse else shards[0]

    def timings(self) -> dict[str, float]:
        """Milliseconds of the phases of the last call made with record_timings (reading them waits for that
        call on CUDA): pack_ms (copying q, k, v into the send buffers), plan_ms (the mask method and the plan;
        0 with a given or cached plan), wait_ms (waiting for the all-to-alls to heads: the communication that
        the packing and planning did not hide), attention_ms (the rank's sparse attention), to_sequence_ms
        (the all-to-all back and the unpacking of O, and LSE), total_ms (their sum)."""
        if self._clock is None:
            raise RuntimeError("wavealign.distributed.UlyssesAttention.timings: no call was made with "
                               "record_timings=True")
        return self._clock.milliseconds()

    def _cached_plan(self, mask_key: Any) -> Plan | None:
        """The plan cached under mask_key, or None."""
        try:
            return self.local.plan_for(None, mask_key)
        except ValueError:  # plan_for's "no plan is cached for this mask_key"
            return None

    def _rank_plan(self, split: _Split, flights: list[tuple[Any, torch.Tensor]], block_mask: Any,
                   mask_key: Any) -> Plan:
        """The plan of this rank's heads from block_mask or, without one, from the mask method."""
        local = self.local
        if block_mask is not None:
            plan = local.plan_for(block_mask, mask_key, head_dim=split.head_dim)
            _check_plan(plan, "block_mask", split)
            return plan
        for work, _ in flights[:2]:
            work.wait()
        block_mask = self.mask_method(_heads_view(flights[0][1]), _heads_view(flights[1][1]))
        if mask_key is None:
            # A new mask on every call: nothing to reuse, so it is planned without filling the cache.
            plan = make_plan(block_mask, head_dim=split.head_dim, **local.plan_options)
        else:
            plan = local.plan_for(block_mask, mask_key, head_dim=split.head_dim)
        _check_plan(plan, "mask_method", split)
        return plan


def _check_plan(plan: Any, argument: str, split: _Split) -> None:
    """A rank's plan must cover its heads and the whole sequence."""
    if not isinstance(plan, Plan):
        raise invalid(argument, f"must be a wavealign.Plan, got {type(plan).__name__}")
    first = split.rank * split.local_heads
    if not _core.mask_heads_fit(plan.heads, split.batch, split.local_heads):
        raise invalid(argument, f"has {plan.heads} mask heads on rank {split.rank} of {split.ranks}, which runs q's "
                                f"heads {first}..{first + split.local_heads - 1} of {split.heads}: expected the "
                                f"rank's own heads, {split.local_heads} (or B*H/P = {split.batch * split.local_heads}, "
                                "or 1 for all); shard_heads cuts them from a mask of all heads")
    q_block, kv_block = plan.block_size
    blocks = (blocks_for(split.seq_len, q_block), blocks_for(split.seq_len, kv_block))
    if (plan.q_blocks, plan.kv_blocks) != blocks:
        raise invalid(argument, f"has {plan.q_blocks} x {plan.kv_blocks} blocks of {q_block} x {kv_block} tokens, "
                                f"the whole sequence of {split.seq_len} tokens needs {blocks[0]} x {blocks[1]}")
