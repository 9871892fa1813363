// Embedding benchmarks (16384 tokens, hidden 4096, bf16 table): memory-bound. Bytes: forward reads one row
// per token and writes it; backward reads dout once and writes the whole F32 dweight (assign: rows no token
// uses become 0) or reads and writes only the rows the tokens use (accumulate), plus the ids.
#include <set>
#include <string>
#include <vector>

#include "bench_util.h"
#include "megatron/ops/embedding/embedding.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_embedding(Context& ctx) {
  std::vector<OpBenchRow> rows;
  const int64_t tokens = 16384, hidden = 4096;
  CpuAllocator host;
  for (int64_t vocab : {int64_t(50304), int64_t(128256)}) {
    const DType dt = DType::BF16;
    const std::string config = std::to_string(tokens) + " tok, " + std::to_string(vocab) + "x" +
                               std::to_string(hidden) + " " + dtype_name(dt);
    Tensor weight = random_device_tensor(ctx, Shape{vocab, hidden}, dt, 1);
    Tensor ids = random_device_tensor(ctx, Shape{tokens}, DType::I32, 2, 0, double(vocab));
    Tensor out = ctx.empty(Shape{tokens, hidden}, dt);
    Tensor dout = random_device_tensor(ctx, Shape{tokens, hidden}, dt, 3);
    Tensor dweight = ctx.empty(Shape{vocab, hidden}, DType::F32);
    Tensor host_ids = to_device(ctx, ids, Device::cpu(), host);
    std::set<int32_t> unique(host_ids.data<int32_t>(), host_ids.data<int32_t>() + tokens);
    const double row = double(hidden) * double(dtype_size(dt)), ids_bytes = double(tokens) * 4;

    double ms = median_ms(ctx, [&] { ops::embedding_forward(ctx, out, weight, ids); });
    rows.push_back({"embedding fwd", config, ms, 0, 2 * double(tokens) * row + ids_bytes});
    ms = median_ms(ctx, [&] { ops::embedding_backward(ctx, dweight, dout, ids, false); });
    rows.push_back({"embedding bwd (assign)", config, ms, 0,
                    double(tokens) * row + double(vocab) * double(hidden) * 4 + ids_bytes});
    ms = median_ms(ctx, [&] { ops::embedding_backward(ctx, dweight, dout, ids, true); });
    rows.push_back({"embedding bwd (accumulate)", config + ", " + std::to_string(unique.size()) + " unique ids", ms, 0,
                    double(tokens) * row + 2 * double(unique.size()) * double(hidden) * 4 + ids_bytes});
  }
  return rows;
}

}  // namespace megatron::bench
