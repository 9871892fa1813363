// MEGATRON_DISPATCH(ctx, cuda_call, cpu_call): the one place an op chooses its implementation. On a CUDA
// context it runs `cuda_call` (the family's cuda:: function), otherwise `cpu_call` (the reference). In a
// build without the CUDA backend the CUDA branch is compiled out, so family cuda.h headers need not exist,
// and a CUDA context (which cannot be created there) is refused with the op's name.
#pragma once

#include "megatron/core/error.h"
#include "megatron/runtime/context.h"

#if MEGATRON_WITH_CUDA
#define MEGATRON_DISPATCH(ctx, cuda_call, cpu_call) \
  do {                                              \
    if ((ctx).is_cuda()) {                          \
      cuda_call;                                    \
    } else {                                        \
      cpu_call;                                     \
    }                                               \
  } while (0)
#else
#define MEGATRON_DISPATCH(ctx, cuda_call, cpu_call)                                        \
  do {                                                                                     \
    MEGATRON_CHECK(!(ctx).is_cuda(), __func__, ": this build has no CUDA backend");        \
    cpu_call;                                                                              \
  } while (0)
#endif
