#!/usr/bin/env bash
# The paper's kernel-level evaluation on the H200 (docs/evaluation.md: Fig. 2, Table I, Figs. 10, 11, 12, 14,
# 15), in one pass from a finished build: Wan2.1-14B 720p at 161, 241, 321 and 401 frames (147,600 to 363,600
# tokens), 4 heads, d = 128, bf16, blocks of 128, the four mask methods' GPU generators on the synthetic Q/K.
#
#   bench/gpu/run_evaluation.sh BUILD_DIR LOG_DIR [timing|ncu|orders|all]
#
# timing: the masks (BUILD_DIR/evaluation-masks, reused when present), our kernel's dense mode per length, our
#   kernel in the original, S1, S2 and WaveAlign order with the GPU plan's cost (bench_evaluation.py), FA4
#   through the plug-in path in the original and WaveAlign order (when flash_attn.cute imports; `source
#   bench/gpu/fa4_wheels.sh install DIR` first), head 0 of each 401-frame mask and plans (Fig. 14), and the
#   simulator on every mask (CPU, in the background).
# orders: the candidate row orders of docs/reordering.md (com, span, wave-union, hilbert; CPU-planned where the
#   order has no GPU plan) beside original / S2 / WaveAlign on every method's mask at 401 and 161 frames
#   (WA_ORDER_FRAMES=401 for the longest alone), on our
#   kernel and FA4, and the packed-rows bound of any order on our kernel (LOG_DIR/orders.jsonl); then the same
#   on our kernel at 401 frames under Nsight Compute (LOG_DIR/orders-ncu/; bench/gpu/collect_orders.py --ncu).
# ncu: Nsight Compute on the 401-frame cases, one launch each: every method x order (our kernel) and the FA4
#   original / WaveAlign pair, then our dense mode and a random mask at density 0.20 (Table I).
# Each part alone fits in one 10-minute call; both together are budgeted at 8 minutes. Every step runs under a
# timeout of its budget (printed first) and keeps what it wrote when it runs out. Writes LOG_DIR/{meta.jsonl,
# gpu.txt, steps.jsonl, masks.jsonl, dense.jsonl, timing.jsonl, simulate.jsonl, fig14/, ncu*.csv,
# ncu-cases.jsonl, errors.txt}; bench/gpu/collect_evaluation.py LOG_DIR makes the figures and the document.
set -u
build=${1:?usage: run_evaluation.sh BUILD_DIR LOG_DIR [timing|ncu|orders|all]}
logs=${2:?usage: run_evaluation.sh BUILD_DIR LOG_DIR [timing|ncu|orders|all]}
part=${3:-all}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$build" && pwd)
masks=${WA_EVAL_MASKS:-$build/evaluation-masks}
mkdir -p "$logs" "$masks"
logs=$(cd "$logs" && pwd)
cli=$build/wavealign
bench=$build/bench/wa_bench_attention
driver=$root/bench/gpu/bench_evaluation.py
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# FA4's compiled kernels persist across the timing and ncu processes (its JIT takes ~20 s per layout).
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$build/fa4-jit-cache"

frames_all=(401 321 241 161)  # longest first: a step that runs out of time loses the short lengths
methods=(xattention sparge minference flexprefill)
heads=4

# Each method's configuration (collect_evaluation.py --simulated reads this function too). XAttention as the
# paper states it (tau = 0.9, stride 8). The other three at the settings that give Table I's densities on the
# synthetic Q/K of these 4 heads at 401 frames (CPU references; docs/methods.md explains why the defaults do
# not): SpargeAttn with the similarity filter off (the default theta finds no similar block in the synthetic
# heads) and TopCdf tau = 0.96: 29.4 % (Table I 28.3 %); MInference with 200 vertical columns and 2,000
# diagonals: 18.6 % (18.3 %; its defaults are its LLM sizes); FlexPrefill with gamma = 0.965: 30.1 % (29.4 %;
# the paper's gamma = 0.60 covers the synthetic heads' mass with 2.3 % of the blocks).
method_flags() {
  case $1 in
    xattention) echo "--threshold 0.9 --stride 8" ;;
    sparge) echo "--simthreshd1 -1 --cdfthreshd 0.96" ;;
    minference) echo "--vertical-size 200 --slash-size 2000" ;;
    flexprefill) echo "--gamma 0.965" ;;
  esac
}

# Budgets in seconds: the timeout of each step (the estimates on the H200 are about half of each).
declare -A budget=([masks]=150 [dense]=25 [kernel]=75 [fa4]=120 [ncu]=130 [ncu-dense]=30 [simulate]=220 [orders]=240 [ncu-orders]=200)
timing_steps=(masks dense kernel fa4)
ncu_steps=(ncu ncu-dense)

# The masks of the given frame counts that are not there yet; each generator's JSON summary goes beside its
# mask and, on one line with its flags, into masks.jsonl.
make_masks() {
  local frames method stem
  for frames in "$@"; do
    for method in "${methods[@]}"; do
      stem=$masks/$method-$frames
      if [ ! -s "$stem.npy" ] || [ ! -s "$stem.json" ]; then
        # shellcheck disable=SC2046  # the flags are words
        "$cli" mask --method "$method" $(method_flags "$method") --model wan2.1-14b --frames "$frames" \
          --heads "$heads" --device gpu --out "$stem.npy" --json >"$stem.json" 2>>"$logs/errors.txt" \
          || rm -f "$stem.npy"
      fi
      [ -s "$stem.npy" ] && python3 -c 'import json, sys; row = json.load(open(sys.argv[1]));
row["flags"] = sys.argv[2]; print(json.dumps(row))' "$stem.json" "$(method_flags "$method")" >>"$logs/masks.jsonl"
    done
  done
}

# One profiled launch per case, clocks uncontrolled (the kernel runs as it does in the timing), caches flushed
# before each pass. L2 hit rate (ncu's "L2 Hit Rate"), HBM bytes read and written, HBM throughput as a share of
# its peak (ncu's DRAM SOL: the paper's HBM SOL), the duration and the SM clock of the launch.
metrics=lts__t_sector_hit_rate.pct,lts__t_sector_op_read_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second
profile=(ncu --clock-control none --cache-control all --metrics "$metrics" --csv)
frames_csv=$(IFS=,; echo "${frames_all[*]}")

run_step() {
  local frames method
  case $1 in
    masks) make_masks "${frames_all[@]}" ;;
    simulate)  # the simulator on every mask, on the CPU, beside the GPU steps
      for frames in "${frames_all[@]}"; do
        for method in "${methods[@]}"; do
          [ -s "$masks/$method-$frames.npy" ] || continue
          nice -n 19 "$cli" simulate --mask "$masks/$method-$frames.npy" --orders original,s1,s2,wavealign --json \
            2>>"$logs/errors.txt" | python3 -c 'import json, sys; row = json.load(sys.stdin);
row.update(method=sys.argv[1], frames=int(sys.argv[2])); print(json.dumps(row))' "$method" "$frames"
        done
      done >>"$logs/simulate.jsonl"
      # Table I's random row (the benchmark's random mask: seed 1, density 0.20, diagonal kept).
      nice -n 19 "$cli" simulate --model wan2.1-14b --frames 401 --heads "$heads" --mask random --density 0.20 \
        --seed 1 --orders original --json 2>>"$logs/errors.txt" | python3 -c 'import json, sys;
row = json.load(sys.stdin); row.update(method="random", frames=401); print(json.dumps(row))' >>"$logs/simulate.jsonl" ;;
    dense)  # our kernel's dense mode, one process (and one 2 s warm-up) per length
      for frames in "${frames_all[@]}"; do
        "$bench" --model wan2.1-14b --frames "$frames" --heads "$heads" --dense --cold-l2 --warmup 1 \
          --warmup-ms 2000 --iters 3 --json 2>>"$logs/errors.txt" | sed "s/^{/{\"frames\": $frames, /"
      done >>"$logs/dense.jsonl" ;;
    kernel)
      python3 "$driver" --masks "$masks" --frames "$frames_csv" --impls wavealign --iters 3 --warmup-ms 2000 \
        --fig14 "$logs/fig14" >>"$logs/timing.jsonl" 2>>"$logs/errors.txt" ;;
    fa4)
      python3 "$driver" --masks "$masks" --frames "$frames_csv" --impls flashattention4 --iters 3 \
        --warmup-ms 2000 >>"$logs/timing.jsonl" 2>>"$logs/errors.txt" ;;
    orders)  # issue 13's candidate orders on the methods' masks, our kernel and FA4 (docs/reordering.md)
      python3 "$driver" --masks "$masks" --frames "${WA_ORDER_FRAMES:-401,161}" --impls wavealign,flashattention4 --iters 3 \
        --warmup-ms 2000 --ceiling --orders original,s2,wavealign,com,span,wave-union,hilbert \
        --fa4-orders s2,wavealign,com,span,wave-union >>"$logs/orders.jsonl" 2>>"$logs/errors.txt" ;;
    ncu-orders)  # the same orders and bound under Nsight Compute, one launch each (LOG_DIR/orders-ncu/)
      make_masks 401
      mkdir -p "$logs/orders-ncu"
      "${profile[@]}" -k "regex:fwd_kernel_sm" python3 "$driver" --profile --masks "$masks" --frames 401 \
        --impls wavealign --ceiling --orders original,s2,wavealign,com,span,wave-union,hilbert \
        --cases-out "$logs/orders-ncu/ncu-cases.jsonl" >"$logs/orders-ncu/ncu.csv" 2>>"$logs/errors.txt" ;;
    ncu)
      make_masks 401
      rm -f "$logs/ncu-cases.jsonl"
      "${profile[@]}" -k "regex:fwd_kernel_sm|FlashAttentionForward" python3 "$driver" --profile --masks "$masks" \
        --frames 401 --impls wavealign,flashattention4 --cases-out "$logs/ncu-cases.jsonl" >"$logs/ncu.csv" \
        2>>"$logs/errors.txt" ;;
    ncu-dense)  # Table I's dense and random rows
      "${profile[@]}" -k regex:fwd_kernel_sm --launch-count 1 "$bench" --model wan2.1-14b --frames 401 \
        --heads "$heads" --dense --warmup 0 --iters 1 --json >"$logs/ncu-dense.csv" 2>>"$logs/errors.txt"
      "${profile[@]}" -k regex:fwd_kernel_sm --launch-count 1 "$bench" --model wan2.1-14b --frames 401 \
        --heads "$heads" --mask random --density 0.20 --order original --warmup 0 --iters 1 --json \
        >"$logs/ncu-random.csv" 2>>"$logs/errors.txt" ;;
  esac
}

# A step runs as its own invocation of this script under `timeout`, which ends the step's whole process group.
if [[ $part == step:* ]]; then
  run_step "${part#step:}"
  exit $?
fi
case $part in
  timing | ncu | orders | all) ;;
  *) echo "run_evaluation.sh: part must be timing, ncu, orders or all, got '$part'" >&2; exit 2 ;;
esac

# step NAME: runs step NAME under its budget and records its elapsed time and exit status (124: out of time).
step() {
  local start=$SECONDS rc
  timeout --kill-after=10 "${budget[$1]}" bash "$0" "$build" "$logs" "step:$1"
  rc=$?
  printf '{"step": "%s", "budget_s": %d, "elapsed_s": %d, "rc": %d}\n' "$1" "${budget[$1]}" $((SECONDS - start)) \
    "$rc" | tee -a "$logs/steps.jsonl"
}
total() { local sum=0 name; for name in "$@"; do sum=$((sum + budget[$name])); done; echo $sum; }

echo "budget (s): timing = masks ${budget[masks]} + dense ${budget[dense]} + kernel ${budget[kernel]} +" \
  "fa4 ${budget[fa4]} = $(total "${timing_steps[@]}") (the simulator beside them, on the CPU);" \
  "ncu = ncu ${budget[ncu]} + dense/random ${budget[ncu-dense]} = $(total "${ncu_steps[@]}");" \
  "all = $(total "${timing_steps[@]}" "${ncu_steps[@]}")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  >"$logs/gpu.txt" 2>>"$logs/errors.txt"
cat "$logs/gpu.txt"
printf '{"command": "bench/gpu/run_evaluation.sh %s", "commit": "%s", "date": "%s", "ncu": "%s", "heads": %d}\n' \
  "$*" "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$(date -u +%Y-%m-%d)" \
  "$(ncu --version 2>/dev/null | tail -n 1)" "$heads" >>"$logs/meta.jsonl"

if [ "$part" = orders ]; then
  step masks
  step orders
  echo "order rows: $(grep -c '"ms"' "$logs/orders.jsonl")"
  step ncu-orders
  echo "profiled order launches: $(grep -c '"lts__t_sector_hit_rate.pct"' "$logs/orders-ncu/ncu.csv")"
  tail -n 5 "$logs/errors.txt" 2>/dev/null
  exit 0
fi
if [ "$part" != ncu ]; then
  step masks
  step simulate >/dev/null &
  simulator=$!
  for name in dense kernel fa4; do step "$name"; done
  wait "$simulator"
  echo "timing rows: $(grep -c '"ms"' "$logs/timing.jsonl"), dense rows: $(wc -l <"$logs/dense.jsonl")," \
    "simulated masks: $(wc -l <"$logs/simulate.jsonl")"
fi
if [ "$part" != timing ]; then
  for name in "${ncu_steps[@]}"; do step "$name"; done
  echo "ncu kernels: $(grep -c '"lts__t_sector_hit_rate.pct"' "$logs/ncu.csv") for" \
    "$( (wc -l <"$logs/ncu-cases.jsonl") 2>/dev/null || echo 0) cases"
fi
tail -n 5 "$logs/errors.txt" 2>/dev/null
exit 0
