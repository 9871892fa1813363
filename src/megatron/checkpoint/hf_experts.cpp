// The sparse MoE blocks of Mixtral, Qwen2-MoE and Qwen3-MoE <-> our MoE layer's router and grouped experts
// (hf_host_tensors.h states the mapping). The stacked expert tensors hold expert e's matrix at index e of
// dimension 0, so stacking and splitting are row operations on [E * rows, cols] views.
#include "megatron/checkpoint/hf_host_tensors.h"
#include "megatron/core/error.h"

namespace megatron::checkpoint::hf {
namespace {

std::string ours_prefix(int i) { return "decoder.layers." + std::to_string(i) + ".mlp."; }

// The names of the per-expert layout (what save_pretrained writes): the block's prefix under the layer, and
// each expert's gate, up and down projections.
struct PerExpertNames {
  const char* block;
  const char *gate, *up, *down;
};
PerExpertNames per_expert_names(ExpertFamily f) {
  if (f == ExpertFamily::Mixtral) return {"block_sparse_moe.", "w1", "w3", "w2"};
  return {"mlp.", "gate_proj", "up_proj", "down_proj"};
}

// The fused layout (transformers 5's in-memory experts, saved as is with save_original_format=False; the same
// names for both families): gate_up_proj [E, 2F, h] holds [gate; up] per expert, exactly our linear_fc1.
void fused_from_hf(Source& hf, TensorMap& out, int i, const ExpertDims& d) {
  const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
  const std::string o = ours_prefix(i);
  out[o + "router.weight"] = hf.take(p + "gate.weight", {d.E, d.h});
  out[o + "experts.linear_fc1.weight"] = hf.take(p + "experts.gate_up_proj", {d.E, 2 * d.F, d.h});
  out[o + "experts.linear_fc2.weight"] = hf.take(p + "experts.down_proj", {d.E, d.h, d.F});
}

// The per-expert layout: one gate, up and down Linear per expert.
void per_expert_from_hf(Source& hf, TensorMap& out, int i, const ExpertDims& d, const PerExpertNames& names) {
  const std::string p = "model.layers." + std::to_string(i) + "." + names.block;
  const std::string o = ours_prefix(i);
  out[o + "router.weight"] = hf.take(p + "gate.weight", {d.E, d.h});
  std::vector<const HostTensor*> fc1, fc2;
  for (int64_t e = 0; e < d.E; ++e) {
    const std::string x = p + "experts." + std::to_string(e) + ".";
    fc1.push_back(&hf.take(x + names.gate + ".weight", {d.F, d.h}));
    fc1.push_back(&hf.take(x + names.up + ".weight", {d.F, d.h}));
    fc2.push_back(&hf.take(x + names.down + ".weight", {d.h, d.F}));
  }
  out[o + "experts.linear_fc1.weight"] = reshaped(concat_rows(fc1), {d.E, 2 * d.F, d.h});
  out[o + "experts.linear_fc2.weight"] = reshaped(concat_rows(fc2), {d.E, d.h, d.F});
}

}  // namespace

void moe_block_from_hf(ExpertFamily f, Source& hf, TensorMap& out, int i, const ExpertDims& d) {
  const PerExpertNames names = per_expert_names(f);
  const std::string layer = "model.layers." + std::to_string(i) + ".";
  const bool fused = hf.has(layer + "mlp.experts.gate_up_proj");
  const bool classic = hf.has(layer + names.block + "experts.0." + names.gate + ".weight");
  MEGATRON_CHECK(!(fused && classic), "convert: layer ", i, " has both the fused experts (", layer,
                 "mlp.experts.gate_up_proj) and the per-expert ones (", layer, names.block, "experts.*)");
  if (fused) fused_from_hf(hf, out, i, d);
  else per_expert_from_hf(hf, out, i, d, names);
}

void moe_block_to_hf(ExpertFamily f, Source& ours, TensorMap& out, int i, const ExpertDims& d) {
  const PerExpertNames names = per_expert_names(f);
  const std::string p = ours_prefix(i);
  const std::string o = "model.layers." + std::to_string(i) + "." + names.block;
  out[o + "gate.weight"] = ours.take(p + "router.weight", {d.E, d.h});
  const HostTensor fc1 =
      reshaped(ours.take(p + "experts.linear_fc1.weight", {d.E, 2 * d.F, d.h}), {d.E * 2 * d.F, d.h});
  const HostTensor fc2 = reshaped(ours.take(p + "experts.linear_fc2.weight", {d.E, d.h, d.F}), {d.E * d.h, d.F});
  for (int64_t e = 0; e < d.E; ++e) {
    const std::string x = o + "experts." + std::to_string(e) + ".";
    out[x + names.gate + ".weight"] = slice_rows(fc1, 2 * e * d.F, (2 * e + 1) * d.F);
    out[x + names.up + ".weight"] = slice_rows(fc1, (2 * e + 1) * d.F, (2 * e + 2) * d.F);
    out[x + names.down + ".weight"] = slice_rows(fc2, e * d.h, (e + 1) * d.h);
  }
}

}  // namespace megatron::checkpoint::hf
