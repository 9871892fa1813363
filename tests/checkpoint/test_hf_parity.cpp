// Parity with Hugging Face transformers: tiny random Llama (GQA, untied), Qwen2 (q/k/v biases, tied), Qwen3 (q/k
// norms, head_dim 24 != hidden / heads), Mistral, GPT-2, Mixtral (4 experts, top 2, GQA; saved in the per-expert
// layout, and as "mixtral_fused" in transformers 5's fused expert layout) and Qwen3-MoE (4 experts, top 2; one
// dense layer and norm_topk_prob false, or "qwen3_moe_norm": every layer sparse, renormalised) and Qwen2-MoE (a
// gated shared expert, q/k/v biases, a dense layer) models are built
// locally with transformers (no download) and saved;
// convert_checkpoint's import gives our model the same logits (CPU fp32: max |diff| < 1e-4; GPU bf16: NMSE
// against transformers' fp32 logits < 1e-3); our checkpoint exported back loads in transformers with the
// original logits.
//
// Needs torch and transformers, which CI does not install: the suites skip unless MEGATRON_HF_PARITY=1 (the
// lead runs them on the GPU machine: MEGATRON_HF_PARITY=1 build/tests/test_checkpoint_hf_parity).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "harness.h"
#include "megatron/checkpoint/hf_checkpoint.h"
#include "megatron/checkpoint/model_loader.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/inference/gpt_inference.h"

namespace megatron::checkpoint {
namespace {

namespace fs = std::filesystem;

// Builds the model for `family` in dir/hf and writes dir/reference.safetensors: "tokens" [2, 12] (I64) and
// "logits" [2, 12, V] (F32). With "check", instead loads dir/back and compares its logits with the
// reference (exit code 1 on a mismatch).
const char* kScript = R"PY(
import sys, os, torch, transformers
from safetensors.torch import save_file, load_file
family, d, mode = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(1234)
V = 300
if mode == "check":
    ref = load_file(os.path.join(d, "reference.safetensors"))
    m = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(d, "back"), dtype=torch.float32).eval()
    with torch.no_grad():
        got = m(ref["tokens"]).logits.float()
    diff = (got - ref["logits"]).abs().max().item()
    print(f"{family}: exported checkpoint in transformers, max |logits diff| = {diff:.3g}")
    sys.exit(0 if diff <= 1e-6 else 1)
common = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128)
if family == "gpt2":
    cfg = transformers.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
elif family == "llama":
    cfg = transformers.LlamaConfig(intermediate_size=96, num_key_value_heads=2, rms_norm_eps=1e-5,
                                   tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
                                   **common)
    model = transformers.LlamaForCausalLM(cfg)
elif family == "qwen2":
    cfg = transformers.Qwen2Config(intermediate_size=96, num_key_value_heads=2, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True, **common)
    model = transformers.Qwen2ForCausalLM(cfg)
elif family == "mistral":
    cfg = transformers.MistralConfig(intermediate_size=96, num_key_value_heads=1, rms_norm_eps=1e-5,
                                     tie_word_embeddings=False, sliding_window=None, **common)
    model = transformers.MistralForCausalLM(cfg)
elif family == "qwen3":
    cfg = transformers.Qwen3Config(intermediate_size=96, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
                                   tie_word_embeddings=False, **common)
    model = transformers.Qwen3ForCausalLM(cfg)
elif family in ("qwen3_moe", "qwen3_moe_norm"):
    norm = family == "qwen3_moe_norm"
    cfg = transformers.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=2,
                                      head_dim=24, num_local_experts=4, num_experts=4, num_experts_per_tok=2,
                                      norm_topk_prob=norm, mlp_only_layers=[] if norm else [1],
                                      router_aux_loss_coef=0.01, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                      **common)
    model = transformers.Qwen3MoeForCausalLM(cfg)
elif family == "qwen2_moe":
    cfg = transformers.Qwen2MoeConfig(intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                      num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                                      mlp_only_layers=[1], router_aux_loss_coef=0.01, rms_norm_eps=1e-6,
                                      tie_word_embeddings=False, **common)
    model = transformers.Qwen2MoeForCausalLM(cfg)
elif family in ("mixtral", "mixtral_fused"):
    cfg = transformers.MixtralConfig(intermediate_size=96, num_key_value_heads=2, rms_norm_eps=1e-5,
                                     num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                                     tie_word_embeddings=False, sliding_window=None, **common)
    model = transformers.MixtralForCausalLM(cfg)
model = model.float().eval()
with torch.no_grad():  # weights large enough that a layout mistake shows in the logits
    for name, p in model.named_parameters():
        if p.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        else:
            p.copy_(0.2 * torch.randn_like(p))
if family == "mixtral_fused":  # the experts as transformers holds them: mlp.experts.gate_up_proj, down_proj
    try:
        model.save_pretrained(os.path.join(d, "hf"), save_original_format=False)
    except TypeError:  # a transformers without the option: its own state dict is that layout
        cfg.save_pretrained(os.path.join(d, "hf"))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  os.path.join(d, "hf", "model.safetensors"), metadata={"format": "pt"})
else:
    model.save_pretrained(os.path.join(d, "hf"))
if family.startswith("mixtral"):
    from safetensors import safe_open
    with safe_open(os.path.join(d, "hf", "model.safetensors"), "pt") as f:
        print(family, "layer 0 expert tensors:", sorted(k for k in f.keys() if k.startswith("model.layers.0.")
                                                       and ("experts" in k or "gate." in k))[:4], "...")
tokens = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(7))
with torch.no_grad():
    logits = model(tokens).logits.float()
save_file({"tokens": tokens.contiguous(), "logits": logits.contiguous()}, os.path.join(d, "reference.safetensors"))
print(f"{family}: transformers {transformers.__version__}, logits {tuple(logits.shape)}")
)PY";

bool parity_enabled() {
  const char* e = std::getenv("MEGATRON_HF_PARITY");
  return e != nullptr && std::string(e) == "1";
}

void expect_parity(const std::string& family, Context& ctx, DType dtype) {
  if (!parity_enabled()) GTEST_SKIP() << "set MEGATRON_HF_PARITY=1 (needs torch and transformers)";
  fs::path dir = testing::make_temp_dir("hf_parity_" + family + "_" + dtype_name(dtype));
  testing::run_python(dir, kScript, family + " " + dir.string() + " make");
  import_hf_checkpoint(dir / "hf", dir / "ours");
  LoadedModel loaded = load_model(ctx, dir / "ours", dtype);
  auto ref = SafetensorsFile::open(dir / "reference.safetensors");
  Tensor tokens = ref->tensor("tokens");
  Tensor want = ref->tensor("logits");
  const int64_t B = tokens.dim(0), S = tokens.dim(1), V = want.dim(2);
  inference::GPTInference engine(ctx, *loaded.model, B, S);
  const std::vector<double> got = testing::to_doubles(ctx, engine.forward(ctx, tokens));
  const int64_t padded = loaded.model->config().padded_vocab_size;
  std::vector<double> a, b;
  double worst = 0;
  for (int64_t t = 0; t < B * S; ++t)
    for (int64_t v = 0; v < V; ++v) {
      a.push_back(got[size_t(t * padded + v)]);
      b.push_back(double(want.data<float>()[t * V + v]));
      worst = std::max(worst, std::abs(a.back() - b.back()));
    }
  const double e = testing::nmse(a, b);
  std::cout << family << " (" << dtype_name(dtype) << " on " << ctx.device() << "): max |logits diff| " << worst
            << ", NMSE " << e << "\n";
  if (dtype == DType::F32)
    EXPECT_LT(worst, 1e-4) << family;
  else
    EXPECT_LT(e, 1e-3) << family;

  // Export back to Hugging Face and let transformers check the logits.
  export_hf_checkpoint(dir / "ours", dir / "back");
  testing::run_python(dir, kScript, family + " " + dir.string() + " check");
}

class HfParity : public ::testing::TestWithParam<std::string> {};
TEST_P(HfParity, LogitsMatchTransformersCpuFp32) { expect_parity(GetParam(), testing::cpu_context(), DType::F32); }
INSTANTIATE_TEST_SUITE_P(Families, HfParity,
                         ::testing::Values("llama", "gpt2", "qwen2", "qwen3", "mistral", "mixtral", "mixtral_fused",
                                           "qwen3_moe", "qwen3_moe_norm", "qwen2_moe"));

class HfParityGpu : public ::testing::TestWithParam<std::string> {};
TEST_P(HfParityGpu, LogitsMatchTransformersBf16) {
  MEGATRON_REQUIRE_GPU();
  expect_parity(GetParam(), testing::cuda_context(), DType::BF16);
}
INSTANTIATE_TEST_SUITE_P(Families, HfParityGpu,
                         ::testing::Values("llama", "gpt2", "qwen2", "qwen3", "mistral", "mixtral", "qwen3_moe",
                                           "qwen2_moe"));

}  // namespace
}  // namespace megatron::checkpoint
