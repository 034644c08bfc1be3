# CUDA part of the build: compiled when nvcc is present (CI has nvcc but no GPU, so it proves the
# kernels compile for every target architecture). sm_90a carries the Hopper path (wgmma/TMA), sm_80 the
# portable mma.sync path that also serves sm_86/sm_89 through the driver's PTX JIT.
include(CheckLanguage)
if(NOT WA_BUILD_CUDA)
  return()
endif()
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "wavealign: nvcc not found, building without the CUDA kernels")
  return()
endif()
enable_language(CUDA)
# C++20 for device code. CMake 3.25's NVIDIA module knows flags up to C++17 only (CUDA_STANDARD 20 then fails
# at generation); nvcc >= 12 takes -std=c++20, so teach older CMakes the flag.
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
if(NOT DEFINED WA_CUDA_ARCHITECTURES)
  set(WA_CUDA_ARCHITECTURES "90a;80" CACHE STRING "CUDA architectures of the kernels")
endif()
find_package(CUDAToolkit REQUIRED)

# CuTe/CUTLASS headers (header-only) for the Hopper kernel: by default the copy that the pinned pip package
# nvidia-cutlass ships (requirements-dev.txt).
if(NOT DEFINED WA_CUTLASS_INCLUDE)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  set(wa_cutlass_default "")
  if(Python3_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import cutlass_library; print(cutlass_library.source_path)"
      OUTPUT_VARIABLE wa_cutlass_source OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE wa_cutlass_rc)
    if(wa_cutlass_rc EQUAL 0 AND EXISTS "${wa_cutlass_source}/include/cute/tensor.hpp")
      set(wa_cutlass_default "${wa_cutlass_source}/include")
    endif()
  endif()
  set(WA_CUTLASS_INCLUDE "${wa_cutlass_default}" CACHE PATH "CUTLASS/CuTe include directory (holds cute/ and cutlass/)")
endif()

# The Hopper kernels need sm_90a (wgmma, setmaxnreg) and the CuTe headers; they build as a separate object
# library for the 90a entries only, so the CuTe-heavy sources are not compiled a second time for sm_80.
set(wa_sm90_architectures "")
foreach(arch IN LISTS WA_CUDA_ARCHITECTURES)
  if(arch MATCHES "^90a")
    list(APPEND wa_sm90_architectures ${arch})
  endif()
endforeach()
set(wa_build_sm90 OFF)
if(wa_sm90_architectures AND EXISTS "${WA_CUTLASS_INCLUDE}/cute/tensor.hpp")
  set(wa_build_sm90 ON)
elseif(wa_sm90_architectures)
  message(WARNING "wavealign: CUTLASS headers not found (set WA_CUTLASS_INCLUDE); building without the sm_90a kernels")
endif()

set(wa_cuda_flags --expt-relaxed-constexpr -lineinfo -Xptxas=--warn-on-spills)

file(GLOB WA_CUDA_SOURCES CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/src/cuda/*.cu ${PROJECT_SOURCE_DIR}/src/cuda/attention/*.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/attention/sm80/*.cu ${PROJECT_SOURCE_DIR}/src/cuda/plan/*.cu
  ${PROJECT_SOURCE_DIR}/src/cuda/masks/*.cu)
add_library(wavealign_cuda ${WA_CUDA_SOURCES})
add_library(wavealign::cuda ALIAS wavealign_cuda)
set_target_properties(wavealign_cuda PROPERTIES CUDA_ARCHITECTURES "${WA_CUDA_ARCHITECTURES}")
target_include_directories(wavealign_cuda
  PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  PRIVATE ${PROJECT_SOURCE_DIR}/src)
# Static runtime: the test and bench binaries then need only the driver on the machine that runs them.
target_link_libraries(wavealign_cuda PUBLIC wavealign::core CUDA::cudart_static)
# The mask methods' scoring products (src/cuda/masks/blas.cu); the shared library, found next to the toolkit.
target_link_libraries(wavealign_cuda PRIVATE CUDA::cublas)
target_compile_options(wavealign_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${wa_cuda_flags}>)
target_compile_definitions(wavealign_cuda PUBLIC WAVEALIGN_HAS_CUDA=1)

if(wa_build_sm90)
  file(GLOB WA_CUDA_SM90_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/attention/sm90/*.cu
    ${PROJECT_SOURCE_DIR}/src/cuda/masks/sm90/*.cu)
  add_library(wavealign_cuda_sm90 OBJECT ${WA_CUDA_SM90_SOURCES})
  set_target_properties(wavealign_cuda_sm90 PROPERTIES CUDA_ARCHITECTURES "${wa_sm90_architectures}")
  target_include_directories(wavealign_cuda_sm90
    PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_include_directories(wavealign_cuda_sm90 SYSTEM PRIVATE ${WA_CUTLASS_INCLUDE})
  # -DNDEBUG keeps CUTLASS's device asserts out of the kernel; the softmax uses ex2.approx explicitly, so
  # fast-math is not needed for speed and is left off to keep the LSE's log and division exact.
  target_compile_options(wavealign_cuda_sm90 PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${wa_cuda_flags} -DNDEBUG --threads 1>)
  target_link_libraries(wavealign_cuda_sm90 PRIVATE CUDA::cudart_static)
  set(WA_SM90_KV_STAGES 2 CACHE STRING "K and V pipeline stages of the Hopper kernel (2 or 3)")
  option(WA_SM90_PINGPONG "Hopper kernel: consumer warpgroups take turns issuing GEMMs" OFF)
  set(WA_SM90_Q_STAGES 1 CACHE STRING "Q stages of the Hopper kernel (1 or 2; 2 loads the next item's Q early)")
  if(WA_SM90_Q_STAGES EQUAL 2 AND WA_SM90_KV_STAGES EQUAL 3)
    # 128x128, d = 128: 2 x 32 KB of Q + 3 x 2 x 32 KB of K/V = 256 KB, over the 227 KB per CTA.
    message(FATAL_ERROR "WA_SM90_Q_STAGES=2 needs WA_SM90_KV_STAGES=2 (256 KB of shared memory otherwise)")
  endif()
  # Consumer instruction-stream variants (docs/kernel.md, "Instruction count per KV block"), each measured
  # against the default before it becomes one.
  option(WA_SM90_UNIFORM_OPERANDS
    "Hopper kernel: wgmma smem descriptors and stage indices computed in uniform registers" OFF)
  # Exact rescale is the default since its H200 measurement (bench/results/h200-kernel-variants.json, 4 heads,
  # L = 363,600, power-capped): video 574.7 -> 588.4 TF/s, random 597.4 -> 610.8, dense 615.2 -> 637.9, 64 x 64
  # blocks 466.0 -> 492.4; 4,328 -> 3,892 warp instructions per 128 x 128 block.
  option(WA_SM90_EXACT_RESCALE
    "Hopper kernel: O rescale factor from the exact max difference, so an unchanged row max skips the rescale" ON)
  set(WA_SM90_ROW_MAX_CHAINS 1 CACHE STRING
    "Hopper kernel: independent fmax chains of the softmax row max (1, 2, 4 or 8)")
  if(NOT WA_SM90_ROW_MAX_CHAINS MATCHES "^(1|2|4|8)$")
    message(FATAL_ERROR "WA_SM90_ROW_MAX_CHAINS must be 1, 2, 4 or 8, got '${WA_SM90_ROW_MAX_CHAINS}'")
  endif()
  # Early P conversion is the default since its H200 measurement (h200-kernel-variants.json, the dced909 run; 4 heads,
  # L = 363,600, power-capped): SM cycles per 128 x 128 block 2,599 -> 2,568 (video), 2,670 -> 2,635 (dense);
  # video 590.7 -> 594.1 TF/s, random 612.1 -> 610.5, dense 642.1 -> 647.1, dense d = 64 419.6 -> 442.2.
  option(WA_SM90_EARLY_P_CONVERSION
    "Hopper kernel: P converted to 16 bits before the O rescale, so the conversions fill the softmax's exp2 gaps" ON)
  set(WA_SM90_FMA_EXP2_EVERY 0 CACHE STRING
    "Hopper kernel: every k-th softmax exp2 on the FMA pipe (exp2_fma) instead of MUFU (0 = none, or 2, 4, 8)")
  if(NOT WA_SM90_FMA_EXP2_EVERY MATCHES "^(0|2|4|8)$")
    message(FATAL_ERROR "WA_SM90_FMA_EXP2_EVERY must be 0, 2, 4 or 8, got '${WA_SM90_FMA_EXP2_EVERY}'")
  endif()
  # Loop control and wait order (docs/kernel.md, "Per-instruction stall samples"): the consumer's KV loop count
  # made warp-uniform (no YIELD, no divergent fallback copy of the softmax in the loop; more cycles per block at
  # 128 x 128, d = 128 on the H200, so the default -1 applies it to the d = 64 and 64 x 64 kernels only, which gain
  # 6.5 % and 3.3 % dense), and the wait for the previous block's V moved from before the S GEMM to between the S
  # and the PV GEMMs, the default since its H200 measurement (h200-kernel-variants.json, the 99244e8 run): SM
  # cycles per block 2,570 -> 2,543 (video), 2,632 -> 2,598 (dense); video 590.1 -> 595.4 TF/s, random
  # 610.9 -> 613.8, dense 647.3 -> 655.9.
  set(WA_SM90_UNIFORM_TRIP_COUNT -1 CACHE STRING
    "Hopper kernel: the consumer's KV loop count passed through a warp reduction (0 never, 1 every kernel, -1 all but the 128 x 128, d = 128 kernels)")
  if(NOT WA_SM90_UNIFORM_TRIP_COUNT MATCHES "^(-1|0|1)$")
    message(FATAL_ERROR "WA_SM90_UNIFORM_TRIP_COUNT must be -1, 0 or 1, got '${WA_SM90_UNIFORM_TRIP_COUNT}'")
  endif()
  option(WA_SM90_LATE_V_WAIT "Hopper kernel: wait for V after issuing the S GEMM, not before" ON)
  # K-ahead (FA4's producer order) for the rows that skip a block, in the 128 x 128, d = 128 kernels (-1, the
  # default since its H200 measurement, docs/kernel.md "K-ahead where it pays"); 0, 1 and 2 apply one mode to
  # every kernel (src/cuda/attention/sm90/mainloop.cuh says what each measured).
  set(WA_SM90_K_AHEAD -1 CACHE STRING
    "Hopper kernel: the producer loads K of the next block before V of the current one (-1 rows that skip a block in the 128 x 128, d = 128 kernels, 0 never, 1 always, 2 rows that skip a block)")
  if(NOT WA_SM90_K_AHEAD MATCHES "^(-1|0|1|2)$")
    message(FATAL_ERROR "WA_SM90_K_AHEAD must be -1, 0, 1 or 2, got '${WA_SM90_K_AHEAD}'")
  endif()
  # The softmax's two rows per thread side by side (FA4's order); static stall cycles of the d = 128 consumer
  # loop 1,157 -> 1,114 (scripts/sass_census.py --stalls), not yet timed.
  option(WA_SM90_INTERLEAVE_ROWS "Hopper kernel: the softmax's two rows per thread computed side by side" OFF)
  # Benchmarks only: the producer records when each CTA walks which K/V blocks (src/cuda/attention/progress_trace.h,
  # wa_bench_attention --progress-trace); public, so the dispatch's workspace and the benchmark agree.
  option(WA_SM90_PROGRESS_TRACE "Hopper kernel: record each CTA's walk through K/V in the workspace (benchmarks)" OFF)
  # Dense mode's CTAs kept within this many K/V blocks of the slowest (src/cuda/attention/kv_pacer.h; 0 = off):
  # the lockstep that K-ahead and a third stage lose at 363,600 tokens. Measured with K-ahead (W = 128): L2 hit
  # 98.6 % (default 94.6 %), yet dense 2.7 % slower than the default at a lower clock under the cap; off.
  set(WA_SM90_KV_PACER 0 CACHE STRING "Hopper kernel, dense mode: window in K/V blocks of the CTA pacer (0 = off)")
  if(NOT WA_SM90_KV_PACER MATCHES "^[0-9]+$")
    message(FATAL_ERROR "WA_SM90_KV_PACER must be a number of blocks >= 0, got '${WA_SM90_KV_PACER}'")
  endif()
  target_compile_definitions(wavealign_cuda PUBLIC WA_SM90_PROGRESS_TRACE=$<BOOL:${WA_SM90_PROGRESS_TRACE}>
    WA_SM90_KV_PACER=${WA_SM90_KV_PACER})
  target_compile_definitions(wavealign_cuda_sm90 PRIVATE
    WA_SM90_PROGRESS_TRACE=$<BOOL:${WA_SM90_PROGRESS_TRACE}> WA_SM90_KV_PACER=${WA_SM90_KV_PACER}
    WA_SM90_INTERLEAVE_ROWS=$<BOOL:${WA_SM90_INTERLEAVE_ROWS}>
    WA_SM90_UNIFORM_TRIP_COUNT=${WA_SM90_UNIFORM_TRIP_COUNT} WA_SM90_LATE_V_WAIT=$<BOOL:${WA_SM90_LATE_V_WAIT}>
    WA_SM90_K_AHEAD=${WA_SM90_K_AHEAD}
    WA_SM90_FMA_EXP2_EVERY=${WA_SM90_FMA_EXP2_EVERY} WA_SM90_EARLY_P_CONVERSION=$<BOOL:${WA_SM90_EARLY_P_CONVERSION}>
    WA_SM90_KV_STAGES=${WA_SM90_KV_STAGES} WA_SM90_PINGPONG=$<BOOL:${WA_SM90_PINGPONG}>
    WA_SM90_Q_STAGES=${WA_SM90_Q_STAGES} WA_SM90_UNIFORM_OPERANDS=$<BOOL:${WA_SM90_UNIFORM_OPERANDS}>
    WA_SM90_EXACT_RESCALE=$<BOOL:${WA_SM90_EXACT_RESCALE}> WA_SM90_ROW_MAX_CHAINS=${WA_SM90_ROW_MAX_CHAINS})
  # FlexPrefill's fused scoring passes on wgmma (src/cuda/masks/sm90/fused_scoring_sm90.cu) instead of mma.sync,
  # the default since its H200 run (wa_test_masks, memcheck and racecheck clean; ncu per 8 heads at 401 frames:
  # pass 1 1.94 -> 1.31 ms, pass 2 2.61 -> 2.10 ms); OFF keeps the mma.sync passes everywhere.
  option(WA_MASKS_SM90_FUSED_SCORING "FlexPrefill's fused scoring: both passes on wgmma on sm_90" ON)
  target_compile_definitions(wavealign_cuda PRIVATE WA_MASKS_SM90_FUSED_SCORING=$<BOOL:${WA_MASKS_SM90_FUSED_SCORING}>)
  # Its pass 1 at two CTAs per SM (a producer warp instead of a warpgroup, 2 K stages): ncu per 8 heads at
  # 401 frames 1.31 -> 1.14 ms on the H200 (wa_test_masks, memcheck and racecheck clean); OFF: one CTA per SM.
  option(WA_MASKS_SM90_ROW_PARTS_TWO_CTAS "FlexPrefill's wgmma pass 1: two CTAs per SM" ON)
  target_compile_definitions(wavealign_cuda_sm90 PRIVATE
    WA_MASKS_SM90_ROW_PARTS_TWO_CTAS=$<BOOL:${WA_MASKS_SM90_ROW_PARTS_TWO_CTAS}>)
  target_sources(wavealign_cuda PRIVATE $<TARGET_OBJECTS:wavealign_cuda_sm90>)
  target_compile_definitions(wavealign_cuda PRIVATE WAVEALIGN_HAS_SM90_KERNELS=1)
  # TMA descriptors are encoded through the driver entry point that the runtime exposes; no -lcuda needed.
endif()
