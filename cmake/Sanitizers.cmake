# The sanitizer and fuzzing configuration (scripts/robustness.sh; docs/robustness.md).
#
#   -DMEGATRON_SANITIZE=ON   AddressSanitizer + UndefinedBehaviorSanitizer on every target, every finding fatal
#                            (-fno-sanitize-recover): the tests fail on the first invalid access or undefined
#                            operation. gcc or clang.
#   -DMEGATRON_FUZZ=ON       implies MEGATRON_SANITIZE; every target also gets libFuzzer's coverage
#                            instrumentation (-fsanitize=fuzzer-no-link) and fuzz/ builds one libFuzzer
#                            executable per parser of outside bytes. Needs clang >= 15 (libstdc++'s
#                            <source_location> needs __builtin_source_location) with its runtime libraries:
#                            Debian's clang-19 and libclang-rt-19-dev.
# One such build runs both the test suite and the fuzz targets, so CI compiles the sources once for both.
option(MEGATRON_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(MEGATRON_FUZZ "Build the libFuzzer targets (clang; implies MEGATRON_SANITIZE)" OFF)

if(MEGATRON_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR CMAKE_CXX_COMPILER_VERSION VERSION_LESS 15)
    message(FATAL_ERROR "MEGATRON_FUZZ needs clang >= 15 (found ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}); "
                        "configure with -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 "
                        "(apt-get install clang-19 libclang-rt-19-dev)")
  endif()
  set(MEGATRON_SANITIZE ON)
endif()

if(MEGATRON_SANITIZE)
  if(MEGATRON_WITH_CUDA)
    message(FATAL_ERROR "MEGATRON_SANITIZE is a CPU-only configuration: add -DMEGATRON_CUDA=OFF")
  endif()
  set(sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  if(MEGATRON_FUZZ)
    list(APPEND sanitize_flags -fsanitize=fuzzer-no-link)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${sanitize_flags}>")
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "megatron.cpp: sanitizers ${sanitize_flags}")
endif()
