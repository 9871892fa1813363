// parity_export: runs pretrain_gpt's training step for --train-iters iterations and writes what the PyTorch
// reference (bench/reference/parity.py) needs to retrace the run from the same starting point:
//
//   parity_export --parity-dir DIR [--parity-name NAME] <pretrain_gpt flags, e.g. --mock-data ...>
//
//   DIR/weights.safetensors  the initial parameters, Megatron-core names, in the run's dtype
//   DIR/batches.npy          int64 [iterations, global batch, seq + 1]: every sample the run consumed
//   DIR/config.json          the model architecture, the dtype, the optimizer settings, the micro-batch size
//   DIR/ours.json            per iteration: lm loss, grad norm (before clipping), learning rate
//
// The reference then checks losses and grad norms (bench/reference/parity.py). Dropout must be 0 (the
// reference does not replay our Philox masks) and the weight-decay schedule constant.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "megatron/checkpoint/safetensors.h"
#include "megatron/data/npy_file.h"
#include "megatron/nn/gpt_model.h"
#include "megatron/train/flags.h"
#include "megatron/train/model_config.h"
#include "megatron/trainer/trainer.h"

using namespace megatron;
namespace fs = std::filesystem;

namespace {

// `m`: the resolved model arguments of `c`.
nlohmann::json model_json(const train::ModelArguments& m, const nn::TransformerConfig& c) {
  return {{"num_layers", m.num_layers},
          {"hidden_size", m.hidden_size},
          {"num_attention_heads", m.num_attention_heads},
          {"num_query_groups", m.num_query_groups},
          {"ffn_hidden_size", m.ffn_hidden_size},
          {"seq_length", m.seq_length},
          {"max_position_embeddings", m.max_position_embeddings},
          {"padded_vocab_size", c.padded_vocab_size},
          {"position_embedding_type", m.position_embedding_type},
          {"rotary_percent", m.rotary_percent},
          {"rotary_base", m.rotary_base},
          {"swiglu", m.swiglu},
          {"normalization", m.normalization},
          {"norm_epsilon", m.norm_epsilon},
          {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights},
          {"disable_bias_linear", m.disable_bias_linear},
          {"init_method_std", m.init_method_std}};
}

void write_weights(Context& ctx, nn::GPTModel& model, const fs::path& path) {
  CpuAllocator host;
  std::vector<Tensor> copies;
  std::vector<checkpoint::SafetensorsTensor> tensors;
  for (nn::Parameter* p : model.parameters()) {
    copies.push_back(to_device(ctx, p->value, Device::cpu(), host));
    tensors.push_back({p->name, p->value.dtype(), p->value.shape(), copies.back().data_ptr()});
  }
  checkpoint::write_safetensors(path, tensors);
}

int run(std::vector<std::string> argv) {
  fs::path dir;
  std::string name = "parity";
  std::vector<std::string> rest;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--parity-dir" && i + 1 < argv.size()) dir = argv[++i];
    else if (argv[i] == "--parity-name" && i + 1 < argv.size()) name = argv[++i];
    else rest.push_back(argv[i]);
  }
  MEGATRON_CHECK(!dir.empty(), "parity_export: --parity-dir DIR is required");
  train::Arguments args = train::parse_arguments(rest);
  train::resolve_and_validate(args);
  MEGATRON_CHECK(args.model.hidden_dropout == 0 && args.model.attention_dropout == 0,
                 "parity_export: pass --hidden-dropout 0 --attention-dropout 0 (the reference has no Philox masks)");
  MEGATRON_CHECK(!args.model.apply_layernorm_1p,
                 "parity_export: drop --apply-layernorm-1p (the PyTorch reference's norms scale by their weight)");
  fs::create_directories(dir);

  const Device device = args.training.device == "cpu" || cuda_device_count() == 0 ? Device::cpu() : Device::cuda(0);
  auto ctx = Context::create(device);
  ctx->set_deterministic(args.training.deterministic_mode);
  const nn::TransformerConfig config = train::transformer_config(args, uint64_t(args.training.seed));
  nn::GPTModel model(*ctx, config);
  write_weights(*ctx, model, dir / "weights.safetensors");

  // Record every sample the trainer draws, in order.
  const int64_t eod = args.model.vocab_size - 1;
  trainer::TrainingData data(args, eod);
  trainer::SampleStream source = data.stream(data::Split::train);
  CpuAllocator host;
  const int64_t width = args.model.seq_length + 1;
  std::vector<int64_t> recorded;
  trainer::SampleStream recording(
      [&](int64_t, std::span<int64_t> out) {
        Tensor one = source.next(1, host);
        std::copy_n(one.data<int64_t>(), width, out.begin());
        recorded.insert(recorded.end(), out.begin(), out.end());
      },
      source.size(), width);

  trainer::Trainer trainer(*ctx, args, model);
  nlohmann::json steps = nlohmann::json::array();
  for (int64_t it = 1; it <= args.training.train_iters; ++it) {
    trainer::StepResult r = trainer.train_step(recording, it);
    MEGATRON_CHECK(!r.skipped && r.grad_norm, "parity_export: iteration ", it,
                   " was skipped or has no grad norm (use --clip-grad > 0 and no fp16 overflow)");
    steps.push_back({{"loss", r.loss}, {"grad_norm", *r.grad_norm}, {"lr", r.learning_rate}});
    std::printf("iteration %lld: loss %.6f grad norm %.6f lr %.3e\n", static_cast<long long>(it), r.loss,
                *r.grad_norm, r.learning_rate);
  }

  const int64_t iters = args.training.train_iters, gbs = args.training.global_batch_size;
  const std::vector<int64_t> shape = {iters, gbs, width};
  data::save_npy<int64_t>(dir / "batches.npy", recorded, shape);
  const auto& t = args.training;
  nlohmann::json meta = {{"name", name},
                         {"dtype", config.params_dtype == DType::BF16 ? "bf16" : (config.params_dtype == DType::F16 ? "fp16" : "f32")},
                         {"device", device.is_cuda() ? "cuda" : "cpu"},
                         {"micro_batch_size", t.micro_batch_size},
                         {"global_batch_size", gbs},
                         {"model", model_json(args.model, config)},
                         {"optimizer",
                          {{"weight_decay", t.weight_decay},
                           {"adam_beta1", t.adam_beta1},
                           {"adam_beta2", t.adam_beta2},
                           {"adam_eps", t.adam_eps},
                           {"clip_grad", t.clip_grad}}}};
  std::ofstream(dir / "config.json") << meta.dump(2) << "\n";
  std::ofstream(dir / "ours.json") << nlohmann::json{{"steps", steps}}.dump(2) << "\n";
  std::cout << "parity_export: wrote " << dir << " (" << iters << " iterations)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << "parity_export: error: " << e.what() << "\n";
    return 1;
  }
}
