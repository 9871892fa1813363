// The Hugging Face mappings' building blocks (internal to checkpoint/hf_*.cpp): dtype-agnostic row
// operations on HostTensors and a Source that hands tensors out by name, checks their shapes and
// remembers which were used, so that an unused tensor can be reported by name.
// "Rows" are dimension 0: a tensor [d0, d1, ...] is d0 rows of d1 x ... elements.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "megatron/checkpoint/hf_convert.h"

namespace megatron::checkpoint::hf {

// A zero tensor.
HostTensor make(DType dtype, std::vector<int64_t> shape);
// The same bytes under another shape of the same element count (checked).
HostTensor reshaped(HostTensor t, std::vector<int64_t> shape);
// Rows [begin, end) of t.
HostTensor slice_rows(const HostTensor& t, int64_t begin, int64_t end);
// The parts one after the other along dimension 0 (same dtype and row width, checked).
HostTensor concat_rows(const std::vector<const HostTensor*>& parts);
HostTensor transpose2d(const HostTensor& t);
// Pads (zeros) or truncates dimension 0 to `n` rows.
HostTensor resize_rows(const HostTensor& t, int64_t n);
bool all_zero(const HostTensor& t);

// Takes tensors out of a map by name, checking each one's shape against the configuration's.
class Source {
 public:
  Source(const TensorMap& m, std::string what) : map_(m), what_(std::move(what)) {}
  bool has(const std::string& name) const { return map_.count(name) != 0; }
  // The tensor `name`, which must exist with exactly `shape` (else an error naming both).
  const HostTensor& take(const std::string& name, const std::vector<int64_t>& shape);
  // Every tensor not taken, except names matching `ignore`.
  std::vector<std::string> unused(const std::function<bool(const std::string&)>& ignore) const;

 private:
  const TensorMap& map_;
  std::string what_;
  std::set<std::string> used_;
};

// The sparse MoE block of layer i (hf_experts.cpp): E experts of width F, hidden size h.
struct ExpertDims {
  int64_t E, F, h;
};
// Whose per-expert names: Mixtral's (model.layers.i.block_sparse_moe.gate.weight, .experts.e.w1 (gate), w3 (up),
// w2 (down)) or Qwen2-MoE's and Qwen3-MoE's (model.layers.i.mlp.gate.weight, .mlp.experts.e.gate_proj, up_proj,
// down_proj).
enum class ExpertFamily { Mixtral, QwenMoe };
// HF layer i's router and experts -> our decoder.layers.i.mlp.router.weight [E, h],
// mlp.experts.linear_fc1.weight [E, 2F, h] (expert e: [gate_e; up_e]) and mlp.experts.linear_fc2.weight
// [E, h, F] (down_e). Reads either layout transformers writes: the family's per-expert one, or the fused one of
// transformers 5 (model.layers.i.mlp.gate.weight, .mlp.experts.gate_up_proj [E, 2F, h], .mlp.experts.down_proj
// [E, h, F]; the same names for both families).
void moe_block_from_hf(ExpertFamily f, Source& hf, TensorMap& out, int i, const ExpertDims& d);
// The inverse, always in the per-expert layout (what transformers' save_pretrained writes).
void moe_block_to_hf(ExpertFamily f, Source& ours, TensorMap& out, int i, const ExpertDims& d);

}  // namespace megatron::checkpoint::hf
