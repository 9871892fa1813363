// generate: sample text from a megatron.cpp checkpoint (trained, or converted from Hugging Face).
//
//   generate --load <checkpoint root> --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json
//       --merge-file merges.txt --prompt "Once upon a time" [--max-new-tokens 64] [--temperature 0.8]
//       [--top-k 40] [--top-p 0.95] [--seed 1234] [--greedy] [--num-samples 1] [--device auto|cpu|cuda]
//       [--ignore-eos]
//
// The prompt is encoded, run through the model once (prefill), then one token per step with the key/value
// cache; sampling per inference/sampler.h; generation stops at --max-new-tokens or at the tokenizer's
// end-of-document token. Without --tokenizer-type, --prompt-ids "1 2 3" gives the prompt as ids and the
// output is ids. On CUDA the model runs in bf16 (its fused attention needs it), on the CPU in fp32.
#include <chrono>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "megatron/data/tokenizers/tokenizer.h"
#include "megatron/checkpoint/model_loader.h"
#include "megatron/core/error.h"
#include "megatron/inference/gpt_inference.h"
#include "megatron/inference/sampler.h"
#include "megatron/train/tool_flags.h"

using namespace megatron;

namespace {

const char* kUsage =
    "usage: generate --load DIR (--prompt TEXT --tokenizer-type T [--vocab-file F --merge-file F | --tokenizer-model F]\n"
    "                | --prompt-ids \"ID ID ...\") [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
    "                [--seed S] [--greedy] [--num-samples N] [--device auto|cpu|cuda] [--ignore-eos]\n";

using train::ToolFlags;

std::vector<train::ToolFlag> known_flags() {
  return {{"--load"},          {"--prompt"},          {"--prompt-ids"},   {"--tokenizer-type"}, {"--vocab-file"},
          {"--merge-file"},    {"--tokenizer-model"}, {"--vocab-size"},   {"--max-new-tokens"}, {"--temperature"},
          {"--top-k"},         {"--top-p"},           {"--seed"},         {"--num-samples"},    {"--device"},
          {"--greedy", false}, {"--ignore-eos", false}};
}

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

inference::SamplingOptions sampling_options(const ToolFlags& f) {
  inference::SamplingOptions sampling;
  sampling.temperature = f.has("--greedy") ? 0.0 : f.number("--temperature", 1.0, 0.0, 1e6);
  sampling.top_k = f.integer("--top-k", 0, 0, kMaxInt32);
  sampling.top_p = f.number("--top-p", 1.0, 0.0, 1.0);
  sampling.seed = uint64_t(f.integer("--seed", 1234, 0, std::numeric_limits<int64_t>::max()));
  inference::validate(sampling);
  return sampling;
}

struct Prompt {
  std::vector<int32_t> ids;
  std::unique_ptr<data::Tokenizer> tokenizer;  // null without --tokenizer-type
  int32_t eod = -1;                            // the tokenizer's end-of-document id; -1: none
};

// The prompt's ids: --prompt encoded by the tokenizer, or --prompt-ids as given.
Prompt read_prompt(const ToolFlags& f) {
  std::vector<int32_t> prompt;
  int32_t eod = -1;
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (f.has("--tokenizer-type")) {
    data::TokenizerConfig tc;
    tc.type = f.text("--tokenizer-type");
    tc.vocab_file = f.text("--vocab-file");
    tc.merge_file = f.text("--merge-file");
    tc.tokenizer_model = f.text("--tokenizer-model");
    if (f.has("--vocab-size")) tc.vocab_size = f.integer("--vocab-size", 0, 1, kMaxInt32);
    tokenizer = data::make_tokenizer(tc);
    eod = tokenizer->eod();
  }
  if (f.has("--prompt")) {
    MEGATRON_CHECK(tokenizer != nullptr, "--prompt needs --tokenizer-type (and its files)");
    prompt = tokenizer->encode(f.text("--prompt"));
  }
  if (f.has("--prompt-ids"))
    for (int64_t id : train::integer_list("--prompt-ids", f.text("--prompt-ids"), 0, kMaxInt32))
      prompt.push_back(int32_t(id));
  MEGATRON_CHECK(!prompt.empty(), "the prompt is empty");
  return {std::move(prompt), std::move(tokenizer), eod};
}

// The model's length limit for this prompt: the prompt plus max_new tokens, within learned positions.
int64_t max_length_for(const checkpoint::LoadedModel& loaded, const std::vector<int32_t>& prompt, int64_t max_new) {
  const nn::TransformerConfig& config = loaded.model->config();
  for (int32_t id : prompt)
    MEGATRON_CHECK(id >= 0 && id < loaded.vocab_size, "prompt id ", id, " is outside the model's vocabulary of ",
                   loaded.vocab_size);
  int64_t max_length = int64_t(prompt.size()) + max_new;
  if (config.position_embedding == nn::PositionEmbedding::LearnedAbsolute)
    max_length = std::min<int64_t>(max_length, config.max_position_embeddings);
  MEGATRON_CHECK(int64_t(prompt.size()) < max_length, "the prompt (", prompt.size(),
                 " tokens) leaves no room in the model's ", config.max_position_embeddings, " positions");
  return max_length;
}

struct GenerateSettings {
  inference::SamplingOptions sampling;
  int64_t max_new = 0;     // tokens generated at most
  int64_t max_length = 0;  // prompt and generated tokens at most
  int32_t eod = -1;        // stops generation unless ignore_eos; -1: none
  bool ignore_eos = false;
};

struct Sample {
  std::vector<int32_t> ids;  // generated, after the prompt
  double seconds = 0;        // generating them (the engine's setup not included)
};

// Sample `sample`: the prompt as one prefill step, then one token per step with the key/value cache, until
// max_new tokens, the model's max_length or the end-of-document token. `host` holds the input ids.
Sample generate_sample(Context& ctx, CpuAllocator& host, const checkpoint::LoadedModel& loaded,
                       const std::vector<int32_t>& prompt, const GenerateSettings& settings, int64_t sample) {
  inference::GPTInference engine(ctx, *loaded.model, 1, settings.max_length);
  Tensor input = Tensor::empty(Shape{1, int64_t(prompt.size())}, DType::I64, host);
  for (size_t i = 0; i < prompt.size(); ++i) input.data<int64_t>()[i] = prompt[i];
  std::vector<int32_t> generated;
  const auto g0 = std::chrono::steady_clock::now();
  uint64_t step = uint64_t(sample) << 32;
  while (engine.length() < settings.max_length) {
    Tensor logits = engine.forward(ctx, input);  // [1, S, padded V]
    const int64_t S = logits.dim(1), V = logits.dim(2);
    std::vector<float> last(static_cast<size_t>(V));
    copy_tensor(ctx, Tensor::from_blob(last.data(), {V}, DType::F32, Device::cpu()), logits.view({S, V}).select(S - 1));
    const int64_t next = inference::pick(last, loaded.vocab_size, step++, settings.sampling);
    if (next == settings.eod && !settings.ignore_eos) break;
    generated.push_back(int32_t(next));
    if (int64_t(generated.size()) >= settings.max_new) break;
    input = Tensor::empty(Shape{1, 1}, DType::I64, host);
    input.data<int64_t>()[0] = next;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();
  return {std::move(generated), seconds};
}

// Prints a sample to stdout: the prompt and the generated text decoded, or without a tokenizer the generated ids.
void print_sample(const Prompt& prompt, const std::vector<int32_t>& generated) {
  if (prompt.tokenizer) {
    std::vector<int32_t> all = prompt.ids;
    all.insert(all.end(), generated.begin(), generated.end());
    std::cout << prompt.tokenizer->decode(all) << "\n";
  } else {
    for (int32_t id : generated) std::cout << id << " ";
    std::cout << "\n";
  }
}

int run(int argc, char** argv) {
  const ToolFlags f(std::vector<std::string>(argv + 1, argv + argc), known_flags(), kUsage);
  if (f.help()) {
    std::cout << kUsage;
    return 0;
  }
  f.require("--load");
  MEGATRON_CHECK(f.has("--prompt") != f.has("--prompt-ids"), "give exactly one of --prompt and --prompt-ids\n", kUsage);
  GenerateSettings settings;
  settings.sampling = sampling_options(f);
  settings.max_new = f.integer("--max-new-tokens", 64, 1, kMaxInt32);
  const int64_t samples = f.integer("--num-samples", 1, 1, kMaxInt32);
  const std::string device = f.choice("--device", "auto", {"auto", "cpu", "cuda"});
  const Prompt prompt = read_prompt(f);
  settings.eod = prompt.eod;
  settings.ignore_eos = f.has("--ignore-eos");

  const bool cuda = device == "cuda" || (device == "auto" && cuda_device_count() > 0);
  auto ctx = Context::create(cuda ? Device::cuda(0) : Device::cpu());
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::LoadedModel loaded = checkpoint::load_model(*ctx, f.text("--load"), cuda ? DType::BF16 : DType::F32);
  settings.max_length = max_length_for(loaded, prompt.ids, settings.max_new);
  std::cerr << "loaded " << f.text("--load") << " (iteration " << loaded.iteration << ", "
            << nn::count_elements(loaded.model->parameters()) << " parameters) on " << ctx->device() << " in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s\n";

  CpuAllocator host;
  for (int64_t sample = 0; sample < samples; ++sample) {
    const Sample out = generate_sample(*ctx, host, loaded, prompt.ids, settings, sample);
    if (samples > 1) std::cout << "--- sample " << sample + 1 << " ---\n";
    print_sample(prompt, out.ids);
    std::cerr << out.ids.size() << " tokens in " << out.seconds << " s (" << double(out.ids.size()) / out.seconds
              << " tokens/s)\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "generate: error: " << e.what() << "\n";
    return 1;
  }
}
