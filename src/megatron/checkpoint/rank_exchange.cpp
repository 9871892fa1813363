#include "megatron/checkpoint/rank_exchange.h"

#include <cstring>

#include "megatron/core/error.h"

namespace megatron::checkpoint {

std::vector<std::string> all_gather_strings(Context& ctx, comm::Communicator* world, const std::string& mine) {
  if (world == nullptr || world->size() == 1) return {mine};
  const int n = world->size(), rank = world->rank();
  std::vector<double> lengths(static_cast<size_t>(n), 0.0);
  lengths[size_t(rank)] = double(mine.size());
  world->all_reduce_host(lengths, comm::ReduceOp::Max);
  int64_t chunk = 0;
  for (double l : lengths) chunk = std::max(chunk, int64_t(l));
  std::vector<std::string> out(static_cast<size_t>(n));
  if (chunk == 0) return out;

  CpuAllocator host_allocator;
  Tensor host = Tensor::empty(Shape{chunk * n}, DType::U8, host_allocator);
  std::memset(host.data_ptr(), 0, size_t(chunk * n));
  std::memcpy(static_cast<char*>(host.data_ptr()) + chunk * rank, mine.data(), mine.size());
  if (world->device().is_cpu()) {
    world->all_gather(host, host.slice(chunk * rank, chunk * (rank + 1)));
  } else {
    MEGATRON_CHECK(ctx.device() == world->device(), "checkpoint: gathering the saved pieces over ", world->describe(),
                   " (on ", world->device(), ") needs a context on that device, got ", ctx.device());
    Tensor device = ctx.empty(Shape{chunk * n}, DType::U8);
    Tensor mine_on_device = device.slice(chunk * rank, chunk * (rank + 1));
    copy_tensor(ctx, mine_on_device, host.slice(chunk * rank, chunk * (rank + 1)));
    world->all_gather(device, mine_on_device, ctx.stream());
    copy_tensor(ctx, host, device);  // waits for the gather
  }
  for (int r = 0; r < n; ++r)
    out[size_t(r)].assign(static_cast<const char*>(host.data_ptr()) + chunk * r, size_t(lengths[size_t(r)]));
  return out;
}

void agree_on_failure(comm::Communicator* world, std::exception_ptr error, const std::string& what) {
  std::vector<int> failed;
  if (world != nullptr && world->size() > 1) {
    std::vector<double> flags(size_t(world->size()), 0.0);
    flags[size_t(world->rank())] = error ? 1.0 : 0.0;
    world->all_reduce_host(flags, comm::ReduceOp::Max);
    for (size_t r = 0; r < flags.size(); ++r)
      if (flags[r] != 0.0) failed.push_back(int(r));
  } else if (error) {
    failed.push_back(0);
  }
  if (failed.empty()) return;
  const int rank = world != nullptr ? world->rank() : 0;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      if (world == nullptr || world->size() == 1) MEGATRON_FAIL(what, ": ", e.what());
      MEGATRON_FAIL(what, " (rank ", rank, "): ", e.what());
    }
  }
  std::string ranks;
  for (size_t i = 0; i < failed.size(); ++i) ranks += (i ? ", " : "") + std::to_string(failed[i]);
  MEGATRON_FAIL(what, ": failed on rank", failed.size() > 1 ? "s " : " ", ranks, " (see that rank's error)");
}

}  // namespace megatron::checkpoint
