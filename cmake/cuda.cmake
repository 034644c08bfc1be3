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
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
if(NOT DEFINED WA_CUDA_ARCHITECTURES)
  set(WA_CUDA_ARCHITECTURES "90a;80" CACHE STRING "CUDA architectures of the kernels")
endif()
find_package(CUDAToolkit REQUIRED)

file(GLOB_RECURSE WA_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.cu)
add_library(wavealign_cuda ${WA_CUDA_SOURCES})
add_library(wavealign::cuda ALIAS wavealign_cuda)
set_target_properties(wavealign_cuda PROPERTIES CUDA_ARCHITECTURES "${WA_CUDA_ARCHITECTURES}")
target_include_directories(wavealign_cuda
  PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(wavealign_cuda PUBLIC wavealign::core CUDA::cudart)
target_compile_options(wavealign_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
target_compile_definitions(wavealign_cuda PUBLIC WAVEALIGN_HAS_CUDA=1)
