"""wavealign.plan() on numpy inputs: permutations, the three mask formats, options, outputs."""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import wavealign
from wa_testing import FlexLike, csr_of, host_block, random_mask


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def waves_nnz_non_increasing(mask, permutation, wave_size):
    nnz = mask.sum(axis=-1)[permutation]
    for start in range(0, len(nnz), wave_size):
        wave = nnz[start:start + wave_size]
        if np.any(np.diff(wave) > 0):
            return False
    return True


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8])
def test_permutation_is_a_bijection_with_its_inverse(rng, dtype):
    mask = random_mask(rng, 3, 70, 50, dtype=dtype)
    plan = wavealign.plan(mask, wave_size=16, skip="never")
    assert plan.permutation.dtype == np.int32 and plan.permutation.shape == (3, 70)
    assert plan.inverse.dtype == np.int32 and plan.inverse.shape == (3, 70)
    for h in range(3):
        assert sorted(plan.permutation[h]) == list(range(70))
        assert np.array_equal(plan.inverse[h][plan.permutation[h]], np.arange(70))
        assert waves_nnz_non_increasing(mask[h].astype(bool), plan.permutation[h], 16)
    assert (plan.heads, plan.q_blocks, plan.kv_blocks, plan.wave_size) == (3, 70, 50, 16)
    assert plan.skipped == [False] * 3 and plan.order == "wavealign"


def test_plan_equals_the_cli_reorder_output(rng, tmp_path):
    cli = os.environ.get("WAVEALIGN_CLI")
    if not cli or not pathlib.Path(cli).exists():
        pytest.skip("the wavealign CLI is not built (WAVEALIGN_CLI unset): compared through the C++ plan instead")
    mask = random_mask(rng, 2, 150, 120, density=0.25)
    np.save(tmp_path / "mask.npy", mask)
    result = subprocess.run([cli, "reorder", "--mask", str(tmp_path / "mask.npy"), "--out", str(tmp_path / "p.npy"),
                             "--order", "wavealign", "--wave-size", "24", "--iterations", "7", "--seed", "3",
                             "--skip", "never", "--json"], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(result.stdout)["wave_size"] == 24
    plan = wavealign.plan(mask, wave_size=24, iterations=7, seed=3, skip="never")
    assert np.array_equal(plan.permutation, np.load(tmp_path / "p.npy"))


def test_plan_equals_the_core_plan_through_the_extension(rng):
    mask = random_mask(rng, 2, 90, 90)
    core = wavealign._core
    handle = core.make_plan(core.mask_from_dense(mask), "wavealign", "h200", 20, 10, 0, "never", 1, 128, 2, 128, 1.0)
    buffer, layout, *_ = handle.export()
    offset, size = layout["regions"]["permutations"]
    plan = wavealign.plan(mask, wave_size=20, skip="never", threads=4)
    assert np.array_equal(plan.permutation, buffer[offset:offset + size].view(np.int32).reshape(2, 90))


def test_dense_csr_and_flex_inputs_give_one_plan(rng):
    mask = random_mask(rng, 3, 64, 64)
    dense = wavealign.plan(mask, wave_size=8, skip="never", block_size=32)
    row_ptr, col_idx = csr_of(mask)
    csr = wavealign.plan((row_ptr, col_idx), wave_size=8, skip="never", heads=3, kv_blocks=64, block_size=32)
    csr32 = wavealign.plan((row_ptr.astype(np.int32), col_idx), wave_size=8, skip="never", heads=3, kv_blocks=64,
                           block_size=32)
    flex = wavealign.plan(FlexLike(mask, 32, 64 * 32), wave_size=8, skip="never")
    for other in (csr, csr32, flex):
        assert np.array_equal(other.permutation, dense.permutation)
        assert (other.heads, other.q_blocks, other.kv_blocks) == (3, 64, 64)
    assert flex.block_size == (32, 32)


def test_one_head_mask_and_strided_views(rng):
    mask = random_mask(rng, 2, 40, 40)
    single = wavealign.plan(mask[0], wave_size=8, skip="never")
    contiguous = wavealign.plan(mask, wave_size=8, skip="never")
    assert single.permutation.shape == (1, 40)
    assert np.array_equal(single.permutation[0], contiguous.permutation[0])
    fortran = wavealign.plan(np.asfortranarray(mask), wave_size=8, skip="never")
    assert np.array_equal(fortran.permutation, contiguous.permutation)
    wide = np.zeros((2, 40, 80), bool)
    wide[:, :, ::2] = mask
    strided = wavealign.plan(wide[:, :, ::2], wave_size=8, skip="never")
    assert np.array_equal(strided.permutation, contiguous.permutation)


def test_any_dlpack_producer_is_accepted(rng):
    class Producer:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    mask = random_mask(rng, 2, 30, 30, dtype=np.uint8)
    plan = wavealign.plan(Producer(mask), wave_size=8, skip="never")
    assert np.array_equal(plan.permutation, wavealign.plan(mask, wave_size=8, skip="never").permutation)


def test_orders_and_skip_policies(rng):
    mask = random_mask(rng, 2, 48, 48)
    original = wavealign.plan(mask, order="original")
    assert np.array_equal(original.permutation, np.tile(np.arange(48, dtype=np.int32), (2, 1)))
    s2 = wavealign.plan(mask, order="s2", wave_size=12, skip="never")
    for h in range(2):
        assert waves_nnz_non_increasing(mask[h], s2.permutation[h], 12)
    always = wavealign.plan(mask, skip="always")
    assert always.skipped == [True, True]
    assert np.array_equal(always.permutation, original.permutation)
    auto = wavealign.plan(mask)  # a 48-block head fits the modelled L2: the statistics skip it
    assert auto.skipped == [True, True]
    assert all("L2" in reason for reason in auto.reason)
    shuffled = [wavealign.plan(mask, order="shuffled", seed=s, skip="never").permutation for s in (1, 1, 2)]
    assert np.array_equal(shuffled[0], shuffled[1]) and not np.array_equal(shuffled[0], shuffled[2])


def test_stats_are_per_head(rng):
    mask = random_mask(rng, 3, 50, 40)
    plan = wavealign.plan(mask, skip="never", wave_size=10)
    stats = plan.stats
    for key in ("density", "adjacent_jaccard", "kv_working_set_bytes", "wave_working_set_bytes", "nnz", "plan_ms", "stage1_ms", "stage2_ms",
                "usable_l2_bytes"):
        assert len(stats[key]) == 3, key
    assert np.allclose(stats["density"], mask.mean(axis=(1, 2)))
    assert stats["nnz"] == [int(n) for n in mask.sum(axis=(1, 2))]
    assert stats["total_plan_ms"] >= 0 and stats["wave_size"] == 10 and stats["skipped_heads"] == 0
    assert all(0 <= j <= 1 for j in stats["adjacent_jaccard"])


def test_schedule_lists_original_rows_in_plan_order(rng):
    mask = random_mask(rng, 2, 30, 30)
    plan = wavealign.plan(mask, wave_size=8, skip="never")
    sequential = plan.schedule()
    assert sequential.dtype == np.int32 and sequential.shape == (60, 2)
    expected = np.stack([np.repeat(np.arange(2), 30), plan.permutation.reshape(-1)], axis=1)
    assert np.array_equal(sequential, expected)
    concurrent = plan.schedule("concurrent-heads")
    assert np.array_equal(concurrent[:2], [[0, plan.permutation[0, 0]], [1, plan.permutation[1, 0]]])
    assert sorted(map(tuple, concurrent)) == sorted(map(tuple, sequential))


def test_permuted_mask_keeps_the_input_format(rng):
    mask = random_mask(rng, 2, 36, 28, dtype=np.uint8)
    plan = wavealign.plan(mask, wave_size=8, skip="never")
    permuted = plan.permuted_mask()
    assert permuted.dtype == np.uint8 and permuted.shape == mask.shape
    for h in range(2):
        assert np.array_equal(permuted[h], mask[h][plan.permutation[h]])
        assert np.array_equal(permuted[h][plan.inverse[h]], mask[h])

    single = wavealign.plan(mask[0].astype(bool), wave_size=8, skip="never").permuted_mask()
    assert single.dtype == np.bool_ and single.shape == (36, 28)

    row_ptr, col_idx = csr_of(mask)
    csr_plan = wavealign.plan((row_ptr.astype(np.int32), col_idx), heads=2, kv_blocks=28, wave_size=8, skip="never")
    permuted_row_ptr, permuted_col_idx = csr_plan.permuted_mask()
    assert permuted_row_ptr.dtype == np.int32 and permuted_col_idx.dtype == np.int32
    expected_row_ptr, expected_col_idx = csr_of(permuted)
    assert np.array_equal(permuted_row_ptr, expected_row_ptr) and np.array_equal(permuted_col_idx, expected_col_idx)
    original_row_ptr, original_col_idx = csr_plan.csr()
    assert np.array_equal(original_row_ptr, row_ptr) and np.array_equal(original_col_idx, col_idx)


def test_same_seed_same_plan_on_any_thread_count(rng):
    mask = random_mask(rng, 4, 60, 60)
    one = wavealign.plan(mask, wave_size=8, skip="never", threads=1)
    many = wavealign.plan(mask, wave_size=8, skip="never", threads=3)
    assert np.array_equal(one.permutation, many.permutation)


def test_plan_attributes_read_without_torch(rng):
    plan = wavealign.plan(random_mask(rng, 1, 20, 20), skip="never")
    assert "wavealign.Plan" in repr(plan)
    assert isinstance(plan.reason[0], str) and isinstance(plan.skipped[0], bool)
    assert wavealign.__version__ and isinstance(wavealign.has_cuda, bool)


@pytest.mark.skipif(not wavealign._core.has_gpu_plan, reason="wavealign was built without its CUDA code")
def test_gpu_plan_decisions_read_back_like_the_cpu_plan(rng):
    # The GPU plan's statistics and skip flags are decoded on the host; fed the CPU plan's statistics and
    # the matching flags, the decoder gives the CPU plan's values and reasons (no device needed).
    mask = np.zeros((3, 64, 64), bool)
    mask[0, :, :4] = True                                    # working set fits in L2
    mask[1] = rng.random((64, 64)) < 0.3                     # passes every statistics test
    mask[2, np.arange(64), np.arange(64)] = True             # density below the minimum
    options = dict(wave_size=16, head_dim=4096, gpu="h200")
    cpu = wavealign.plan(mask, skip="auto", **options)
    layout = np.dtype([("nnz", "<i8"), ("density", "<f8"), ("kv_working_set_bytes", "<i8"),
                       ("usable_l2_bytes", "<i8"), ("adjacent_jaccard", "<f8"), ("wave_working_set_bytes", "<i8")])
    assert layout.itemsize == wavealign._core.gpu_plan_stats_bytes
    stats = np.zeros(3, layout)
    for name in layout.names:
        stats[name] = cpu.stats[name]
    planner = wavealign._core.GpuPlanner(3, 64, 64, "wavealign", "h200", 16, 10, 0, "auto", 4096, 2, 128, 1.0)
    flags = np.array([2, 0, 3], np.uint8)  # working set fits, none, low density (GpuSkipReason)
    message, skipped, reasons, decoded = planner.decode(host_block(stats, flags))
    assert message is None
    assert skipped == [True, False, True] and decoded["skipped_heads"] == 2
    assert cpu.skipped[0] and cpu.skipped[2]
    assert reasons[0] == cpu.reason[0] and reasons[2] == cpu.reason[2]
    assert "reordering can pay" in reasons[1] and "statistics only" in reasons[1]
    for name in layout.names:
        assert decoded[name] == cpu.stats[name]
    assert np.isnan(decoded["total_plan_ms"]) and decoded["wave_size"] == 16 and decoded["order"] == "wavealign"
    # kNoGain (6) comes from a calibrated profile, which this planner does not have: the flag's own text.
    _, skipped, reasons, _ = planner.decode(host_block(stats, np.array([2, 6, 3], np.uint8)))
    assert skipped == [True, True, True] and reasons[1] == "predicted gain does not pay for the plan"


# ---- mask ingest: one rule set (wavealign/ingest.h) for every entrance ----------------------------------------

# 2 heads x 2 query blocks x 4 KV blocks: rows {0, 2}, {}, {1, 3}, {3}.
ROW_PTR = np.array([0, 2, 2, 4, 5], np.int64)
COL_IDX = np.array([0, 2, 1, 3, 3], np.int32)


def edited(array, index, value):
    array = array.copy()
    array[index] = value
    return array


# (label, row_ptr, col_idx, the exact ValueError message). The CPU planner raises it in plan(); the GPU planner
# raises the same text at the plan's first host access (test_gpu.py).
CSR_CASES = [
    ("row_ptr start", edited(ROW_PTR, 0, 1), COL_IDX,
     "invalid argument 'row_ptr': must start at 0, got row_ptr[0] = 1"),
    ("row_ptr decreases", edited(ROW_PTR, 2, 1), COL_IDX,
     "invalid argument 'row_ptr': decreases at entry 2: 1 after 2 (head 0, query block 1 would end before it starts)"),
    ("row_ptr end", ROW_PTR, COL_IDX[:-1],
     "invalid argument 'col_idx': has 4 entries, but row_ptr ends at 5"),
    ("column out of range", ROW_PTR, edited(COL_IDX, 3, 4),
     "invalid argument 'col_idx': entry 3 = 4 (head 1, query block 0) is outside [0, 4)"),
    ("column negative", ROW_PTR, edited(COL_IDX, 0, -1),
     "invalid argument 'col_idx': entry 0 = -1 (head 0, query block 0) is outside [0, 4)"),
    ("column repeated", ROW_PTR, edited(COL_IDX, 1, 0),
     "invalid argument 'col_idx': entry 1 = 0 (head 0, query block 0) does not ascend: the row's previous entry is 0"),
    ("int64 column beyond int32", ROW_PTR, edited(COL_IDX.astype(np.int64), 2, 2 ** 32 + 1),
     "invalid argument 'col_idx': entry 2 = 4294967297 (head 1, query block 0) is outside [0, 4)"),
]


def flex_arrays(rows, width=4):
    """FlexAttention counts [1, 2, 2] and indices [1, 2, 2, width] of per-row block lists (2 heads x 2 rows)."""
    counts = np.zeros((1, 2, 2), np.int32)
    indices = np.zeros((1, 2, 2, width), np.int32)
    for r, blocks in enumerate(rows):
        counts[0, r // 2, r % 2] = len(blocks)
        indices[0, r // 2, r % 2, :len(blocks)] = blocks
    return counts, indices


class FlexArrays:
    """A duck-typed BlockMask with a partial and a full pair (block size 16, 4 KV blocks)."""

    def __init__(self, partial, full=None):
        self.kv_num_blocks, self.kv_indices = partial
        self.full_kv_num_blocks, self.full_kv_indices = full if full is not None else (None, None)
        self.BLOCK_SIZE = (16, 16)
        self.seq_lengths = (32, 64)


VALID_PARTIAL = [[3, 1], [], [2], [0, 1]]
VALID_FULL = [[0], [2], [], [3]]
FLEX_CASES = [
    ("repeated in the partial pair", FlexArrays(flex_arrays([[3, 1], [], [2, 2], [0, 1]])),
     "invalid argument 'kv_indices': head 1, query block 0, entry 1 lists block 2 twice"),
    ("full pair repeats a partial block", FlexArrays(flex_arrays(VALID_PARTIAL), flex_arrays([[0], [2], [], [1]])),
     "invalid argument 'full_kv_indices': head 1, query block 1, entry 0 lists block 1, which the row already "
     "lists (in kv_indices or full_kv_indices)"),
    ("index out of range", FlexArrays(flex_arrays([[3, 1], [4], [2], [0, 1]])),
     "invalid argument 'kv_indices': head 0, query block 1, entry 0 = 4 is outside [0, 4)"),
    ("full index negative", FlexArrays(flex_arrays(VALID_PARTIAL), flex_arrays([[0], [-2], [], [3]])),
     "invalid argument 'full_kv_indices': head 0, query block 1, entry 0 = -2 is outside [0, 4)"),
]


def flex_with_count(count, full=False):
    partial, extra = flex_arrays(VALID_PARTIAL), flex_arrays(VALID_FULL)
    target = extra if full else partial
    target[0][0, 1, 0] = count
    return FlexArrays(partial, extra)


FLEX_COUNT_CASES = [
    ("count above the width", flex_with_count(5),
     "invalid argument 'kv_num_blocks': head 1, query block 0: count 5 is outside [0, 4] (the indices' width)"),
    ("count negative", flex_with_count(-1),
     "invalid argument 'kv_num_blocks': head 1, query block 0: count -1 is outside [0, 4] (the indices' width)"),
    ("full count above the width", flex_with_count(9, full=True),
     "invalid argument 'full_kv_num_blocks': head 1, query block 0: count 9 is outside [0, 4] (the indices' width)"),
]
FLEX_CASES += FLEX_COUNT_CASES


@pytest.mark.parametrize("label,row_ptr,col_idx,message", CSR_CASES, ids=[c[0] for c in CSR_CASES])
def test_csr_masks_breaking_a_rule_are_refused_with_the_rule(label, row_ptr, col_idx, message):
    with pytest.raises(ValueError) as raised:
        wavealign.plan((row_ptr, col_idx), heads=2, kv_blocks=4, block_size=16)
    assert str(raised.value) == message
    with pytest.raises(ValueError) as raised:  # the bare ingest binding applies the same rules
        wavealign._core.mask_from_csr(row_ptr, col_idx, 2, 4)
    assert str(raised.value) == message


@pytest.mark.parametrize("label,flex,message", FLEX_CASES, ids=[c[0] for c in FLEX_CASES])
def test_flex_masks_breaking_a_rule_are_refused_with_the_rule(label, flex, message):
    # Until this was one ingest, the Python binding set a repeated block twice without a word.
    with pytest.raises(ValueError) as raised:
        wavealign.plan(flex)
    assert str(raised.value) == message


def test_valid_flex_pairs_unite_and_equal_the_dense_mask():
    dense = np.zeros((2, 2, 4), bool)
    for r, blocks in enumerate(zip(VALID_PARTIAL, VALID_FULL)):
        for block in blocks[0] + blocks[1]:
            dense[r // 2, r % 2, block] = True
    plan = wavealign.plan(FlexArrays(flex_arrays(VALID_PARTIAL), flex_arrays(VALID_FULL)), wave_size=2, skip="never")
    row_ptr, col_idx = plan.csr()
    assert np.array_equal(row_ptr, csr_of(dense)[0]) and np.array_equal(col_idx, csr_of(dense)[1])
    assert np.array_equal(plan.permutation, wavealign.plan(dense, wave_size=2, skip="never").permutation)


def test_strided_and_narrow_csr_arrays_read_in_place():
    wide = np.zeros(10, np.int64)
    wide[::2] = COL_IDX
    plan = wavealign.plan((ROW_PTR.astype(np.int32), wide[::2]), heads=2, kv_blocks=4, wave_size=2, skip="never")
    assert np.array_equal(plan.csr()[1], COL_IDX)


def test_the_record_decoder_gives_the_host_message():
    # GpuPlanOutputs.error as the host reads it back: the code first, then head, row, entry, value, bound.
    record = np.zeros(10, np.int32)
    assert wavealign._core.mask_error_message(record) is None
    fields = np.zeros(1, np.dtype([("code", "<i4"), ("head", "<i4"), ("row", "<i4"), ("reserved", "<i4"),
                                   ("entry", "<i8"), ("value", "<i8"), ("bound", "<i8")]))
    assert fields.itemsize == wavealign._core.mask_error_bytes
    fields[0] = (4, 1, 0, 0, 3, 4, 4)  # kColumnOutOfRange
    assert wavealign._core.mask_error_message(fields.view(np.uint8)) == CSR_CASES[3][3]


# ---- the launch tensors: one schedule layout, built in C++ ----------------------------------------------------

def batch_schedule_oracle(permutation, batch, heads, head_order):
    """make_batch_schedule written out: (b*heads + h, permutation[mask head, p]) batch-major."""
    mask_heads, q_blocks = permutation.shape
    items = []
    for b in range(batch):
        order = ([(h, p) for h in range(heads) for p in range(q_blocks)] if head_order == "sequential"
                 else [(h, p) for p in range(q_blocks) for h in range(heads)])
        for h, p in order:
            mask_head = (b * heads + h) % mask_heads
            items.append((b * heads + h, permutation[mask_head, p]))
    return np.array(items, np.int32)


@pytest.mark.parametrize("head_order", ["sequential", "concurrent-heads"])
@pytest.mark.parametrize("shared", [True, False])
def test_launch_arrays_follow_the_one_schedule_layout(rng, head_order, shared):
    batch, heads, q_blocks = 3, 2, 11
    mask = random_mask(rng, heads if shared else batch * heads, q_blocks, 9)
    plan = wavealign.plan(mask, wave_size=4, skip="never", block_size=16)
    row_ptr, col_idx, schedule = plan._launch_arrays(batch, heads, head_order)
    assert np.array_equal(schedule, batch_schedule_oracle(plan.permutation, batch, heads, head_order))
    assert np.array_equal(row_ptr, csr_of(mask)[0]) and np.array_equal(col_idx, csr_of(mask)[1])
    assert np.array_equal(plan.schedule(head_order), batch_schedule_oracle(plan.permutation, 1, plan.heads, head_order))


def test_the_schedule_binding_refuses_what_is_not_a_permutation():
    permutation = np.array([[0, 1, 2], [2, 2, 0]], np.int32)
    with pytest.raises(ValueError, match="invalid argument 'permutations': row 2 appears twice"):
        wavealign._core.batch_schedule(permutation, 1, 2, "sequential")
    with pytest.raises(ValueError, match="invalid argument 'mask_heads'"):
        wavealign._core.batch_schedule(np.array([[0, 1, 2], [2, 1, 0]], np.int32), 1, 3, "sequential")


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_a_dropped_plan_is_freed_at_once(rng, framework):
    # No reference cycle between a plan and its handle or caches: memory comes back when the last reference
    # goes, without waiting for the garbage collector. (A torch mask's plan used to hold a closure over
    # itself in its device state, so every dropped plan waited for a collection: device memory rose over
    # thousands of calls.)
    import gc
    import weakref

    mask = random_mask(rng, 2, 12, 12)
    if framework == "torch":
        mask = pytest.importorskip("torch", reason="PyTorch is not installed").from_numpy(mask)
    gc.disable()
    try:
        plan = wavealign.plan(mask, wave_size=4, skip="never")
        plan.csr(), plan.schedule(), plan.permuted_mask(), plan.schedule("concurrent-heads")
        dropped = weakref.ref(plan)
        del plan
        assert dropped() is None
    finally:
        gc.enable()


def test_threads_planning_at_once_get_the_sequential_plans(rng):
    from concurrent.futures import ThreadPoolExecutor

    masks = [random_mask(rng, 2, 40, 40, density=0.1 + 0.05 * k) for k in range(8)]
    expected = [wavealign.plan(m, wave_size=8, skip="never").permutation for m in masks]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda m: wavealign.plan(m, wave_size=8, skip="never", threads=1).permutation, masks * 3))
    for k, permutation in enumerate(got):
        assert np.array_equal(permutation, expected[k % len(masks)])


def test_derived_launch_tensors_are_cached_within_a_bound(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    mask = torch.from_numpy(random_mask(rng, 2, 9, 9))
    plan = wavealign.plan(mask, wave_size=4, skip="never", block_size=16)
    cpu = torch.device("cpu")
    for batch in range(1, 21):
        row_ptr, col_idx, schedule, error = plan._launch_tensors(cpu, batch, 2, "concurrent-heads")
        assert error is None and len(plan._cache) <= 8
        assert np.array_equal(schedule.numpy(),
                              batch_schedule_oracle(plan.permutation.numpy(), batch, 2, "concurrent-heads"))
    assert plan._launch_tensors(cpu, 20, 2, "concurrent-heads")[2] is schedule  # kept: the same tensor
    with pytest.raises(ValueError, match="invalid argument 'mask_heads'"):
        plan._launch_tensors(cpu, 2, 3, "sequential")  # 2 mask heads: neither 3, 2*3 nor 1


def test_which_orders_have_a_gpu_plan():
    """The binding answers with the C++ rule (order_dispatch.cpp), every order name accepted."""
    from wavealign import _core

    gpu = {name for name in _core.enum_names("order") if _core.order_has_gpu_plan(name)}
    assert gpu == {"original", "s1", "s2", "wavealign", "shuffled", "com", "span"}
    with pytest.raises(ValueError, match="order"):
        _core.order_has_gpu_plan("zigzag")
