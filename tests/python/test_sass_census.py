"""scripts/sass_census.py on hand-written nvdisasm listings: loop selection, main path, groups, per-block scaling."""

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "sass_census.py"
spec = importlib.util.spec_from_file_location("sass_census", SCRIPT)
sass_census = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_census)

SRC = '\t//## File "/repo/src/cuda/attention/sm90/mainloop.cuh", line {}\n'

# A consumer loop: HGMMA + FFMA, a shuffle behind BRA.DIV (divergent fallback at .L_x_5), an mbarrier wait
# with its retry loop out of line (.L_x_3), and a vote-guarded FMUL from line 20 (the conditional group).
CONSUMER = (
    ".text.fwd_kernel_sm90_test:\n" + SRC.format(10) +
    "        /*0000*/                   MOV R1, RZ ;\n"
    ".L_x_1:\n"
    "        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;\n"
    "        /*0020*/                   FFMA R2, R2, R3, R4 ;\n"
    "        /*0030*/                   BRA.DIV UR4, `(.L_x_5) ;\n"
    "        /*0040*/                   SHFL.BFLY PT, R5, R2, 0x1, 0x1f ;\n"
    ".L_x_6:\n"
    "        /*0050*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R0+URZ+0x10], R3 ;\n"
    "        /*0060*/              @!P0 BRA `(.L_x_3) ;\n"
    ".L_x_7:\n"
    "        /*0070*/                   VOTE.ALL P1, P1 ;\n"
    "        /*0080*/               @P1 BRA `(.L_x_2) ;\n" + SRC.format(20) +
    "        /*0090*/                   FMUL R6, R6, R7 ;\n"
    ".L_x_2:\n" + SRC.format(10) +
    "        /*00a0*/                   ISETP.NE.AND P2, PT, R8, R9, PT ;\n"
    "        /*00b0*/               @P2 BRA `(.L_x_1) ;\n"
    "        /*00c0*/                   EXIT ;\n"
    ".L_x_3:\n"
    "        /*00d0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R0+URZ+0x10], R3 ;\n"
    "        /*00e0*/              @!P0 BRA `(.L_x_3) ;\n"
    "        /*00f0*/                   BRA `(.L_x_7) ;\n"
    ".L_x_5:\n"
    "        /*0100*/                   SHFL.BFLY PT, R5, R2, 0x1, 0x1f ;\n"
    "        /*0110*/                   BRA `(.L_x_6) ;\n"
)

# A producer loop unrolled twice: two KV blocks (2 x 4 UTMALDG) per iteration.
PRODUCER = (
    ".text.fwd_kernel_sm90_producer:\n" + SRC.format(30) +
    "        /*0000*/                   MOV R1, RZ ;\n"
    ".L_x_1:\n" +
    "".join(f"        /*{0x10 * (i + 1):04x}*/                   UTMALDG.3D [UR8], [UR14], desc[UR16] ;\n"
            for i in range(8)) +
    "        /*0090*/                   UIADD3 UR4, UR4, 0x2, URZ ;\n"
    "        /*00a0*/                   ISETP.NE.AND P0, PT, R2, R3, PT ;\n"
    "        /*00b0*/               @P0 BRA `(.L_x_1) ;\n"
    "        /*00c0*/                   EXIT ;\n"
)


def test_classes():
    assert sass_census.classify("MUFU.EX2") == "MUFU.EX2"
    assert sass_census.classify("F2FP.BF16.F32.PACK_AB") == "conversion"
    assert sass_census.classify("R2UR") == "uniform datapath"
    assert sass_census.classify("UIADD3.64") == "uniform datapath"
    assert sass_census.classify("UTMALDG.3D") == "TMA"
    assert sass_census.classify("IMAD.MOV.U32") == "integer/move"
    assert sass_census.classify("WARPGROUP.DEPBAR.LE") == "wgmma fence/wait"


def test_consumer_main_path_and_groups():
    result = sass_census.report(CONSUMER, "fwd_kernel_sm90", 4, "src/cuda/")
    counted = result["fwd_kernel_sm90_test"]["consumer_per_warp_per_block"]
    # HGMMA, FFMA, BRA.DIV | SHFL | TRYWAIT, BRA | VOTE, BRA | ISETP, BRA: the blocks that dominate the latch.
    assert sum(counted["main"].values()) == 10
    assert counted["main"]["HGMMA"] == 1 and counted["main"]["SHFL"] == 1 and counted["main"]["FMUL"] == 0
    groups = counted["groups"]
    assert dict(groups["conditional attention/sm90/mainloop.cuh:20"]) == {"FMUL": 1}
    assert sum(groups["spin"].values()) == 3  # the retry block and its jump back
    assert sum(groups["divergent"].values()) == 2  # the shuffle fallback after BRA.DIV
    assert "producer_per_block" not in result["fwd_kernel_sm90_test"]


def test_producer_scaled_per_block():
    entry = sass_census.report(PRODUCER, "producer", 4, "src/cuda/")["fwd_kernel_sm90_producer"]
    assert entry["producer_blocks_per_iteration"] == 2
    counted = entry["producer_per_block"]
    assert counted["main"]["TMA"] == 4
    assert sum(counted["main"].values()) == pytest.approx(11 / 2)


def test_listing_file_and_errors(tmp_path, capsys):
    listing = tmp_path / "kernel.dis"
    listing.write_text(CONSUMER)
    sass_census.main([str(listing), "--json"])
    assert '"consumer_per_warp_per_block"' in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no function matching --kernel 'missing'"):
        sass_census.main([str(listing), "--kernel", "missing"])
    with pytest.raises(SystemExit):
        sass_census.main([str(listing), "--tma-per-block", "0"])
    assert "--tma-per-block must be >= 1, got 0" in capsys.readouterr().err


def hex_words(listing, stalls):
    """`listing` as nvdisasm -hex writes it: after each instruction its encoding's upper half, here holding
    the given stall counts (bits 41-44) in order."""
    out, counts = [], iter(stalls)
    for line in listing.splitlines():
        out.append(line)
        if sass_census.INSTRUCTION.match(line):
            out.append(f"                                   /* 0x{next(counts) << 41:016x} */")
    return "\n".join(out) + "\n"


def test_stalls_sum_the_main_path_per_class_and_line(tmp_path, capsys):
    # Main path: MOV is before the loop; HGMMA 3, FFMA 5, BRA.DIV 1, SHFL 9, SYNCS 2, @!P0 BRA 1, VOTE 4,
    # @P1 BRA 1, ISETP 6, @P2 BRA 2 -> 34 (the FMUL's 7 at line 20 and the out-of-line blocks are not on it).
    stalls = [1, 3, 5, 1, 9, 2, 1, 4, 1, 7, 6, 2, 1, 1, 1, 1, 1, 1]
    listing = tmp_path / "consumer.sass"
    listing.write_text(hex_words(CONSUMER, stalls))
    consumer = sass_census.report(listing.read_text(), "fwd_kernel_sm90", 4, "src/cuda/")[
        "fwd_kernel_sm90_test"]["consumer_per_warp_per_block"]
    assert sum(consumer["main_stall_cycles"].values()) == 34
    assert consumer["main_stall_cycles"]["HGMMA"] == 3 and consumer["main_stall_cycles"]["FFMA"] == 5
    assert consumer["main_stall_cycles_by_line"]["attention/sm90/mainloop.cuh:10"] == 34
    assert sass_census.main([str(listing), "--stalls"]) is None
    assert "static stall cycles on the main path: 34" in capsys.readouterr().out


def test_stalls_need_control_words(tmp_path):
    listing = tmp_path / "consumer.sass"
    listing.write_text(CONSUMER)
    with pytest.raises(SystemExit, match="control words"):
        sass_census.main([str(listing), "--stalls"])


# An attention loop's landmarks: the S GEMM and its wait 1, the row max, two exp2s with a row sum between, the P
# conversion after them.
SOFTMAX = (
    ".text.fwd_kernel_sm90_softmax:\n" + SRC.format(10) +
    "        /*0000*/                   MOV R1, RZ ;\n"
    ".L_x_1:\n"
    "        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;\n"
    "        /*0020*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;\n"
    "        /*0030*/                   FMNMX R2, R24, R25, !PT ;\n"
    "        /*0040*/                   MUFU.EX2 R3, R3 ;\n"
    "        /*0050*/                   FADD R4, R4, R3 ;\n"
    "        /*0060*/                   MUFU.EX2 R5, R5 ;\n"
    "        /*0070*/                   F2FP.BF16.F32.PACK_AB R6, R5, R3 ;\n"
    "        /*0080*/               @P0 BRA `(.L_x_1) ;\n"
    "        /*0090*/                   EXIT ;\n"
)


def test_stalls_split_at_the_attention_loops_landmarks(tmp_path, capsys):
    # MOV 1 (before the loop); HGMMA 2 + DEPBAR 3 | FMNMX 4 | EX2 1 + FADD 7 + EX2 1 | F2FP 2 + BRA 5.
    stalls = [1, 2, 3, 4, 1, 7, 1, 2, 5, 1]
    listing = tmp_path / "softmax.sass"
    listing.write_text(hex_words(SOFTMAX, stalls))
    consumer = sass_census.report(listing.read_text(), "fwd_kernel_sm90", 4, "src/cuda/")[
        "fwd_kernel_sm90_softmax"]["consumer_per_warp_per_block"]
    assert list(consumer["main_stall_cycles_by_phase"].values()) == [5, 4, 9, 7]
    assert sum(consumer["main_stall_cycles_by_phase"].values()) == sum(consumer["main_stall_cycles"].values())
    assert sass_census.main([str(listing), "--stalls"]) is None
    assert "phase exp2 phase: 9" in capsys.readouterr().out


def test_no_phases_without_the_landmarks(tmp_path):
    listing = tmp_path / "consumer.sass"
    listing.write_text(hex_words(CONSUMER, [1] * 18))
    consumer = sass_census.report(listing.read_text(), "fwd_kernel_sm90", 4, "src/cuda/")[
        "fwd_kernel_sm90_test"]["consumer_per_warp_per_block"]
    assert "main_stall_cycles_by_phase" not in consumer


# `cuobjdump -sass` listings for --compare: two architectures, an anonymous namespace with nvcc's hash.
LISTING = """
Fatbin elf code:
================
arch = sm_90a
\tcode for sm_90
\t\tFunction : _ZN2wa44_GLOBAL__N__{hash}_6kernel_cuE1fv
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                   /* 0x00000a00ff017b82 */
                                                                          /* 0x000fe20000000800 */
        /*0010*/                   {first} ;                                /* 0x0000000000007919 */
        /*0020*/                   {second} ;                               /* 0x0000000000007919 */
        /*0030*/                   EXIT ;                                   /* 0x000000000000794d */
\t\tFunction : _ZN2wa6kernelI{tuning}EEvv
        /*0000*/                   @!P0 BRA 0x40 ;                          /* 0x0000000000007947 */
        /*0010*/                   EXIT ;                                   /* 0x000000000000794d */
Fatbin elf code:
================
arch = sm_80
\tcode for sm_80
\t\tFunction : _ZN2wa44_GLOBAL__N__{hash}_6kernel_cuE1fv
        /*0000*/                   EXIT ;                                   /* 0x000000000000794d */
"""


def listing(hash_="81c321ef", first="S2R R14, SR_TID.X", second="IADD3 R2, R14, 0x1, RZ", tuning="Li1E"):
    return LISTING.format(hash=hash_, first=first, second=second, tuning=tuning)


def test_sass_functions_per_architecture_without_addresses_and_hashes():
    functions = sass_census.sass_functions(listing())
    assert set(functions) == {("sm_90", "_ZN2wa44_GLOBAL__N__6kernel_cuE1fv"), ("sm_90", "_ZN2wa6kernelILi1EEEvv"),
                              ("sm_80", "_ZN2wa44_GLOBAL__N__6kernel_cuE1fv")}
    assert functions[("sm_90", "_ZN2wa44_GLOBAL__N__6kernel_cuE1fv")] == [
        "LDC R1, c[0x0][0x28]", "S2R R14, SR_TID.X", "IADD3 R2, R14, 0x1, RZ", "EXIT"]
    assert functions[("sm_90", "_ZN2wa6kernelILi1EEEvv")] == ["@!P0 BRA 0x40", "EXIT"]
    renamed = sass_census.sass_functions(listing(tuning="Li1ENS_6TuningE"), [("NS_6TuningE", "")])
    assert ("sm_90", "_ZN2wa6kernelILi1EEEvv") in renamed


def test_compare_function_verdicts():
    a = ["S2R R14, SR_TID.X", "IADD3 R2, R14, 0x1, RZ", "EXIT"]
    assert sass_census.compare_function(a, list(a)) == ("identical", None)
    assert sass_census.compare_function(a, [a[1], a[0], a[2]]) == ("reordered", None)
    assert sass_census.compare_function(a, ["S2R R15, SR_TID.X", "IADD3 R2, R15, 0x1, RZ", "EXIT"]) == \
        ("reallocated", None)
    assert sass_census.compare_function(a, ["S2R R14, SR_TID.X", "@P0 IADD3 R2, R14, 0x2, RZ", "EXIT"]) == \
        ("reallocated", None)
    verdict, delta = sass_census.compare_function(a, ["S2R R14, SR_TID.X", "NOP", "EXIT"])
    assert verdict == "different" and delta == {"IADD3": -1, "NOP": 1}


def test_compare_builds(tmp_path, capsys):
    # A stand-in for cuobjdump: `-sass FILE` prints the listing stored in FILE.
    tool = tmp_path / "cuobjdump"
    tool.write_text("#!/bin/sh\ncat \"$2\"\n")
    tool.chmod(0o755)
    for side, hash_, second, tuning in (("base", "81c321ef", "IADD3 R2, R14, 0x1, RZ", "Li1E"),
                                        ("new", "1d6bd670", "IADD3 R2, R14, 0x2, RZ", "Li1ENS_6TuningE")):
        (tmp_path / side / "dir").mkdir(parents=True)
        (tmp_path / side / "dir" / "kernel.cu.o").write_text(listing(hash_, second=second, tuning=tuning))
    (tmp_path / "base" / "dir" / "only_base.cu.o").write_text(listing())
    sass_census.main([str(tmp_path / "new"), "--compare", str(tmp_path / "base"), "--cuobjdump", str(tool),
                      "--rename", "NS_6TuningE="])
    out = capsys.readouterr().out
    assert "dir/kernel.cu.o: 3 functions: 2 identical, 1 reallocated" in out
    assert "reallocated [sm_90] _ZN2wa44_GLOBAL__N__6kernel_cuE1fv" in out
    assert "dir/only_base.cu.o: no counterpart in the new build" in out
    assert out.rstrip().endswith("total: 2 identical, 1 missing objects, 1 reallocated")
    # Without the rename the tuned kernel has no partner on either side.
    sass_census.main([str(tmp_path / "new" / "dir" / "kernel.cu.o"), "--compare",
                      str(tmp_path / "base" / "dir" / "kernel.cu.o"), "--cuobjdump", str(tool)])
    out = capsys.readouterr().out
    assert "only in base [sm_90] _ZN2wa6kernelILi1EEEvv" in out
    assert "only in new [sm_90] _ZN2wa6kernelILi1ENS_6TuningEEEvv" in out
