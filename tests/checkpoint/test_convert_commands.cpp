// convert_checkpoint as users type it: the guides' conversion commands in Megatron-LM's convert.py spelling
// (--model-type GPT --loader llama_mistral|mixtral_hf --saver core|megatron ... and back with --loader megatron
// --saver llama_mistral|mixtral) and in Megatron Bridge's (import --hf-model-path --output-path --tp --pp, export
// --checkpoint-path --output-path) round-trip a tiny Llama (bf16, GQA, untied) and a tiny Mixtral (4 experts,
// top 2) to byte-identical model.safetensors files, as the native spelling does; the imported checkpoints
// hold the same tensors whatever the spelling. Refusals name the flag and what to use instead.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>

#include "harness.h"
#include "hf_test_models.h"
#include "megatron/checkpoint/conversion_command.h"
#include "megatron/checkpoint/shard_reader.h"

namespace megatron::checkpoint {
namespace {

namespace fs = std::filesystem;
using namespace testmodels;

#ifdef CONVERT_CHECKPOINT_EXE
constexpr const char* kConvert = CONVERT_CHECKPOINT_EXE;
#else
constexpr const char* kConvert = nullptr;
#endif

// Runs convert_checkpoint with `args` (shell words); returns its exit status and output.
std::pair<int, std::string> convert(const std::string& args) {
  const std::string cmd = std::string(kConvert) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (pipe && fgets(buf.data(), int(buf.size()), pipe)) out += buf.data();
  const int status = pipe ? pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Tensor `key` of a checkpoint, whole, as bytes.
std::string tensor_bytes(CheckpointReader& r, const std::string& key) {
  const TensorEntry& e = r.tensor(key);
  Tensor t = Tensor::empty(Shape(e.global_shape), e.dtype, testing::cpu_context().allocator());
  r.load_whole(testing::cpu_context(), key, t);
  return std::string(static_cast<const char*>(t.data_ptr()), size_t(t.numel()) * dtype_size(e.dtype));
}

struct Family {
  const char* name;
  json config;
  const char* loader;  // convert.py's loader of this family's HF checkpoint
  const char* saver;   // and its saver back
  const char* extra;   // the guide's other flags
};

class ConvertCommands : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    if (kConvert == nullptr) GTEST_SKIP() << "convert_checkpoint is not built";
    dir_ = testing::make_temp_dir(std::string("convert_cmd_") + GetParam().name);
    write_hf_checkpoint(dir_ / "hf", GetParam().config, hf_tensors(GetParam().config, DType::BF16));
    std::ofstream(dir_ / "hf" / "tokenizer.model") << "not read: tokenizer files are not converted\n";
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // Converts in `spelling`, checks the exit status, returns the output.
  std::string ok(const std::string& args) {
    auto [status, out] = convert(args);
    EXPECT_EQ(status, 0) << args << "\n" << out;
    return out;
  }
  fs::path dir_;
};

TEST_P(ConvertCommands, GuidesSpellingsRoundTripByteIdentically) {
  const Family& f = GetParam();
  const std::string hf = (dir_ / "hf").string(), d = dir_.string();
  ok(str_cat("--direction hf-to-megatron --load-dir ", hf, " --save-dir ", d, "/native --target-tensor-parallel-size 2"));
  ok(str_cat("--direction megatron-to-hf --load-dir ", d, "/native --save-dir ", d, "/native_back"));
  // Megatron-LM's convert.py, as its guides write it, and the reverse.
  const std::string notes = ok(str_cat("--model-type GPT --loader ", f.loader, " --saver core --load-dir ", hf, " --save-dir ",
                                       d, "/mcore --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2 ",
                                       "--tokenizer-model ", hf, "/tokenizer.model ", f.extra));
  EXPECT_NE(notes.find("--tokenizer-model"), std::string::npos) << "accepted flags that change nothing are reported";
  ok(str_cat("--model-type GPT --loader megatron --saver ", f.saver, " --load-dir ", d, "/mcore --save-dir ", d, "/mcore_back"));
  // Megatron Bridge.
  ok(str_cat("import --hf-model-path ", hf, " --output-path ", d, "/bridge --tp 2 --pp 2"));
  ok(str_cat("export --checkpoint-path ", d, "/bridge --output-path ", d, "/bridge_back"));

  const std::string original = slurp(dir_ / "hf" / "model.safetensors");
  ASSERT_FALSE(original.empty());
  for (const char* back : {"native_back", "mcore_back", "bridge_back"})
    EXPECT_TRUE(slurp(dir_ / back / "model.safetensors") == original) << back << " differs from the original";
  // The same checkpoint whatever the spelling: every tensor's bytes equal the native import's.
  CheckpointReader native = CheckpointReader::open(dir_ / "native");
  for (const char* other : {"mcore", "bridge"}) {
    CheckpointReader r = CheckpointReader::open(dir_ / other);
    EXPECT_EQ(r.state()["converted_from"]["target_tensor_parallel_size"], 2) << other;
    EXPECT_EQ(r.state()["converted_from"]["target_pipeline_parallel_size"], 2) << other;
    for (const auto& [name, info] : native.metadata().tensors)
      EXPECT_TRUE(tensor_bytes(r, name) == tensor_bytes(native, name)) << other << ": " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ConvertCommands,
                         ::testing::Values(Family{"llama", llama_config("llama", false, 2), "llama_mistral",
                                                  "llama_mistral", "--checkpoint-type hf --model-size llama3 --bf16"},
                                           Family{"mixtral", mixtral_config(2), "mixtral_hf", "mixtral",
                                                  "--target-expert-parallel-size 2"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ConvertCommandLine, SpellingsMapToOneRequest) {
  const ConversionRequest a = parse_conversion_command(
      {"--model-type", "GPT", "--loader", "llama_mistral", "--saver", "mcore", "--load-dir", "H", "--save-dir", "M",
       "--target-tensor-parallel-size", "8", "--target-pipeline-parallel-size", "2", "--bf16"});
  EXPECT_TRUE(a.import);
  EXPECT_EQ(a.load_dir, "H");
  EXPECT_EQ(a.save_dir, "M");
  EXPECT_EQ(a.tensor_parallel_size, 8);
  EXPECT_EQ(a.pipeline_parallel_size, 2);
  EXPECT_EQ(a.dtype, DType::BF16);
  const ConversionRequest b = parse_conversion_command({"import", "--hf-model-path", "H", "--output-path", "M", "--tp",
                                                        "4", "--pp", "2", "--torch-dtype", "float32"});
  EXPECT_TRUE(b.import);
  EXPECT_EQ(b.tensor_parallel_size, 4);
  EXPECT_EQ(b.pipeline_parallel_size, 2);
  EXPECT_EQ(b.dtype, DType::F32);
  const ConversionRequest c =
      parse_conversion_command({"export", "--checkpoint-path", "M", "--output-path", "H"});
  EXPECT_FALSE(c.import);
  EXPECT_EQ(c.load_dir, "M");
  EXPECT_EQ(c.save_dir, "H");
  const ConversionRequest d = parse_conversion_command(
      {"--model-type", "GPT", "--loader", "megatron", "--saver", "llama_mistral", "--load-dir", "M", "--save-dir", "H",
       "--model-size", "qwen2.5"});
  EXPECT_FALSE(d.import);
  EXPECT_EQ(d.family, HfFamily::Qwen2);
  const ConversionRequest e = parse_conversion_command(
      {"--model-type", "GPT", "--loader", "core", "--saver", "mixtral", "--load-dir", "M", "--save-dir", "H"});
  EXPECT_EQ(e.family, HfFamily::Mixtral);
}

TEST(ConvertCommandLine, RefusalsNameTheFlagAndWhatToUse) {
  testing::expect_error([] { parse_conversion_command({"--model-type", "GPT", "--loader", "llama_mistral", "--saver", "core",
                                                       "--load-dir", "H", "--save-dir", "M", "--checkpoint-type", "meta"}); },
                        {"--checkpoint-type 'meta'", "--checkpoint-type hf"});
  testing::expect_error([] { parse_conversion_command({"--model-type", "BERT", "--loader", "llama_mistral", "--load-dir",
                                                       "H", "--save-dir", "M"}); },
                        {"--model-type 'BERT'", "--model-type GPT"});
  testing::expect_error([] { parse_conversion_command({"--model-type", "GPT", "--loader", "megatron", "--saver", "core",
                                                       "--load-dir", "H", "--save-dir", "M"}); },
                        {"layout-free"});
  testing::expect_error([] { parse_conversion_command({"--model-type", "GPT", "--loader", "llama_mistral", "--load-dir",
                                                       "H", "--save-dir", "M", "--fp16"}); },
                        {"--fp16", "--bf16"});
  testing::expect_error([] { parse_conversion_command({"import", "--hf-model-pth", "H", "--output-path", "M"}); },
                        {"unknown flag --hf-model-pth", "did you mean --hf-model-path?", "--hf-model-path (or --hf-model) is required"});
}

// Sizes are positive integers that fit an int (strtol saturates past LONG_MAX, and int() would wrap what
// lies between), and the text given is echoed escaped.
TEST(ConvertCommandLine, SizesOutOfRangeOrNotNumbersAreRefused) {
  const auto native = [](const std::string& tp) {
    return parse_conversion_command({"--direction", "hf-to-megatron", "--load-dir", "H", "--save-dir", "M",
                                     "--target-tensor-parallel-size", tp});
  };
  EXPECT_EQ(native("4").tensor_parallel_size, 4);
  for (const char* bad : {"0", "-2", "4294967298", "99999999999999999999", "4x", ""})
    testing::expect_error([&] { native(bad); }, {"--target-tensor-parallel-size \"", "must be a positive integer"});
  testing::expect_error([&] { native("2\x1b"); }, {"--target-tensor-parallel-size \"2\\x1b\" must be"});
  testing::expect_error([] { parse_conversion_command({"import", "--hf-model-path", "H", "--output-path", "M", "--tp", "2147483648"}); },
                        {"--tp \"2147483648\" must be a positive integer"});
}

}  // namespace
}  // namespace megatron::checkpoint
