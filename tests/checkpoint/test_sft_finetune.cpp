// Supervised fine-tuning end to end: a tiny Llama written as a Hugging Face checkpoint (config.json and
// model.safetensors, as transformers saves them) is imported, fine-tuned by pretrain_gpt --sft on the shipped
// conversations (tests/data/sft: ChatML through the tokenizer's own chat template) and exported back.
// Checked: the assistant-token loss of the fine-tuned weights on the packed conversations, computed here from
// the saved checkpoints, is well below that of the imported weights (and the log's lm loss falls); the export
// has the original's tensor names, shapes and dtypes, its weights changed. With MEGATRON_HF_PARITY=1 (torch
// and transformers, not in CI) transformers loads the export and gives our fine-tuned model's logits.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>

#include "harness.h"
#include "hf_test_models.h"
#include "megatron/checkpoint/hf_checkpoint.h"
#include "megatron/checkpoint/model_loader.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/data/sft/sft_dataset.h"
#include "megatron/inference/gpt_inference.h"
#include "megatron/trainer/micro_batch.h"

namespace megatron::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path fixtures() { return fs::path(MEGATRON_TESTS_SOURCE_DIR) / "data" / "sft"; }

// A Llama of the tokenizer's 320 ids with weights of a trained model's scale (std 0.05, norms 1).
TensorMap tiny_llama(json& config) {
  config = testmodels::llama_config("llama", false, 2);
  config["vocab_size"] = 320;
  config["max_position_embeddings"] = 256;
  config["bos_token_id"] = nullptr;
  config["eos_token_id"] = 2;
  TensorMap t = testmodels::hf_tensors(config, DType::F32);
  for (auto& [name, tensor] : t) {
    float* v = reinterpret_cast<float*>(tensor.bytes.data());
    const bool norm = name.find("norm") != std::string::npos;
    for (int64_t i = 0; i < tensor.numel(); ++i) v[i] = norm ? 1.0f : 0.05f * v[i];
  }
  return t;
}

// The mean loss over the assistant tokens of every packed training row, for the checkpoint at `root`.
double assistant_loss(const fs::path& root) {
  Context& ctx = testing::cpu_context();
  LoadedModel loaded = load_model(ctx, root, DType::F32);
  const auto tok = data::make_tokenizer({.type = "SFTTokenizer", .tokenizer_model = fixtures().string()});
  const auto sets = data::build_sft_datasets({.path = (fixtures() / "conversations.jsonl").string(),
                                              .split = "100,0,0", .seq_length = 128,
                                              .format = data::ChatFormat::ChatML}, *tok);
  const data::SftDataset& set = *sets[0];
  Tensor rows = Tensor::empty(Shape{set.size(), set.row_width()}, DType::I64, ctx.allocator());
  for (int64_t r = 0; r < set.size(); ++r)
    set.sample(r, std::span<int64_t>(rows.data<int64_t>() + r * set.row_width(), size_t(set.row_width())));
  const trainer::HostMicroBatch mb = trainer::make_packed_host_micro_batch(rows, {1, 0, 128}, ctx.allocator());
  const nn::StageInput in{.tokens = mb.tokens, .labels = mb.labels, .loss_mask = mb.loss_mask,
                          .position_ids = mb.position_ids, .cu_seqlens = mb.cu_seqlens};
  return testing::to_doubles(ctx, loaded.model->forward(ctx, in, {.loss_denominator = mb.loss_tokens}).loss)[0];
}

std::vector<double> logged_losses(const fs::path& log) {
  std::ifstream f(log);
  std::vector<double> out;
  const std::regex line(R"(iteration +\d+/ +\d+ \|.*lm loss: ([0-9.Ee+-]+))");
  for (std::string s; std::getline(f, s);) {
    std::smatch m;
    if (std::regex_search(s, m, line)) out.push_back(std::stod(m[1]));
  }
  return out;
}

const char* kTransformersCheck = R"PY(
import sys, os, torch, transformers
from safetensors.torch import load_file
d = sys.argv[1]
ref = load_file(os.path.join(d, "reference.safetensors"))
m = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(d, "back"), dtype=torch.float32).eval()
with torch.no_grad():
    got = m(ref["tokens"]).logits.float()
diff = (got - ref["logits"][..., :got.shape[-1]]).abs().max().item()
print(f"fine-tuned export in transformers {transformers.__version__}: max |logits diff| = {diff:.3g}")
sys.exit(0 if diff <= 1e-4 else 1)
)PY";

// transformers loads the export and its logits are our fine-tuned model's (MEGATRON_HF_PARITY=1 only).
void check_in_transformers(const fs::path& dir) {
  Context& ctx = testing::cpu_context();
  LoadedModel loaded = load_model(ctx, dir / "ft", DType::F32);
  Tensor tokens = Tensor::empty(Shape{1, 24}, DType::I64, ctx.allocator());
  for (int64_t i = 0; i < 24; ++i) tokens.data<int64_t>()[i] = (i * 37 + 5) % 320;
  inference::GPTInference engine(ctx, *loaded.model, 1, 24);
  Tensor logits = engine.forward(ctx, tokens);
  const SafetensorsTensor files[] = {{"tokens", DType::I64, tokens.shape(), tokens.data_ptr()},
                                     {"logits", DType::F32, logits.shape(), logits.data_ptr()}};
  write_safetensors(dir / "reference.safetensors", files);
  testing::run_python(dir, kTransformersCheck, dir.string());
}

TEST(SftFinetune, ImportedLlamaLearnsTheAnswersAndExportsBack) {
#ifndef PRETRAIN_GPT_EXE
  GTEST_SKIP() << "pretrain_gpt is not built";
#else
  if (!data::tokenizer_available("SFTTokenizer")) GTEST_SKIP() << "built without PCRE2";
  const fs::path dir = testing::make_temp_dir("sft_finetune");
  json config;
  const TensorMap original = tiny_llama(config);
  write_hf_checkpoint(dir / "hf", config, original);
  import_hf_checkpoint(dir / "hf", dir / "ours");
  const std::string flags =
      "--sft --data-path " + (fixtures() / "conversations.jsonl").string() + " --tokenizer-type SFTTokenizer " +
      "--tokenizer-model " + fixtures().string() + " --sft-tokenizer-prompt-format default --load " +
      (dir / "ours").string() + " --use-checkpoint-args --seq-length 128 --micro-batch-size 2 " +
      "--global-batch-size 4 --train-iters 60 --lr 1e-2 --min-lr 1e-3 --lr-decay-style cosine --lr-warmup-iters 3 "
      "--split 100,0,0 --eval-iters 0 --eval-interval 1000 --log-interval 1 --device cpu --seed 3 --save " +
      (dir / "ft").string() + " --save-interval 60";
  const std::string cmd = std::string(PRETRAIN_GPT_EXE) + " " + flags + " > " + (dir / "log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n(see " << (dir / "log").string() << ")";

  const std::vector<double> logged = logged_losses(dir / "log");
  ASSERT_EQ(logged.size(), 60u);
  const double before = assistant_loss(dir / "ours"), after = assistant_loss(dir / "ft");
  std::cout << "assistant-token loss: imported " << before << ", fine-tuned " << after << "; log " << logged.front()
            << " -> " << logged.back() << "\n";
  EXPECT_LT(after, 0.6 * before);
  EXPECT_LT(logged.back(), 0.6 * logged.front());

  const ExportSummary exported = export_hf_checkpoint(dir / "ft", dir / "back");
  EXPECT_EQ(hf_family_name(exported.family), "llama");
  const TensorMap back = read_hf_weights(dir / "back");
  ASSERT_EQ(back.size(), original.size());
  size_t changed = 0;
  for (const auto& [name, t] : original) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_EQ(back.at(name).shape, t.shape) << name;
    EXPECT_EQ(back.at(name).dtype, t.dtype) << name;
    changed += back.at(name).bytes != t.bytes;
  }
  EXPECT_GT(changed, original.size() / 2) << "fine-tuning moved the weights";
  EXPECT_EQ(read_hf_config(dir / "back")["vocab_size"], 320);
  const char* parity = std::getenv("MEGATRON_HF_PARITY");
  if (parity != nullptr && std::string(parity) == "1") check_in_transformers(dir);
  fs::remove_all(dir);
#endif
}

}  // namespace
}  // namespace megatron::checkpoint
