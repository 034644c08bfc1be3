# Sourced by the H200 run scripts: the Nsight Compute profile of our kernel that the simulator's calibration
# and the order tables read (one launch per case, clocks and caches as the timed runs leave them: the L2 is
# flushed before the launch, the SM clock is not controlled).
#
#   ncu_kernel_cases BENCH CSV "FRAMES..." ORDER...
# appends, for each frame count x mask (video 0.28, random 0.20) x order, a "# case frames=F mask=M order=O"
# header and ncu's CSV of L2 hit rates, L2 read sectors, DRAM read bytes, duration and the SM clock
# (sm__cycles_elapsed.avg.per_second) of wa_bench_attention's kernel (Wan2.1-14B, 4 heads) to CSV; ncu's errors
# go to the caller's stderr.
ncu_kernel_cases() {
  local bench=$1 csv=$2 frame_list=$3 frames mask order density
  shift 3
  local metrics=lts__t_sector_hit_rate.pct,lts__t_sector_op_read_hit_rate.pct,lts__t_sectors_op_read.sum,dram__bytes_read.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second
  for frames in $frame_list; do
    for mask in video random; do
      density=0.20
      [ "$mask" = video ] && density=0.28
      for order in "$@"; do
        echo "# case frames=$frames mask=$mask order=$order" >>"$csv"
        timeout 120 ncu --clock-control none --cache-control all -k regex:fwd_kernel --launch-count 1 \
          --metrics "$metrics" --csv "$bench" --model wan2.1-14b --frames "$frames" --heads 4 --mask "$mask" \
          --density "$density" --order "$order" --warmup 0 --iters 1 --json >>"$csv"
      done
    done
  done
  echo "ncu rows: $(grep -c lts__t_sector_hit_rate "$csv")"
}
