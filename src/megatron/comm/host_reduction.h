// Element-wise reductions of host buffers for the socket communicator, with MpiCommunicator's arithmetic, so
// that both engines give the same bits where the order of the terms is the same:
// - f32, f64: the operation in the type (Sum: a + b; Max: the larger, NaN if either is NaN);
// - bf16, f16: widened to f32, reduced, rounded back at every step (MPI's user-defined operations);
// - i8..i64, u8, u16: Sum wraps around on overflow (two's complement; MPI leaves overflow to the
//   implementation: OpenMPI's vectorised 8-bit sums saturate), Max is the larger.
// Avg is Sum followed by divide_by_size(): floats through double, rounded to the type; integers truncate.
// Other dtypes (fp8) cannot be reduced: host_reducible() is false and the calls throw.
#pragma once

#include <cstdint>

#include "megatron/comm/communicator.h"

namespace megatron::comm {

bool host_reducible(DType dtype);
// acc[i] = acc[i] op in[i] for i < count (Avg: Sum).
void reduce_into(DType dtype, ReduceOp op, void* acc, const void* in, int64_t count);
// data[i] = data[i] / divisor, as MpiCommunicator's Avg.
void divide_by_size(DType dtype, void* data, int64_t count, int divisor);

}  // namespace megatron::comm
