// The GEMMs that --tp-comm-overlap cuts into TP pieces (parallel/tp_comm_overlap.h), against the whole GEMMs
// they replace, for Llama-3-8B's linears (h 4096, GQA 32/8, ffn 14336) at seq 4096 x mbs 1 = 4096 tokens:
// at TP = t the column-parallel forward (QKV, fc1) and the row-parallel forward (proj, fc2) each run t GEMMs of
// 4096 / t token rows instead of one of 4096. The pieces must cost little more than the whole (the overlap
// hides the communication only if chunking does not slow the GEMMs): the rows come in pairs, "whole" and
// "t chunks", with the same FLOPs.
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "megatron/ops/gemm/gemm.h"

namespace megatron::bench {

std::vector<OpBenchRow> bench_tp_overlap_chunks(Context& ctx) {
  std::vector<OpBenchRow> rows;
  uint64_t seed = 7000;
  const int64_t tokens = 4096, h = 4096, ffn = 14336, qkv = 4096 + 2 * 1024;
  struct Linear {
    const char* name;
    int64_t out, in;
    bool column;  // column-parallel: out split over TP; row-parallel: in split
  };
  const Linear linears[] = {{"qkv", qkv, h, true}, {"proj", h, h, false}, {"fc1", 2 * ffn, h, true}, {"fc2", h, ffn, false}};
  for (int tp : {2, 4})
    for (const Linear& l : linears) {
      const int64_t n = l.column ? l.out / tp : l.out, k = l.column ? l.in : l.in / tp, r = tokens / tp;
      Tensor x = random_device_tensor(ctx, Shape{tokens, k}, DType::BF16, seed++);
      Tensor w = random_device_tensor(ctx, Shape{n, k}, DType::BF16, seed++);
      Tensor y = random_device_tensor(ctx, Shape{tokens, n}, DType::BF16, seed++);
      const ops::GemmOptions opt{.transpose_b = true};
      const std::string config = std::to_string(tokens) + "x" + std::to_string(n) + "x" + std::to_string(k);
      const double flop = 2.0 * double(tokens) * double(n) * double(k);
      const double whole = median_ms(ctx, [&] { ops::gemm(ctx, y, x, w, opt); });
      const double chunks = median_ms(ctx, [&] {
        for (int c = 0; c < tp; ++c) ops::gemm(ctx, y.slice(c * r, (c + 1) * r), x.slice(c * r, (c + 1) * r), w, opt);
      });
      const std::string name = std::string(l.name) + " TP=" + std::to_string(tp);
      rows.push_back({.op = name + " whole", .config = config, .ms = whole, .flop = flop});
      char over[48];
      std::snprintf(over, sizeof over, " in %d chunks (%+.1f%% vs whole)", tp, 100.0 * (chunks / whole - 1.0));
      rows.push_back({.op = name + over, .config = config, .ms = chunks, .flop = flop});
    }
  return rows;
}

}  // namespace megatron::bench
