// Mixtral's sparse MoE block <-> our MoE layer's router and grouped experts (hf_host_tensors.h states the
// mapping). The stacked expert tensors hold expert e's matrix at index e of dimension 0, so stacking and
// splitting are row operations on [E * rows, cols] views.
#include "megatron/checkpoint/hf_host_tensors.h"
#include "megatron/core/error.h"

namespace megatron::checkpoint::hf {
namespace {

std::string ours_prefix(int i) { return "decoder.layers." + std::to_string(i) + ".mlp."; }

// The fused layout (transformers 5's in-memory MixtralExperts, saved as is with save_original_format=False):
// gate_up_proj [E, 2F, h] holds [gate; up] per expert, exactly our linear_fc1.
void fused_from_hf(Source& hf, TensorMap& out, int i, const ExpertDims& d) {
  const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
  const std::string o = ours_prefix(i);
  out[o + "router.weight"] = hf.take(p + "gate.weight", {d.E, d.h});
  out[o + "experts.linear_fc1.weight"] = hf.take(p + "experts.gate_up_proj", {d.E, 2 * d.F, d.h});
  out[o + "experts.linear_fc2.weight"] = hf.take(p + "experts.down_proj", {d.E, d.h, d.F});
}

// The classic layout: one w1 (gate), w3 (up), w2 (down) Linear per expert.
void per_expert_from_hf(Source& hf, TensorMap& out, int i, const ExpertDims& d) {
  const std::string p = "model.layers." + std::to_string(i) + ".block_sparse_moe.";
  const std::string o = ours_prefix(i);
  out[o + "router.weight"] = hf.take(p + "gate.weight", {d.E, d.h});
  std::vector<const HostTensor*> fc1, fc2;
  for (int64_t e = 0; e < d.E; ++e) {
    const std::string x = p + "experts." + std::to_string(e) + ".";
    fc1.push_back(&hf.take(x + "w1.weight", {d.F, d.h}));
    fc1.push_back(&hf.take(x + "w3.weight", {d.F, d.h}));
    fc2.push_back(&hf.take(x + "w2.weight", {d.h, d.F}));
  }
  out[o + "experts.linear_fc1.weight"] = reshaped(concat_rows(fc1), {d.E, 2 * d.F, d.h});
  out[o + "experts.linear_fc2.weight"] = reshaped(concat_rows(fc2), {d.E, d.h, d.F});
}

}  // namespace

void mixtral_moe_from_hf(Source& hf, TensorMap& out, int i, const ExpertDims& d) {
  const std::string layer = "model.layers." + std::to_string(i) + ".";
  const bool fused = hf.has(layer + "mlp.experts.gate_up_proj");
  const bool classic = hf.has(layer + "block_sparse_moe.gate.weight");
  MEGATRON_CHECK(!(fused && classic), "convert: Mixtral layer ", i, " has both the fused experts (",
                 layer, "mlp.experts.gate_up_proj) and the per-expert ones (", layer, "block_sparse_moe.*)");
  if (fused) fused_from_hf(hf, out, i, d);
  else per_expert_from_hf(hf, out, i, d);
}

void mixtral_moe_to_hf(Source& ours, TensorMap& out, int i, const ExpertDims& d) {
  const std::string p = ours_prefix(i);
  const std::string o = "model.layers." + std::to_string(i) + ".block_sparse_moe.";
  out[o + "gate.weight"] = ours.take(p + "router.weight", {d.E, d.h});
  const HostTensor fc1 =
      reshaped(ours.take(p + "experts.linear_fc1.weight", {d.E, 2 * d.F, d.h}), {d.E * 2 * d.F, d.h});
  const HostTensor fc2 = reshaped(ours.take(p + "experts.linear_fc2.weight", {d.E, d.h, d.F}), {d.E * d.h, d.F});
  for (int64_t e = 0; e < d.E; ++e) {
    const std::string x = o + "experts." + std::to_string(e) + ".";
    out[x + "w1.weight"] = slice_rows(fc1, 2 * e * d.F, (2 * e + 1) * d.F);
    out[x + "w3.weight"] = slice_rows(fc1, (2 * e + 1) * d.F, (2 * e + 2) * d.F);
    out[x + "w2.weight"] = slice_rows(fc2, e * d.h, (e + 1) * d.h);
  }
}

}  // namespace megatron::checkpoint::hf
