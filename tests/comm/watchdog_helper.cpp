// A job in which rank 0 skips a collective, for test_watchdog: every rank joins one all-reduce (the group
// works), then rank 0 goes to sleep instead of joining the second one. The other ranks must report the
// stuck collective and end the job through the watchdog within the timeout. With `p2p` the other ranks
// instead receive from rank 0 in a point-to-point batch whose send never comes; with `warm` as well, every
// rank first exchanges a message with rank 0 (NCCL then has its p2p connections, and the receive hangs on
// the GPU rather than while connecting on the host). With `die`, rank 0 exits (status 3) instead of
// sleeping: the others must fail at once with an error naming it, not wait for the timeout. With `peer` (NCCL
// groups of GPUs that map each other's memory) every rank makes a copy-engine exchange over the group and the
// others wait on the GPU for a push rank 0 never makes: the group's watchdog must report that wait. With
// `stream` (NCCL, any number of ranks, one GPU is enough) every rank queues a flag wait that nothing raises and
// puts it under the watchdog (Communicator::watch_stream): the same report, without a second GPU.
// The same binary runs under mpiexec (MPI) and with torchrun's variables set (the socket engine).
//
//   mpiexec -n 3 watchdog_helper <timeout-minutes> [nccl] [p2p] [warm] [die] [peer] [stream]
//   RANK=r WORLD_SIZE=3 LOCAL_RANK=r MASTER_ADDR=127.0.0.1 MASTER_PORT=p watchdog_helper <timeout-minutes> ...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "megatron/comm/distributed_runtime.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/parallel/peer_exchange.h"
#if MEGATRON_WITH_NCCL
#include "megatron/comm/nccl_communicator.h"
#include "megatron/parallel/peer_flags.h"
#endif

using namespace megatron;

namespace {

struct Mode {
  bool nccl = false, p2p = false, warm = false, die = false, peer = false, stream = false;
};

int run(const comm::DistributedRuntime& runtime, double minutes, const Mode& mode) {
  const bool nccl = mode.nccl, p2p = mode.p2p, warm = mode.warm, die = mode.die;
  const auto timeout = comm::timeout_from_minutes(minutes);
  std::shared_ptr<comm::Communicator> world = runtime.world(timeout);
  std::unique_ptr<Context> ctx = Context::cpu();
#if MEGATRON_WITH_NCCL
  if (nccl) {
    ctx = Context::cuda(runtime.local_rank() % cuda_device_count());
    world = comm::NcclCommunicator::create(*world, ctx->device().index, "world", timeout, runtime.world_rank());
  }
#else
  if (nccl) {
    std::fprintf(stderr, "watchdog_helper: this build has no NCCL\n");
    return 2;
  }
#endif
  const int me = runtime.world_rank();
  std::unique_ptr<comm::Communicator> dp = world->split(0, me, "dp");
  Tensor t = ctx->empty(Shape{1000}, DType::F32);
  ops::fill(*ctx, t, 1.0);
  dp->all_reduce(t, comm::ReduceOp::Sum, ctx->stream());
  ctx->synchronize();
  std::fprintf(stderr, "rank %d: first all_reduce done\n", me);
  if (warm) {
    std::vector<comm::P2POp> ops;
    std::vector<Tensor> got;
    for (int peer = 0; peer < dp->size(); ++peer) {
      if (peer == dp->rank() || (dp->rank() != 0 && peer != 0)) continue;
      got.push_back(ctx->empty(Shape{8}, DType::F32));
      ops.push_back(comm::P2POp::send(t.slice(0, 8), peer));
      ops.push_back(comm::P2POp::recv(got.back(), peer));
    }
    dp->batch_send_recv(ops, ctx->stream()).wait(nullptr);
  }
#if MEGATRON_WITH_NCCL
  if (mode.stream && nccl) {  // a flag wait on the GPU that nothing raises, under the watchdog
    uint64_t* word = nullptr;
    if (cudaMalloc(&word, sizeof(uint64_t)) != cudaSuccess || cudaMemset(word, 0, sizeof(uint64_t)) != cudaSuccess)
      return 2;
    parallel::enqueue_wait_at_least(ctx->stream(), word, 1);
    dp->watch_stream(ctx->stream(), "peer exchange wait", "push 1 from rank 0 (copy engines)");
    ctx->synchronize();
    std::fprintf(stderr, "rank %d: UNEXPECTED: the wait completed\n", me);
    return 0;
  }
#endif
  std::unique_ptr<parallel::PeerExchange> exchange;
  if (mode.peer) {
    exchange = parallel::PeerExchange::create(*ctx, *dp, 4096);
    if (!exchange) {
      std::fprintf(stderr, "rank %d: these GPUs cannot map each other's memory; no copy-engine exchange\n", me);
      return 2;
    }
  }
  if (me == 0) {
    if (die) std::_Exit(3);  // "crashed"
    std::this_thread::sleep_for(std::chrono::minutes(2));  // "stuck elsewhere": never joins
    return 0;
  }
  if (exchange) {
    exchange->wait_arrival(ctx->stream(), 0);
    ctx->synchronize();
    std::fprintf(stderr, "rank %d: UNEXPECTED: the wait completed without rank 0's push\n", me);
    return 0;
  }
  if (p2p) {
    const comm::P2POp recv = comm::P2POp::recv(t, 0);
    dp->batch_send_recv(std::span<const comm::P2POp>(&recv, 1), ctx->stream()).wait(nullptr);
    std::fprintf(stderr, "rank %d: UNEXPECTED: the receive completed without rank 0's send\n", me);
    return 0;
  }
  dp->all_reduce(t, comm::ReduceOp::Sum, ctx->stream());
  ctx->synchronize();
  std::fprintf(stderr, "rank %d: UNEXPECTED: the second all_reduce completed without rank 0\n", me);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: watchdog_helper <timeout-minutes> [nccl] [p2p] [warm] [die] [peer]\n");
    return 2;
  }
  Mode mode;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    mode.nccl = mode.nccl || a == "nccl";
    mode.p2p = mode.p2p || a == "p2p";
    mode.warm = mode.warm || a == "warm";
    mode.die = mode.die || a == "die";
    mode.peer = mode.peer || a == "peer";
    mode.stream = mode.stream || a == "stream";
  }
  std::unique_ptr<comm::DistributedRuntime> runtime;
  try {
    runtime = comm::start_distributed_runtime();
    return run(*runtime, std::atof(argv[1]), mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", runtime ? runtime->world_rank() : -1, e.what());
    return 1;
  }
}
