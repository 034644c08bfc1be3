"""Concurrency on the GPU: plans and attention calls from several threads, each on its own CUDA stream, give
what one thread computes alone; memory stays flat over 10,000 calls.

The race this guards against (docs/gpu-plan.md, "Concurrency"): the GPU planner's workspace used to be shared by
every caller of one (device, shape, config), so two threads planning on two streams overwrote each other's
intermediate arrays, and 16-26 of 600 attention results differed from a sequential run (L = 32,768, 8 heads).
Each plan call now has scratch of its own; the tensors a plan derives later wait for the stream that made them.
Results are compared bit for bit (a 64-bit digest of every output, and whole tensors for the last calls).
"""

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the GPU tests are skipped")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import wavealign  # noqa: E402

if not (wavealign.has_cuda and wavealign._core.has_gpu_plan):
    pytest.skip("wavealign was built without its CUDA code", allow_module_level=True)

HEADS, LENGTH, DIM, BLOCK = 8, 32768, 128, 128
Q_BLOCKS = LENGTH // BLOCK
PLAN = dict(wave_size=132, skip="never")


def random_cuda_mask(seed, heads=HEADS, q_blocks=Q_BLOCKS):
    """A Bernoulli mask of density 0.05-0.6 drawn on the current stream from `seed` (the same mask on any
    stream), the diagonal kept."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    density = 0.05 + 0.55 * torch.rand((), generator=generator, device="cuda")
    mask = torch.rand((heads, q_blocks, q_blocks), generator=generator, device="cuda") < density
    rows = torch.arange(q_blocks, device="cuda")
    mask[:, rows, rows] = True
    return mask


class Digest:
    """A 64-bit linear hash of a tensor's bits (int64 arithmetic wraps, in any summation order): equal
    tensors give equal digests, and a row written by the wrong call changes it."""

    def __init__(self, numel):
        generator = torch.Generator(device="cuda").manual_seed(12345)
        self.weights = torch.randint(-2 ** 62, 2 ** 62, (numel,), generator=generator, device="cuda")

    def __call__(self, tensor):
        bits = tensor.reshape(-1).view(torch.int16 if tensor.element_size() == 2 else torch.int32).to(torch.int64)
        return (bits * self.weights[:bits.numel()]).sum()


def attend(q, k, v, mask):
    plan = wavealign.plan(mask, **PLAN)
    o, lse = wavealign.sparse_attention(q, k, v, plan, return_lse=True)
    return plan, o, lse


def test_threads_on_their_own_streams_match_a_sequential_run():
    threads, iterations, kept = 2, 300, 8
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [tuple(torch.randn(1, HEADS, LENGTH, DIM, generator=generator, device="cuda", dtype=torch.bfloat16)
                    for _ in range(3)) for _ in range(threads)]
    digest = Digest(HEADS * LENGTH * DIM)
    results = [dict(o=[], lse=[], permutation=[], full=[]) for _ in range(threads)]
    errors = []
    start = threading.Barrier(threads)

    def run(t):
        try:
            stream = torch.cuda.Stream()
            q, k, v = inputs[t]
            with torch.cuda.stream(stream):
                start.wait()
                for i in range(iterations):
                    plan, o, lse = attend(q, k, v, random_cuda_mask(1000 * t + i))
                    results[t]["o"].append(digest(o))
                    results[t]["lse"].append(digest(lse))
                    results[t]["permutation"].append(plan.permutation.clone())
                    if i >= iterations - kept:
                        results[t]["full"].append((o, lse))
            stream.synchronize()
        except Exception as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors
    torch.cuda.synchronize()

    mismatches = []
    for t in range(threads):
        q, k, v = inputs[t]
        for i in range(iterations):
            plan, o, lse = attend(q, k, v, random_cuda_mask(1000 * t + i))
            same = (torch.equal(plan.permutation, results[t]["permutation"][i]) and
                    bool(digest(o) == results[t]["o"][i]) and bool(digest(lse) == results[t]["lse"][i]))
            if i >= iterations - kept:
                full_o, full_lse = results[t]["full"][i - (iterations - kept)]
                same = same and torch.equal(o, full_o) and torch.equal(lse, full_lse)
            if not same:
                mismatches.append((t, i))
    assert not mismatches, f"{len(mismatches)} of {threads * iterations} calls differ from a sequential run: " \
                           f"{mismatches[:10]}"


def test_a_plan_shared_by_two_streams_waits_for_what_it_derives():
    # The batch-2 schedule of a plan is made on stream A (first use), then read on stream B: B waits for A's
    # event, so the result equals the same call made on A alone.
    mask = random_cuda_mask(7, heads=4, q_blocks=64)
    plan = wavealign.plan(mask, **PLAN)
    q, k, v = (torch.randn(2, 4, 64 * BLOCK, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    plan.check()
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    for stream in (a, b):
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(a):
        torch.cuda._sleep(50_000_000)  # keeps A busy, so B would run ahead of an unordered schedule
        o_a = wavealign.sparse_attention(q, k, v, plan, head_order="concurrent-heads")
    with torch.cuda.stream(b):
        o_b = wavealign.sparse_attention(q, k, v, plan, head_order="concurrent-heads")
    torch.cuda.synchronize()
    assert torch.equal(o_a, o_b)


def test_memory_stays_flat_over_ten_thousand_calls():
    # New mask, plan and attention every call, no garbage collection: what the plans and planners cache is
    # bounded (a long-lived plan asked for 20 batch layouts keeps 8), and a dropped plan frees its tensors at
    # once. Device memory allocated after 200 calls and after 10,000 may differ by the schedules of the 8
    # layouts kept (at most 40 KiB), far below the 1 MiB allowed.
    heads, q_blocks = 4, 16
    q, k, v = (torch.randn(1, heads, q_blocks * BLOCK, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    masks = [random_cuda_mask(seed, heads, q_blocks) for seed in range(16)]
    kept = wavealign.plan(masks[0], wave_size=4, skip="never")
    samples = {}
    for i in range(10_000):
        plan = wavealign.plan(masks[i % len(masks)], wave_size=4, skip="never")
        wavealign.sparse_attention(q, k, v, plan)
        kept._launch_tensors(q.device, 1 + i % 20, heads, "sequential")
        if i in (200, 9_999):
            torch.cuda.synchronize()
            samples[i] = torch.cuda.memory_allocated()
    assert len(kept._cache) <= 8
    assert samples[9_999] - samples[200] <= 1 << 20, samples
    assert len(wavealign._gpu_plan._planners) <= 8


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one CUDA device: the two-device test needs two")
def test_threads_on_two_devices_match_a_sequential_run():
    results, errors = {}, []
    heads, q_blocks = 4, 48

    def run(device_index):
        try:
            device = torch.device("cuda", device_index)
            with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)):
                generator = torch.Generator(device=device).manual_seed(3)
                q, k, v = (torch.randn(1, heads, q_blocks * BLOCK, DIM, generator=generator, device=device,
                                       dtype=torch.bfloat16) for _ in range(3))
                outputs = []
                for i in range(50):
                    mask = random_cuda_mask(i, heads, q_blocks).to(device)
                    outputs.append(attend(q, k, v, mask)[1].cpu())
                results[device_index] = outputs
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    workers = [threading.Thread(target=run, args=(d,)) for d in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors
    for i in range(50):  # same inputs on both devices: the same bits
        assert np.array_equal(results[0][i].float().numpy(), results[1][i].float().numpy()), i
