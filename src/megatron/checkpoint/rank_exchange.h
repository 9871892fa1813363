// The collectives of a save made by several ranks together (rank files written in parallel, metadata
// published by rank 0). `world` == nullptr stands for a world of one: nothing is communicated.
//
// Contract (the Communicator's): every rank of `world` calls the same functions in the same order. They
// run on the training thread only -- never on an asynchronous writer thread, whose collectives could
// interleave with the training's own in a different order on different ranks.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "megatron/comm/communicator.h"
#include "megatron/runtime/context.h"

namespace megatron::checkpoint {

// Every rank's `mine`, in rank order. With an NCCL `world` the bytes travel through device buffers of
// `ctx` (which must be on the communicator's device); with MPI through host memory.
std::vector<std::string> all_gather_strings(Context& ctx, comm::Communicator* world, const std::string& mine);

// Agreement on a failure: each rank passes the error it caught (or nullptr). If any rank failed, every
// rank throws: a failed rank its own error, prefixed with `what` and its rank; the others an error naming
// `what` and the ranks that failed. Returns when no rank failed.
void agree_on_failure(comm::Communicator* world, std::exception_ptr error, const std::string& what);

}  // namespace megatron::checkpoint
