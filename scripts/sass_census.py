#!/usr/bin/env python3
"""Counts the SASS instructions of a kernel's steady-state loops, per KV block, by instruction class.

    scripts/sass_census.py FILE [--kernel SUBSTRING] [--tma-per-block 4] [--nvdisasm PATH] [--stalls] [--json]
    scripts/sass_census.py NEW --compare BASE [--cuobjdump PATH] [--rename REGEX=REPLACEMENT ...] [--json]

FILE is a cubin, an object file with an embedded sm_90a cubin (the build's .cu.o; extracted with
cuobjdump -xelf), or a listing that `nvdisasm -gi -c` wrote. The tool builds the control-flow graph of
every selected function, finds its loops and reports two of them:

- consumer: the innermost loop holding HGMMA instructions (one KV block per iteration: the S GEMM of block i
  and the PV GEMM of block i-1, then the softmax of block i);
- producer: the innermost loop holding at least --tma-per-block UTMALDG instructions (the compiler may
  unroll it; its count is divided by UTMALDG / --tma-per-block blocks per iteration).

The blocks of a loop body that dominate its latch run on every iteration ("main path"). The others are
grouped: "spin" (an mbarrier try-wait retry, run only while the data is not there), "divergent" (the
fallback after BRA.DIV, run only if the warp is not converged) and "conditional" (everything else, named by
the project source line they come from, e.g. the O rescale or the partial-block mask). Which conditional
groups run per block is data-dependent; the tool reports their sizes and leaves that to the reader.

--stalls also reads each instruction's control word (`nvdisasm -hex`; a listing must have been written with
it) and sums the stall counts the compiler scheduled on the consumer's main path, per class and per project
source line: the cycles a warp waits after each instruction before it may issue the next, i.e. the
fixed-latency dependencies and pipe pacing of its static schedule (not the scoreboard waits on memory, MUFU or
wgmma results, which are dynamic). Where the loop has them, it also splits that sum at the attention loop's
landmarks: the GEMM issue up to `wgmma wait 1` (S ready), the row max up to the first MUFU.EX2, the exp2 phase
up to the last one, and the rest.

--compare is the proof that a refactoring changed no machine code: NEW and BASE are object files (or two
directories holding the same relative paths of *.o, e.g. two builds' CMakeFiles), disassembled with
`cuobjdump -sass` for every architecture they carry. Functions are paired by name, with the hash that nvcc puts
into anonymous namespaces left out; --rename REGEX=REPLACEMENT maps renamed ones (applied to NEW's mangled
names, e.g. to drop a template argument that was added). Each pair is reported as identical (the same instructions in the
same order, addresses and encodings aside), reordered (the same instructions in another order), reallocated
(the same opcodes, other registers or operands) or different (with the opcode counts that differ); functions
without a partner are listed.
"""

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;")
LABEL = re.compile(r"^(\.L_x_\d+):")
CONTROL_WORD = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")  # the upper half of an -hex encoding
LINE_INFO = re.compile(r'//## File "([^"]+)", line (\d+)')
FUNCTION = re.compile(r"^\.text\.(\S+):")
TARGET = re.compile(r"`\((\.L_x_\d+)\)")

# Instruction classes, first match wins (on the opcode's first component).
CLASSES = [
    ("HGMMA", {"HGMMA"}),
    ("wgmma fence/wait", {"WARPGROUP"}),
    ("FFMA", {"FFMA"}),
    ("FMUL", {"FMUL"}),
    ("FADD", {"FADD"}),
    ("FMNMX", {"FMNMX"}),
    ("fp compare/select", {"FSETP", "FSEL", "FCHK"}),
    ("conversion", {"F2FP", "F2F", "I2F", "F2I", "FRND", "I2FP", "F2IP"}),
    ("SHFL", {"SHFL"}),
    ("vote/redux", {"VOTE", "VOTEU", "MATCH", "REDUX", "ELECT"}),
    ("barrier/mbarrier", {"SYNCS", "BAR", "ARRIVES", "MEMBAR", "FENCE", "DEPBAR", "NANOSLEEP"}),
    ("branch/reconvergence", {"WARPSYNC", "BSSY", "BSYNC", "BRA", "BRX", "JMP", "CALL", "RET", "EXIT", "YIELD"}),
    ("predicate", {"PLOP3", "P2R", "R2P", "ISETP", "PSETP"}),
    ("TMA", {"UTMALDG", "UTMAPF", "UTMASTG", "UBLKCP"}),
    ("memory", {"LDS", "STS", "LDG", "STG", "LDC", "LD", "ST", "ATOM", "ATOMS", "ATOMG", "RED", "LDSM", "STSM",
                "LDL", "STL"}),
    ("nop", {"NOP"}),
]


def classify(opcode):
    base = opcode.split(".")[0]
    if base == "MUFU":
        return "MUFU." + opcode.split(".")[1]
    for name, opcodes in CLASSES:
        if base in opcodes:
            return name
    if base.startswith("U") or base in ("R2UR", "S2UR"):
        return "uniform datapath"
    return "integer/move"


def stall_cycles(control_word):
    """The stall count of a Volta-and-later control word: bits 105-108 of the 128-bit encoding (41-44 of its
    upper half), the cycles before the warp's next instruction may issue."""
    return (control_word >> 41) & 0xF


def parse_listing(text):
    """Functions of an `nvdisasm -gi -c [-hex]` listing: name -> {instrs: [...], labels: {label: index}}; with
    -hex each instruction also has its "control" word (the encoding's upper half)."""
    functions = collections.OrderedDict()
    current, pending, chain = None, [], []
    for line in text.splitlines():
        match = FUNCTION.match(line)
        if match:
            current = functions.setdefault(match.group(1), {"instrs": [], "labels": {}})
            pending, chain = [], []
            continue
        if current is None:
            continue
        match = LABEL.match(line)
        if match:
            current["labels"][match.group(1)] = len(current["instrs"])
            continue
        match = LINE_INFO.search(line)
        if match:
            pending.append((match.group(1), int(match.group(2))))
            continue
        match = CONTROL_WORD.match(line)
        if match and current["instrs"]:
            current["instrs"][-1]["control"] = int(match.group(1), 16)
            continue
        match = INSTRUCTION.match(line)
        if match:
            if pending:
                chain, pending = pending, []
            current["instrs"].append({"addr": int(match.group(1), 16), "pred": (match.group(2) or "").strip(),
                                      "op": match.group(3), "args": match.group(4), "chain": chain})
    return functions


class Graph:
    """Basic blocks of one function with successor edges; `divergent` holds the BRA.DIV edges."""

    def __init__(self, function):
        instrs, labels = function["instrs"], function["labels"]
        starts = {0} | set(labels.values())
        for i, ins in enumerate(instrs):
            if ins["op"].split(".")[0] in ("BRA", "BRX", "JMP", "EXIT", "RET") and i + 1 < len(instrs):
                starts.add(i + 1)
        starts = sorted(s for s in starts if s < len(instrs))
        self.instrs = instrs
        self.blocks = [(s, starts[k + 1] if k + 1 < len(starts) else len(instrs)) for k, s in enumerate(starts)]
        block_at = {s: b for b, (s, _) in enumerate(self.blocks)}
        self.succ = collections.defaultdict(set)
        self.divergent = collections.defaultdict(set)
        for b, (_, end) in enumerate(self.blocks):
            last = instrs[end - 1]
            base = last["op"].split(".")[0]
            target = TARGET.search(last["args"])
            if target and base in ("BRA", "JMP", "CALL"):
                t = block_at[labels[target.group(1)]]
                self.succ[b].add(t)
                if ".DIV" in last["op"]:
                    self.divergent[b].add(t)
            always_taken = base in ("BRA", "JMP", "EXIT", "RET") and not last["pred"] and ".DIV" not in last["op"] \
                and ".ANY" not in last["op"]
            if not always_taken and b + 1 < len(self.blocks):
                self.succ[b].add(b + 1)
        self.pred = collections.defaultdict(set)
        for b, targets in list(self.succ.items()):
            for t in targets:
                self.pred[t].add(b)

    def size(self, b):
        start, end = self.blocks[b]
        return end - start

    def ops(self, b):
        start, end = self.blocks[b]
        return self.instrs[start:end]

    def dominators(self, skip_divergent):
        """Dominator sets from block 0, optionally ignoring the BRA.DIV edges."""
        succ = {b: (s - self.divergent[b] if skip_divergent else s) for b, s in self.succ.items()}
        reach, stack = set(), [0]
        while stack:
            b = stack.pop()
            if b not in reach:
                reach.add(b)
                stack.extend(succ.get(b, ()))
        pred = collections.defaultdict(set)
        for b, targets in succ.items():
            for t in targets:
                if b in reach:
                    pred[t].add(b)
        dom = {b: set(reach) for b in reach}
        dom[0] = {0}
        changed = True
        while changed:
            changed = False
            for b in sorted(reach - {0}):
                new = set.intersection(*(dom[p] for p in pred[b])) | {b} if pred[b] else {b}
                if new != dom[b]:
                    dom[b], changed = new, True
        return dom

    def loops(self):
        """Natural loops (header, latch, body) of the back edges, innermost (smallest) first."""
        dom = self.dominators(skip_divergent=False)
        found = []
        for latch, targets in self.succ.items():
            for header in targets:
                if latch in dom and header in dom[latch]:
                    body, stack = {header, latch}, [latch] if latch != header else []
                    while stack:
                        for p in self.pred[stack.pop()]:
                            if p not in body:
                                body.add(p)
                                stack.append(p)
                    found.append((header, latch, body))
        return sorted(found, key=lambda loop: sum(self.size(b) for b in loop[2]))


def source_site(chain, project):
    """The innermost frame of the project's sources (file:line), else the innermost frame."""
    for path, line in chain:
        if project in path:
            return path.split(project, 1)[1] + ":" + str(line)
    return (os.path.basename(chain[0][0]) + ":" + str(chain[0][1])) if chain else "?"


def is_spin(graph, b):
    ops = [i["op"] for i in graph.ops(b)]
    waits = any(op.startswith("SYNCS.PHASECHK") for op in ops)
    return (waits and b in graph.succ[b]) or (len(ops) == 1 and ops[0] == "BRA" and
                                               any(is_spin(graph, p) for p in graph.pred[b] if p != b))


PHASES = ("GEMM issue, up to wgmma wait 1", "up to the first exp2", "exp2 phase", "after the last exp2")


def stall_phases(instrs):
    """The main path's stall cycles (instructions in address order) split at an attention loop's landmarks: the
    `WARPGROUP.DEPBAR.LE gsb0, 0x1` that makes S ready, the first and the last MUFU.EX2; {} without them."""
    waits = [n for n, i in enumerate(instrs) if i["op"] == "WARPGROUP.DEPBAR.LE" and i["args"].endswith("0x1")]
    exps = [n for n, i in enumerate(instrs) if i["op"] == "MUFU.EX2"]
    if not waits or not exps or exps[0] <= waits[0]:
        return {}
    cuts = (0, waits[0] + 1, exps[0], exps[-1] + 1, len(instrs))
    return collections.OrderedDict(
        (name, sum(stall_cycles(i["control"]) for i in instrs[cuts[k]:cuts[k + 1]])) for k, name in enumerate(PHASES))


def census(graph, loop, project):
    """Class counts of the loop's main path and its groups of other blocks."""
    header, latch, body = loop
    main_dom = graph.dominators(skip_divergent=True)
    main = [b for b in body if b in main_dom.get(latch, ())]
    # Blocks reachable from a BRA.DIV target without passing through the main path.
    divergent, stack = set(), [t for b in body for t in graph.divergent[b]]
    while stack:
        b = stack.pop()
        if b in body and b not in divergent and b not in main:
            divergent.add(b)
            stack.extend(graph.succ[b])
    result = {"main": collections.Counter(), "groups": collections.OrderedDict()}
    for b in main:
        result["main"].update(classify(i["op"]) for i in graph.ops(b))
    controls = [i.get("control") for b in main for i in graph.ops(b)]
    if controls and all(c is not None for c in controls):
        result["main_stall_cycles"] = collections.Counter()
        result["main_stall_cycles_by_line"] = collections.Counter()
        for b in main:
            for i in graph.ops(b):
                result["main_stall_cycles"][classify(i["op"])] += stall_cycles(i["control"])
                result["main_stall_cycles_by_line"][source_site(i["chain"], project)] += stall_cycles(i["control"])
        phases = stall_phases([i for b in sorted(main, key=lambda b: graph.blocks[b][0]) for i in graph.ops(b)])
        if phases:
            result["main_stall_cycles_by_phase"] = phases
    for b in sorted(set(body) - set(main), key=lambda b: graph.blocks[b][0]):
        if is_spin(graph, b):
            key = "spin"
        elif b in divergent:
            key = "divergent"
        else:
            sites = collections.Counter(source_site(i["chain"], project) for i in graph.ops(b))
            key = "conditional " + sites.most_common(1)[0][0]
        group = result["groups"].setdefault(key, collections.Counter())
        group.update(classify(i["op"]) for i in graph.ops(b))
    return result


def pick_loops(graph, tma_per_block):
    """(consumer loop, producer loop, producer blocks per iteration); None where there is none."""
    def count(body, opcode):
        return sum(1 for b in body for i in graph.ops(b) if i["op"].split(".")[0] == opcode)

    loops = graph.loops()
    consumer = next((loop for loop in loops if count(loop[2], "HGMMA")), None)
    producer = next((loop for loop in loops if count(loop[2], "UTMALDG") >= tma_per_block), None)
    per_iteration = count(producer[2], "UTMALDG") / tma_per_block if producer else 0
    return consumer, producer, per_iteration


def disassemble(path, nvdisasm, hex_words=False):
    """The `nvdisasm -gi -c` (with hex_words: -hex) listing of a cubin, an object file or an existing listing."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        with open(path) as f:
            return f.read()
    flags = ["-gi", "-c"] + (["-hex"] if hex_words else [])
    tool = nvdisasm or shutil.which("nvdisasm")
    if not tool:
        raise SystemExit("sass_census: nvdisasm not found (--nvdisasm PATH or put the CUDA toolkit's bin on PATH)")
    try:
        return subprocess.run([tool, *flags, path], check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError:
        pass  # not a cubin: a host object with an embedded fatbinary
    cuobjdump = os.path.join(os.path.dirname(tool), "cuobjdump")
    if not os.path.exists(cuobjdump):
        cuobjdump = shutil.which("cuobjdump")
    if not cuobjdump:
        raise SystemExit("sass_census: " + path + " is not a cubin and cuobjdump (to extract one) was not found")
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([cuobjdump, "-xelf", "all", os.path.abspath(path)], check=True, cwd=work, capture_output=True)
        cubins = sorted(f for f in os.listdir(work) if "sm_90" in f and f.endswith(".cubin"))
        if not cubins:
            raise SystemExit("sass_census: no sm_90 cubin in " + path)
        return "".join(subprocess.run([tool, *flags, os.path.join(work, c)], check=True, capture_output=True,
                                      text=True).stdout for c in cubins)


def report(listing, kernel, tma_per_block, project):
    out = {}
    for name, function in parse_listing(listing).items():
        if kernel not in name:
            continue
        graph = Graph(function)
        consumer, producer, per_iteration = pick_loops(graph, tma_per_block)
        entry = {}
        if consumer:
            entry["consumer_per_warp_per_block"] = census(graph, consumer, project)
        if producer:
            counted = census(graph, producer, project)
            scale = lambda c: collections.Counter({k: v / per_iteration for k, v in c.items()})
            counted["main"] = scale(counted["main"])
            counted["groups"] = collections.OrderedDict((k, scale(v)) for k, v in counted["groups"].items())
            entry["producer_per_block"] = counted
            entry["producer_blocks_per_iteration"] = per_iteration
        out[name] = entry
    return out


def print_report(result):
    for name, entry in result.items():
        print(name)
        for part in ("consumer_per_warp_per_block", "producer_per_block"):
            if part not in entry:
                continue
            counted = entry[part]
            note = ""
            if part.startswith("producer"):
                note = f" ({entry['producer_blocks_per_iteration']:g} blocks per iteration)"
            executed = sum(counted["main"].values()) + sum(
                sum(g.values()) for k, g in counted["groups"].items() if k.startswith("conditional"))
            print(f"  {part}{note}: main path {sum(counted['main'].values()):g}, "
                  f"main path + every conditional group {executed:g}")
            for cls, n in sorted(counted["main"].items(), key=lambda kv: -kv[1]):
                print(f"    {cls:22s} {n:g}")
            for key, group in counted["groups"].items():
                classes = ", ".join(f"{c} {n:g}" for c, n in sorted(group.items(), key=lambda kv: -kv[1]))
                print(f"  + {key}: {sum(group.values()):g} ({classes})")
            stalls = counted.get("main_stall_cycles")
            if stalls is not None:
                print(f"  static stall cycles on the main path: {sum(stalls.values()):g}")
                for cls, n in sorted(stalls.items(), key=lambda kv: -kv[1]):
                    print(f"    {cls:22s} {n:g} over {counted['main'][cls]:g} instructions")
                for site, n in counted["main_stall_cycles_by_line"].most_common(8):
                    print(f"    at {site}: {n:g}")
                for phase, n in counted.get("main_stall_cycles_by_phase", {}).items():
                    print(f"    phase {phase}: {n:g}")


SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;")
ANONYMOUS_NAMESPACE = re.compile(r"_GLOBAL__N__[0-9a-f]+_")


def sass_functions(text, renames=()):
    """{(architecture, function name): [instruction text]} of a `cuobjdump -sass` listing; names without nvcc's
    anonymous-namespace hash and with the (regex, replacement) renames applied."""
    functions, arch, current = {}, None, None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("code for sm_"):
            arch = stripped.split()[-1]
        elif stripped.startswith("Function : "):
            name = ANONYMOUS_NAMESPACE.sub("_GLOBAL__N__", stripped[len("Function : "):])
            for pattern, replacement in renames:
                name = re.sub(pattern, replacement, name)
            current = functions.setdefault((arch, name), [])
        elif current is not None:
            match = SASS_LINE.match(line)
            if match:
                current.append(re.sub(r"\s+", " ", match.group(1)))
    return functions


def compare_function(base, new):
    """identical, reordered, reallocated or different (with the opcode counts that differ)."""
    if base == new:
        return "identical", None
    if sorted(base) == sorted(new):
        return "reordered", None
    opcode = lambda instruction: re.sub(r"^@!?U?P[T0-9]+ ", "", instruction).split(" ")[0]
    base_ops, new_ops = collections.Counter(map(opcode, base)), collections.Counter(map(opcode, new))
    if base_ops == new_ops:
        return "reallocated", None
    delta = {op: new_ops[op] - base_ops[op] for op in sorted(set(base_ops) | set(new_ops)) if new_ops[op] != base_ops[op]}
    return "different", delta


def compare_objects(base_path, new_path, cuobjdump, renames):
    """The comparison of one object file pair: {"functions": [...], "unpaired": [...]}"""
    def listing(path):
        return subprocess.run([cuobjdump, "-sass", path], check=True, capture_output=True, text=True).stdout
    base, new = sass_functions(listing(base_path)), sass_functions(listing(new_path), renames)
    functions = []
    for key in base:
        if key in new:
            verdict, delta = compare_function(base[key], new[key])
            functions.append({"arch": key[0], "function": key[1], "instructions": len(new[key]), "verdict": verdict,
                              **({"opcode_delta": delta} if delta else {})})
    unpaired = [{"side": side, "arch": k[0], "function": k[1]} for side, mine, other in
                (("base", base, new), ("new", new, base)) for k in mine if k not in other]
    return {"functions": functions, "unpaired": unpaired}


def compare(new, base, cuobjdump, renames):
    """{relative path: compare_objects(...)} over the object files of BASE (a file or a directory)."""
    tool = cuobjdump or shutil.which("cuobjdump")
    if not tool:
        raise SystemExit("sass_census: cuobjdump not found (--cuobjdump PATH or put the CUDA toolkit's bin on PATH)")
    if os.path.isfile(base):
        return {os.path.basename(new): compare_objects(base, new, tool, renames)}
    out = {}
    for root, _, files in sorted(os.walk(base)):
        for name in sorted(files):
            if not name.endswith(".o"):
                continue
            relative = os.path.relpath(os.path.join(root, name), base)
            partner = os.path.join(new, relative)
            if not os.path.exists(partner):
                out[relative] = {"missing": "new"}
                continue
            out[relative] = compare_objects(os.path.join(root, name), partner, tool, renames)
    if not out:
        raise SystemExit("sass_census: no object files under " + base)
    return out


def print_comparison(result):
    totals = collections.Counter()
    for path, entry in result.items():
        if "missing" in entry:
            print(f"{path}: no counterpart in the new build")
            totals["missing objects"] += 1
            continue
        verdicts = collections.Counter(f["verdict"] for f in entry["functions"])
        totals.update(verdicts)
        totals["unpaired"] += len(entry["unpaired"])
        summary = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
        print(f"{path}: {len(entry['functions'])} functions: {summary or 'none'}")
        for f in entry["functions"]:
            if f["verdict"] != "identical":
                delta = " ".join(f"{op} {n:+d}" for op, n in f.get("opcode_delta", {}).items())
                print(f"  {f['verdict']} [{f['arch']}] {f['function']}" + (f" ({delta})" if delta else ""))
        for u in entry["unpaired"]:
            print(f"  only in {u['side']} [{u['arch']}] {u['function']}")
    print("total: " + ", ".join(f"{n} {v}" for v, n in sorted(totals.items()) if n))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="cubin, object file with an sm_90a cubin, or an nvdisasm -gi -c listing")
    parser.add_argument("--kernel", default="fwd_kernel_sm90", help="substring of the function names to report")
    parser.add_argument("--tma-per-block", type=int, default=4,
                        help="UTMALDG instructions per KV block (K and V, one per 64-column box: 4 at d = 128)")
    parser.add_argument("--project", default="src/cuda/", help="path fragment of the project's sources")
    parser.add_argument("--nvdisasm", help="nvdisasm to use (default: the one on PATH)")
    parser.add_argument("--stalls", action="store_true",
                        help="also sum the compiler's stall counts on the consumer's main path (needs -hex words)")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    parser.add_argument("--compare", metavar="BASE",
                        help="compare FILE's SASS with BASE's, function by function (files or build directories)")
    parser.add_argument("--cuobjdump", help="cuobjdump to use for --compare (default: the one on PATH)")
    parser.add_argument("--rename", action="append", default=[], metavar="REGEX=REPLACEMENT",
                        help="--compare: rewrite FILE's function names before pairing them (repeatable)")
    args = parser.parse_args(argv)
    if args.compare:
        renames = []
        for rename in args.rename:
            if "=" not in rename:
                parser.error("--rename takes REGEX=REPLACEMENT, got %r" % rename)
            renames.append(tuple(rename.split("=", 1)))
        result = compare(args.file, args.compare, args.cuobjdump, renames)
        if args.json:
            json.dump(result, sys.stdout, indent=1)
            print()
        else:
            print_comparison(result)
        return
    if args.tma_per_block < 1:
        parser.error("--tma-per-block must be >= 1, got %d" % args.tma_per_block)
    result = report(disassemble(args.file, args.nvdisasm, hex_words=args.stalls), args.kernel, args.tma_per_block,
                    args.project)
    if args.stalls and not any("main_stall_cycles" in entry.get("consumer_per_warp_per_block", {})
                               for entry in result.values()):
        raise SystemExit("sass_census: --stalls needs the instructions' control words (a listing written by "
                         "nvdisasm -hex, or a cubin / object file)")
    if not result:
        raise SystemExit("sass_census: no function matching --kernel " + repr(args.kernel) + " in " + args.file)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        print_report(result)


if __name__ == "__main__":
    main()
