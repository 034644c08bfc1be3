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
  ${PROJECT_SOURCE_DIR}/src/cuda/masks/*.cu ${PROJECT_SOURCE_DIR}/src/cuda/quantize/*.cu)
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

# An object library of sm_90a sources with the CuTe headers: the library's Hopper kernels and, with
# WA_BUILD_KERNEL_VARIANTS, the benchmark's tuning variants (bench/CMakeLists.txt), compiled with the same flags.
# -DNDEBUG keeps CUTLASS's device asserts out of the kernels; the softmax uses ex2.approx explicitly, so
# fast-math is not needed for speed and is left off to keep the LSE's log and division exact.
function(wa_add_sm90_objects name)
  add_library(${name} OBJECT ${ARGN})
  set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES "${wa_sm90_architectures}")
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_include_directories(${name} SYSTEM PRIVATE ${WA_CUTLASS_INCLUDE})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${wa_cuda_flags} -DNDEBUG --threads 1>)
  target_link_libraries(${name} PRIVATE CUDA::cudart_static)
endfunction()

if(wa_build_sm90)
  file(GLOB WA_CUDA_SM90_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/attention/sm90/*.cu
    ${PROJECT_SOURCE_DIR}/src/cuda/attention/sm90_int8/*.cu
    ${PROJECT_SOURCE_DIR}/src/cuda/masks/sm90/*.cu)
  wa_add_sm90_objects(wavealign_cuda_sm90 ${WA_CUDA_SM90_SOURCES})
  target_sources(wavealign_cuda PRIVATE $<TARGET_OBJECTS:wavealign_cuda_sm90>)
  target_compile_definitions(wavealign_cuda PRIVATE WAVEALIGN_HAS_SM90_KERNELS=1)
  # TMA descriptors are encoded through the driver entry point that the runtime exposes; no -lcuda needed.
endif()
