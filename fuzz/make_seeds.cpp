// fuzz_make_seeds OUT_DIR MAKE_FIXTURES_PY: writes every fuzz target's seed corpus to OUT_DIR/<target>/,
// from real files: datasets, caches, shard files and checkpoints written by our own writers, Hugging Face
// configs for every supported family, typical command lines; the tokenizer seeds come from
// fuzz/make_tokenizer_seeds.py (the tests' fixture builder with small vocabularies), run from here.
// Nothing large is committed: the corpora are generated in the build.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "fuzz_support.h"
#include "megatron/checkpoint/hf_convert.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/checkpoint/shard_writer.h"
#include "megatron/checkpoint/training_checkpoint.h"
#include "megatron/data/indexed_dataset.h"
#include "megatron/data/npy_file.h"
#include "megatron/runtime/context.h"
#include "megatron/train/arguments.h"
#include "megatron/train/flags.h"
#include "small_sequences.h"

using namespace megatron;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? std::string(fuzz::kPartSeparator) : "") + parts[i];
  return out;
}

class SeedWriter {
 public:
  explicit SeedWriter(fs::path out) : out_(std::move(out)) {}
  void add(const std::string& target, const std::string& name, const std::string& bytes) {
    fuzz::write_file(out_ / target / name, bytes);
  }

 private:
  fs::path out_;
};

void indexed_dataset_seeds(SeedWriter& seeds, const fs::path& work) {
  using data::TokenDType;
  const std::pair<const char*, TokenDType> kinds[] = {{"u16", TokenDType::U16}, {"i32", TokenDType::I32},
                                                      {"u8", TokenDType::U8}, {"i64", TokenDType::I64}};
  for (const auto& [name, dtype] : kinds) {
    const std::string prefix = (work / name).string();
    data::IndexedDatasetWriter writer(prefix, dtype);
    for (int32_t d = 0; d < 4; ++d) {
      std::vector<int32_t> tokens;
      for (int32_t t = 0; t <= d * 3; ++t) tokens.push_back((d * 37 + t * 11) % 200);
      writer.add_sequence(tokens);
      if (d % 2 == 1) writer.add_sequence(std::vector<int32_t>{});  // an empty sequence in a document
      writer.end_document();
    }
    writer.finalize();
    seeds.add("indexed_dataset", name, joined({read_file(prefix + ".idx"), read_file(prefix + ".bin")}));
  }
}

void npy_cache_seeds(SeedWriter& seeds, const fs::path& work) {
  const fuzz::SmallSequences sequences;
  const data::SequenceRange all{0, fuzz::SmallSequences::kCount};
  for (int64_t samples : {fuzz::kSmallDatasetSamples, int64_t{3}}) {
    const fs::path cache = work / ("cache" + std::to_string(samples));
    const data::GPTDataset dataset(sequences, "fuzz", all, samples, data::Split::train,
                                   fuzz::small_dataset_config(cache.string(), true));
    const std::string base = (cache / (dataset.unique_description_hash() + "-GPTDataset-train-")).string();
    seeds.add("npy_cache", "samples" + std::to_string(samples),
              joined({read_file(base + "document_index.npy"), read_file(base + "sample_index.npy"),
                      read_file(base + "shuffle_index.npy")}));
  }
  const std::vector<int64_t> values = {1, -2, 3, 40000, -5, 6};
  const int64_t shape[] = {3, 2};
  const fs::path wide = work / "wide.npy";
  data::save_npy(wide, std::span<const int64_t>(values), shape);
  seeds.add("npy_cache", "int64_3x2", read_file(wide));
}

void jsonl_seeds(SeedWriter& seeds) {
  seeds.add("jsonl", "plain", "{\"text\": \"1 2 3\", \"title\": \"4 5\"}\n{\"text\": \"6\", \"title\": \"\"}\n");
  seeds.add("jsonl", "lists_and_types",
            "{\"text\": [\"1 2\", \"3\"], \"title\": \"7 8\", \"meta\": {\"n\": [1, 2.5e3, null, true]}}\n"
            "{\"id\": 3, \"text\": null, \"title\": \"9\"}\n\n   \n{\"text\": \"10 x\", \"title\": \"11\"}\r\n");
  seeds.add("jsonl", "escapes",
            "{\"text\": \"1\\u0032 \\ud83d\\ude00 \\u00e9 \\\"q\\\" \\n\", \"title\": \"NaN\", \"t\": -Infinity}\n"
            "{\"text\": \"1\", \"title\": \"2\", \"text\": \"3\"}\n[1, 2]\n{\"text\" \"1\"}\n{\"text\": \"\xff\xfe 5\"}");
}

std::vector<checkpoint::SaveItem> checkpoint_items(Context& ctx) {
  auto filled = [&](const Shape& shape, DType dtype, double base) {
    Tensor t = ctx.empty(shape, dtype);
    visit_dtype(dtype, [&]<class T>() {
      for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = from_double<T>(base + double(i) * 0.5);
    });
    return t;
  };
  using checkpoint::whole_tensor;
  return {{whole_tensor("embedding.word_embeddings.weight", {8, 4}, DType::F32), filled({8, 4}, DType::F32, 1)},
          {checkpoint::block_piece("decoder.final_layernorm.weight", {4}, DType::BF16, 0, 0, 1),
           filled({4}, DType::BF16, 2)},
          {checkpoint::flat_piece("optimizer.state.exp_avg.embedding.word_embeddings.weight", {8, 4}, DType::F32, 0,
                                  32),
           filled({32}, DType::F32, 3)},
          {whole_tensor("steps", {2}, DType::I64), filled({2}, DType::I64, 4)}};
}

void checkpoint_and_safetensors_seeds(SeedWriter& seeds, const fs::path& work) {
  const std::unique_ptr<Context> ctx = Context::cpu();
  train::Arguments args;
  args.model.num_layers = 2;
  args.model.hidden_size = 4;
  args.model.num_attention_heads = 2;
  args.model.seq_length = 8;
  args.model.vocab_size = 8;
  nlohmann::json saved = nlohmann::json::object();
  for (const auto& [key, value] : train::argument_values(args)) saved[key] = value;
  const nlohmann::json state = {{"iteration", 1}, {"consumed_train_samples", 16}, {"args", saved},
                                {"rng", {{"seed", 1234}, {"generator", "philox4x32-10"}}}};
  const fs::path root = work / "ckpt";
  checkpoint::save_checkpoint(*ctx, root, 1, checkpoint_items(*ctx), state);
  const fs::path dir = root / "iter_0000001";
  const std::string tracker = read_file(root / "latest_checkpointed_iteration.txt");
  const std::string metadata = read_file(dir / "metadata.json"), shard = read_file(dir / "rank_00000.safetensors");
  seeds.add("checkpoint", "saved", joined({tracker, metadata, shard}));
  seeds.add("checkpoint", "release", joined({"release\n", metadata, shard}));
  seeds.add("safetensors", "shard", shard);
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const uint8_t flags[] = {1, 0, 1};
  const checkpoint::SafetensorsTensor tensors[] = {{"w", DType::F32, Shape{2, 3}, values.data()},
                                                   {"mask", DType::U8, Shape{3}, flags, true},
                                                   {"empty", DType::BF16, Shape{0, 4}, nullptr}};
  checkpoint::write_safetensors(work / "model.safetensors", tensors, {{"format", "pt"}});
  seeds.add("safetensors", "model", read_file(work / "model.safetensors"));
}

void hf_config_seeds(SeedWriter& seeds) {
  using checkpoint::HfFamily;
  for (HfFamily family : {HfFamily::Llama, HfFamily::Mistral, HfFamily::Qwen2, HfFamily::Mixtral, HfFamily::GPT2}) {
    train::Arguments a;
    train::ModelArguments& m = a.model;
    m.num_layers = 2;
    m.hidden_size = 64;
    m.num_attention_heads = 4;
    m.seq_length = 32;
    m.vocab_size = 300;
    if (family == HfFamily::GPT2) {
      m.untie_embeddings_and_output_weights = false;
    } else {
      m.num_query_groups = 2;
      m.group_query_attention = true;
      m.swiglu = true;
      m.normalization = "RMSNorm";
      m.position_embedding_type = "rope";
      m.untie_embeddings_and_output_weights = true;
      m.disable_bias_linear = family != HfFamily::Qwen2;
    }
    if (family == HfFamily::Mixtral) {
      a.moe.num_experts = 4;
      a.moe.moe_router_topk = 2;
    }
    train::resolve(a);
    seeds.add("hf_config", checkpoint::hf_family_name(family),
              checkpoint::hf_config_from_model(family, a, DType::BF16).dump(2));
  }
}

void command_line_seeds(SeedWriter& seeds) {
  const std::vector<std::pair<std::string, std::string>> lines = {
      {"quickstart", "--num-layers\n4\n--hidden-size\n128\n--num-attention-heads\n4\n--seq-length\n64\n"
                     "--micro-batch-size\n8\n--global-batch-size\n8\n--train-iters\n200\n--lr\n1e-3\n--mock-data\n"
                     "--vocab-size\n4096\n--split\n969,30,1\n--save\nckpt\n--save-interval\n100"},
      {"parallel", "--num-layers=8\n--hidden-size=256\n--num-attention-heads=8\n--num-query-groups\n2\n"
                   "--group-query-attention\n--swiglu\n--normalization\nRMSNorm\n--position-embedding-type\nrope\n"
                   "--seq-length\n128\n--micro-batch-size\n1\n--global-batch-size\n16\n--train-iters\n10\n--lr\n3e-4\n"
                   "--tensor-model-parallel-size\n2\n--pipeline-model-parallel-size\n2\n--sequence-parallel\n"
                   "--use-distributed-optimizer\n--data-path\n0.7\na_text_document\n0.3\nb_text_document\n"
                   "--tokenizer-type\nNullTokenizer\n--vocab-size\n1000\n--bf16\n--distributed-timeout-minutes\n0.5"},
      {"moe", "--num-layers\n2\n--hidden-size\n64\n--num-attention-heads\n4\n--seq-length\n32\n"
              "--micro-batch-size\n2\n--train-iters\n5\n--lr\n1e-3\n--mock-data\n--vocab-size\n4096\n"
              "--num-experts\n4\n--moe-router-topk\n2\n--expert-model-parallel-size\n2\n"
              "--moe-layer-freq\n[0]*1+[1]*1\n--recompute-granularity\nfull\n--recompute-method\nuniform\n"
              "--recompute-num-layers\n1\n--pipeline-model-parallel-layout\nEt|tL"}};
  for (const auto& [name, text] : lines) {
    seeds.add("command_line", name + "_1rank", std::string(1, '\0') + text);
    seeds.add("command_line", name + "_4ranks", std::string(1, '\3') + text);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_make_seeds OUT_DIR MAKE_FIXTURES_PY\n";
    return 2;
  }
  try {
    const fs::path out = argv[1], work = fuzz::scratch_dir() / "seeds_work";
    fs::remove_all(out);
    fs::create_directories(work);
    SeedWriter seeds(out);
    indexed_dataset_seeds(seeds, work);
    npy_cache_seeds(seeds, work);
    jsonl_seeds(seeds);
    checkpoint_and_safetensors_seeds(seeds, work);
    hf_config_seeds(seeds);
    command_line_seeds(seeds);
    const std::string command = "python3 " + (fs::path(MEGATRON_FUZZ_SOURCE_DIR) / "make_tokenizer_seeds.py").string() +
                                " " + out.string() + " " + argv[2];
    if (std::system(command.c_str()) != 0) {
      std::cerr << "fuzz_make_seeds: " << command << " failed (python3 with tokenizers, tiktoken and sentencepiece "
                << "is required; scripts/deps.sh installs them)\n";
      return 1;
    }
    std::cout << "fuzz seeds written to " << out.string() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_seeds: " << e.what() << "\n";
    return 1;
  }
}
