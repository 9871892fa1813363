# Every dependency comes from a system package (Debian/Ubuntu -dev packages, the CUDA toolkit) or, for the
# header-only cudnn-frontend, from `pip install --no-deps nvidia-cudnn-frontend`. Nothing is downloaded here.

find_package(Threads REQUIRED)

# OpenBLAS: the CPU GEMM engine.
find_package(PkgConfig)
if(PkgConfig_FOUND)
  pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)
endif()
if(TARGET PkgConfig::OPENBLAS)
  add_library(megatron_blas INTERFACE IMPORTED)
  target_link_libraries(megatron_blas INTERFACE PkgConfig::OPENBLAS)
else()
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS REQUIRED)
  find_path(OPENBLAS_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas REQUIRED)
  add_library(megatron_blas INTERFACE IMPORTED)
  target_link_libraries(megatron_blas INTERFACE BLAS::BLAS)
  target_include_directories(megatron_blas INTERFACE ${OPENBLAS_CBLAS_INCLUDE})
endif()

if(MEGATRON_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# OpenMPI (libopenmpi-dev): launches ranks (mpirun/srun), bootstraps NCCL, and is the collective engine for
# CPU tensors. The tests run the parallel suites under its mpiexec.
find_package(MPI REQUIRED COMPONENTS C)

if(MEGATRON_WITH_CUDA)
  find_package(CUDAToolkit REQUIRED)

  # cuDNN 9 (system package or the toolkit's include/lib).
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATHS /usr/include /usr/local/include)
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} PATHS /usr/lib/x86_64-linux-gnu)
  if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
    message(FATAL_ERROR "cuDNN not found (cudnn.h: '${CUDNN_INCLUDE_DIR}', libcudnn: '${CUDNN_LIBRARY}'); "
                        "install the cudnn9 -dev package or build with -DMEGATRON_CUDA=OFF")
  endif()
  add_library(megatron_cudnn INTERFACE IMPORTED)
  target_include_directories(megatron_cudnn INTERFACE ${CUDNN_INCLUDE_DIR})
  target_link_libraries(megatron_cudnn INTERFACE ${CUDNN_LIBRARY})

  # NCCL (the toolkit's or the system's libnccl): GPU collectives. Without it a CUDA build still trains on
  # one GPU; multi-GPU runs then stop with a message.
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATHS /usr/include /usr/local/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} PATHS /usr/lib/x86_64-linux-gnu)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    message(STATUS "megatron.cpp: NCCL ${NCCL_LIBRARY}")
    add_library(megatron_nccl INTERFACE IMPORTED)
    target_include_directories(megatron_nccl INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(megatron_nccl INTERFACE ${NCCL_LIBRARY})
  else()
    message(WARNING "NCCL not found (nccl.h: '${NCCL_INCLUDE_DIR}', libnccl: '${NCCL_LIBRARY}'): multi-GPU training "
                    "is disabled in this build")
  endif()

  # CUPTI (the toolkit's extras, or headers and library carried under CUPTI_ROOT): the GPU's own record of the
  # kernels and copies it ran, for --use-pytorch-profiler's kernel rows. Optional: without it that flag is refused.
  find_path(CUPTI_INCLUDE_DIR cupti_activity.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
            ${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/include ${CUPTI_ROOT}/include)
  find_library(CUPTI_LIBRARY cupti HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/lib64
               ${CUPTI_ROOT}/lib)
  if(CUPTI_INCLUDE_DIR AND CUPTI_LIBRARY)
    message(STATUS "megatron.cpp: CUPTI ${CUPTI_LIBRARY}")
    add_library(megatron_cupti INTERFACE IMPORTED)
    target_include_directories(megatron_cupti INTERFACE ${CUPTI_INCLUDE_DIR})
    target_link_libraries(megatron_cupti INTERFACE ${CUPTI_LIBRARY})
  else()
    message(STATUS "megatron.cpp: CUPTI not found: --use-pytorch-profiler is refused in this build")
  endif()

  # cudnn-frontend: header only, from the nvidia-cudnn-frontend wheel (its include/ lands in site-packages).
  find_package(Python3 COMPONENTS Interpreter)
  set(_site_hints "")
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import site,sys; print(';'.join(site.getsitepackages()+[site.getusersitepackages()]))"
                    OUTPUT_VARIABLE _site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    foreach(s ${_site})
      list(APPEND _site_hints ${s}/include ${s}/cudnn_frontend/include)
    endforeach()
  endif()
  find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
            HINTS ${CUDNN_FRONTEND_ROOT} ${CUDNN_FRONTEND_ROOT}/include ${CMAKE_SOURCE_DIR}/.deps/cudnn_frontend/include
                  ${_site_hints})
  if(NOT CUDNN_FRONTEND_INCLUDE_DIR)
    message(FATAL_ERROR "cudnn-frontend headers not found: run `pip install --no-deps nvidia-cudnn-frontend` "
                        "or pass -DCUDNN_FRONTEND_ROOT=<dir holding include/cudnn_frontend.h>")
  endif()
  message(STATUS "megatron.cpp: cudnn-frontend headers in ${CUDNN_FRONTEND_INCLUDE_DIR}")
  add_library(megatron_cudnn_frontend INTERFACE IMPORTED)
  target_include_directories(megatron_cudnn_frontend SYSTEM INTERFACE ${CUDNN_FRONTEND_INCLUDE_DIR})
  # cudnn-frontend compiles some kernels at run time (NVRTC).
  target_link_libraries(megatron_cudnn_frontend INTERFACE megatron_cudnn CUDA::nvrtc)
endif()
