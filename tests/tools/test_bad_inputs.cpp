// Every bad input of docs/robustness.md's table, through the tool a user runs: each must end with exit
// status 1 (2 for a command-line syntax error that CLI11 reports) and a message naming what is wrong, where
// (the path and the byte offset or line, or the flag) and which constraint, within a minute -- never a signal,
// an uncaught exception or a hang -- and the message must not hold raw control bytes (outside text is shown
// escaped). The table here and the one in the docs list the same rows.
#include <gtest/gtest.h>

#include <functional>
#include <fstream>
#include <iostream>

#include "child_process.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/data/indexed_dataset.h"
#include "megatron/data/tokenizers/tokenizer.h"
#include "temp_dirs.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Flips one bit of `path` at byte `at` (counted from the end when negative).
void flip_byte(const fs::path& path, int64_t at) {
  std::string bytes = read_text(path);
  bytes[size_t(at < 0 ? int64_t(bytes.size()) + at : at)] ^= 0x10;
  write_text(path, bytes);
}

// A small valid dataset <dir>/good (uint16 tokens).
std::string good_dataset(const fs::path& dir) {
  const std::string prefix = (dir / "good").string();
  data::IndexedDatasetWriter writer(prefix, data::TokenDType::U16);
  for (int d = 0; d < 200; ++d) {
    std::vector<int32_t> tokens;
    for (int i = 0; i < 30; ++i) tokens.push_back((d * 131 + i * 17) % 500);
    writer.add_document(std::span<const int32_t>(tokens));
  }
  writer.finalize();
  return prefix;
}

std::vector<std::string> model_flags() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-3", "--device",
          "cpu", "--cpu-threads", "1", "--eval-iters", "0", "--attention-dropout", "0"};
}

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// A checkpoint of two iterations (iteration 1 and 2, tracker 2), saved by pretrain_gpt once per process and
// copied into each case's directory.
const fs::path& saved_checkpoint() {
  static const fs::path root = [] {
    const fs::path dir = testing::make_temp_dir("bad_inputs_checkpoint"), root = dir / "ckpt";
    testing::ChildProcess run(with(with({PRETRAIN_GPT_EXE}, model_flags()),
                                   {"--mock-data", "--vocab-size", "4096", "--save", root.string(), "--save-interval", "1"}),
                              {.output = dir / "save.log"});
    run.wait(300s);
    if (run.exit_code() != 0) ADD_FAILURE() << "saving the test checkpoint failed:\n" << run.output();
    return root;
  }();
  return root;
}

fs::path copy_checkpoint(const fs::path& dir) {
  fs::copy(saved_checkpoint(), dir / "ckpt", fs::copy_options::recursive);
  return dir / "ckpt";
}

struct BadInput {
  std::string name;
  std::string tool;
  // Writes what the case needs into `dir` and returns the tool's arguments.
  std::function<std::vector<std::string>(const fs::path& dir)> setup;
  std::vector<std::string> expected;  // parts of the message
  int exit_code = 1;
};

std::vector<BadInput> pretrain_cases();
std::vector<BadInput> pretrain_checkpoint_cases();
std::vector<BadInput> data_tool_cases();
std::vector<BadInput> checkpoint_tool_cases();

std::vector<BadInput> all_cases() {
  std::vector<BadInput> all = pretrain_cases();
  for (auto* more : {&pretrain_checkpoint_cases, &data_tool_cases, &checkpoint_tool_cases})
    for (BadInput& c : more()) all.push_back(std::move(c));
  return all;
}

class BadInputs : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputs, EndWithAClearErrorNotASignalOrAHang) {
  const BadInput& c = GetParam();
  const fs::path dir = testing::make_temp_dir("bad_input_" + c.name);
  std::vector<std::string> argv = {c.tool};
  for (std::string& a : c.setup(dir)) argv.push_back(std::move(a));
  // A build without PCRE2 has no GPT-2, HF or tiktoken tokenizers: their files' rows cannot be reached there.
  for (size_t i = 1; i + 1 < argv.size(); ++i)
    if (argv[i] == "--tokenizer-type" && !data::tokenizer_available(argv[i + 1]))
      GTEST_SKIP() << argv[i + 1] << " is not built here";
  testing::ChildProcess run(argv, {.output = dir / "output.log",
                                   .environment = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"}});
  ASSERT_TRUE(run.wait(60s)) << "still running after 60 s:\n" << run.output();
  const std::string output = run.output();
  EXPECT_EQ(run.signal(), 0) << "ended by signal " << run.signal() << ":\n" << output;
  EXPECT_EQ(run.exit_code(), c.exit_code) << output;
  EXPECT_EQ(output.find("terminate called"), std::string::npos) << output;
  for (const std::string& part : c.expected)
    EXPECT_NE(output.find(part), std::string::npos) << "missing '" << part << "' in:\n" << output;
  for (char ch : output)
    EXPECT_FALSE((ch >= 0 && ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f) << "raw control byte in:\n" << output;
  // The message, for the table in docs/robustness.md: from the line naming the error to the end.
  const size_t at = output.find("error");
  const size_t line = at == std::string::npos ? 0 : output.rfind('\n', at);
  std::cout << "[message] " << c.name << ": " << output.substr(line == std::string::npos ? 0 : line + 1) << "\n";
  fs::remove_all(dir);
}

void PrintTo(const BadInput& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(Tools, BadInputs, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name; });

std::vector<BadInput> pretrain_cases() {
  const auto pretrain = [](std::vector<std::string> more) { return with(model_flags(), more); };
  const auto on_dataset = [](const fs::path& dir, std::vector<std::string> more) {
    return with(with(model_flags(), {"--data-path", good_dataset(dir), "--tokenizer-type", "NullTokenizer",
                                     "--vocab-size", "512", "--data-cache-path", (dir / "cache").string()}),
                more);
  };
  return {
      {"pretrain_unknown_flag", PRETRAIN_GPT_EXE,
       [=](const fs::path&) { return pretrain({"--mock-data", "--vocab-size", "4096", "--hiden-size", "8"}); },
       {"unknown flag --hiden-size; did you mean --hidden-size?"}},
      {"pretrain_planner_negative_host_memory", PRETRAIN_GPT_EXE,
       [=](const fs::path&) {
         return pretrain({"--mock-data", "--vocab-size", "4096", "--dry-run-layouts", "4", "--dry-run-host-memory", "-1"});
       },
       {"--dry-run-host-memory -1: must be >= 0 (GiB per node; 0: this machine's)"}},
      {"pretrain_planner_no_gpus_per_node", PRETRAIN_GPT_EXE,
       [=](const fs::path&) {
         return pretrain({"--mock-data", "--vocab-size", "4096", "--dry-run-layouts", "4", "--dry-run-gpus-per-node", "0"});
       },
       {"--dry-run-gpus-per-node 0: must be >= 1"}},
      {"pretrain_not_a_number", PRETRAIN_GPT_EXE,
       [=](const fs::path&) { return pretrain({"--mock-data", "--vocab-size", "4096", "--lr", "fast"}); },
       {"--lr expects a number, got 'fast'"}},
      {"pretrain_split_letters", PRETRAIN_GPT_EXE, [=](const fs::path& d) { return on_dataset(d, {"--split", "a,b,c"}); },
       {"--split \"a,b,c\": item 1 (\"a\") is not a number"}},
      {"pretrain_idx_garbage", PRETRAIN_GPT_EXE,
       [=](const fs::path& d) {
         auto args = on_dataset(d, {});
         write_text(d / "good.idx", std::string("\x1b[2J\x00\x01garbage-garbage-garbage-garbage-garbage", 44));
         return args;
       },
       {"good.idx: bad magic at byte 0", "found \"\\x1b[2J\\x00\\x01gar\""}},
      {"pretrain_idx_truncated", PRETRAIN_GPT_EXE,
       [=](const fs::path& d) {
         auto args = on_dataset(d, {});
         fs::resize_file(d / "good.idx", fs::file_size(d / "good.idx") - 3);
         return args;
       },
       {"good.idx: truncated: expected", "for 200 sequences and 201 document indices"}},
      {"pretrain_bin_short", PRETRAIN_GPT_EXE,
       [=](const fs::path& d) {
         auto args = on_dataset(d, {});
         fs::resize_file(d / "good.bin", 100);
         return args;
       },
       {"good.bin: shorter than the index says: expected 12000 bytes", "found 100"}},
      {"pretrain_cache_corrupt", PRETRAIN_GPT_EXE,
       [=](const fs::path& d) {
         const auto args = on_dataset(d, {"--split", "100,0,0"});
         testing::ChildProcess build(with({PRETRAIN_GPT_EXE}, args), {.output = d / "build.log"});
         build.wait(120s);
         for (const auto& f : fs::directory_iterator(d / "cache"))
           if (f.path().string().ends_with("-train-shuffle_index.npy")) flip_byte(f.path(), -2);
         return args;
       },
       {"the index cache", "shuffle_index", "delete these files to rebuild them"}},
      {"pretrain_vocab_json_garbage", PRETRAIN_GPT_EXE,
       [=](const fs::path& d) {
         write_text(d / "vocab.json", "{\"a\": 1, \"b\" 2}");
         write_text(d / "merges.txt", "#version: 0.2\n");
         return pretrain({"--mock-data", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                          (d / "vocab.json").string(), "--merge-file", (d / "merges.txt").string()});
       },
       {"vocab.json: malformed JSON at byte 14"}},
  };
}

// pretrain_gpt --load of a damaged copy of saved_checkpoint(): each names the file and the intact checkpoint.
std::vector<BadInput> pretrain_checkpoint_cases() {
  const auto pretrain = [](std::vector<std::string> more) { return with(model_flags(), more); };
  return {
      {"pretrain_load_shard_corrupt", PRETRAIN_GPT_EXE,
       [=](const fs::path& d) {
         const fs::path root = copy_checkpoint(d);
         flip_byte(root / "iter_0000002" / "rank_00000.safetensors", -100);
         return pretrain({"--mock-data", "--vocab-size", "4096", "--load", root.string(), "--train-iters", "3"});
       },
       {"iter_0000002/rank_00000.safetensors is corrupt", "CRC-32C",
        "the newest intact checkpoint in", "is iter_0000001 (iteration 1): pass --load-fallback-to-intact"}},
      {"pretrain_load_shard_truncated", PRETRAIN_GPT_EXE,
       [=](const fs::path& d) {
         const fs::path root = copy_checkpoint(d);
         const fs::path shard = root / "iter_0000002" / "rank_00000.safetensors";
         fs::resize_file(shard, fs::file_size(shard) / 2);
         return pretrain({"--mock-data", "--vocab-size", "4096", "--load", root.string(), "--train-iters", "3"});
       },
       {"rank_00000.safetensors", "truncated", "is iter_0000001 (iteration 1)"}},
      {"pretrain_load_metadata_garbage", PRETRAIN_GPT_EXE,
       [=](const fs::path& d) {
         const fs::path root = copy_checkpoint(d);
         write_text(root / "iter_0000002" / "metadata.json", "{\"format\": \"megatron.cpp/sharded\", \"vers");
         return pretrain({"--mock-data", "--vocab-size", "4096", "--load", root.string(), "--train-iters", "3"});
       },
       {"iter_0000002/metadata.json is not valid JSON", "is iter_0000001 (iteration 1)"}},
      {"pretrain_load_tracker_garbage", PRETRAIN_GPT_EXE,
       [=](const fs::path& d) {
         const fs::path root = copy_checkpoint(d);
         write_text(root / "latest_checkpointed_iteration.txt", "2\x07x\n");
         return pretrain({"--mock-data", "--vocab-size", "4096", "--load", root.string(), "--train-iters", "3"});
       },
       {"latest_checkpointed_iteration.txt holds \"2\\x07x\"; expected an iteration number or 'release'"}},
  };
}

std::vector<BadInput> data_tool_cases() {
  const auto preprocess = [](const fs::path& d, const std::string& jsonl, std::vector<std::string> more) {
    write_text(d / "in.jsonl", jsonl);
    return with({"--input", (d / "in.jsonl").string(), "--output-prefix", (d / "out").string()}, more);
  };
  const std::vector<std::string> null_tokenizer = {"--tokenizer-type", "NullTokenizer", "--vocab-size", "100"};
  return {
      {"preprocess_missing_input", PREPROCESS_DATA_EXE,
       [=](const fs::path& d) { return with({"--input", (d / "none.jsonl").string(), "--output-prefix", "x"}, null_tokenizer); },
       {"none.jsonl: cannot stat"}},
      {"preprocess_strict_bad_line", PREPROCESS_DATA_EXE,
       [=](const fs::path& d) {
         return preprocess(d, "{\"text\": \"1 2\"}\n{\"text\": \"3\" \"4\"}\n", with(null_tokenizer, {"--strict"}));
       },
       {"in.jsonl:2 (byte 16): malformed JSON: Expecting ',' delimiter at byte 13 of the line", "--strict"}},
      {"preprocess_tokenizer_json_garbage", PREPROCESS_DATA_EXE,
       [=](const fs::path& d) {
         write_text(d / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": [1, 2]}}");
         return preprocess(d, "{\"text\": \"a\"}\n", {"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                                      (d / "tokenizer.json").string()});
       },
       {"tokenizer.json: model.vocab must be an object"}},
      {"preprocess_tiktoken_bad_line", PREPROCESS_DATA_EXE,
       [=](const fs::path& d) {
         write_text(d / "ranks.tiktoken", "IQ== 0\nIg== 1\n!!! 2\n");
         return preprocess(d, "{\"text\": \"a\"}\n", {"--tokenizer-type", "TikTokenizer", "--tokenizer-model",
                                                      (d / "ranks.tiktoken").string()});
       },
       {"ranks.tiktoken:3: invalid base64 \"!!!\""}},
      {"preprocess_workers_zero", PREPROCESS_DATA_EXE,
       [=](const fs::path& d) { return preprocess(d, "{}\n", with(null_tokenizer, {"--workers", "0"})); },
       {"--workers: Value 0 not in range 1 to 4096"}, 2},
      {"merge_missing_idx", MERGE_DATASETS_EXE,
       [=](const fs::path& d) {
         const std::string good = good_dataset(d);
         return std::vector<std::string>{"--input", good, (d / "absent").string(), "--output-prefix", (d / "m").string()};
       },
       {"absent.idx: cannot open"}},
      {"merge_bad_document_index", MERGE_DATASETS_EXE,
       [=](const fs::path& d) {
         const std::string good = good_dataset(d);
         flip_byte(good + ".idx", -8);  // the last document index no longer equals the sequence count
         return std::vector<std::string>{"--input", good, "--output-prefix", (d / "m").string()};
       },
       {"good.idx: the last document index must be the sequence count 200"}},
  };
}

std::vector<BadInput> checkpoint_tool_cases() {
  const auto convert = [](const fs::path& d, const std::string& config, std::vector<std::string> more) {
    write_text(d / "hf" / "config.json", config);
    return with({"--direction", "hf-to-megatron", "--load-dir", (d / "hf").string(), "--save-dir",
                 (d / "out").string()},
                more);
  };
  const auto generate = [](const fs::path& d, std::vector<std::string> more) {
    return with({"--load", copy_checkpoint(d).string()}, more);
  };
  return {
      {"convert_config_garbage", CONVERT_CHECKPOINT_EXE, [=](const fs::path& d) { return convert(d, "{\"model_type\": ", {}); },
       {"hf/config.json is not valid JSON"}},
      {"convert_zero_heads", CONVERT_CHECKPOINT_EXE,
       [=](const fs::path& d) {
         return convert(d, R"({"model_type": "llama", "vocab_size": 100, "num_hidden_layers": 2, "hidden_size": 64,
                              "num_attention_heads": 0, "intermediate_size": 128})", {});
       },
       {"config.json gives sizes that must be positive: the attention heads (0)"}},
      {"convert_weights_truncated", CONVERT_CHECKPOINT_EXE,
       [=](const fs::path& d) {
         auto args = convert(d, R"({"model_type": "gpt2", "vocab_size": 8, "n_layer": 1, "n_embd": 4, "n_head": 2,
                                   "n_positions": 8})", {});
         const std::vector<float> w(32, 1.0f);
         const checkpoint::SafetensorsTensor t[] = {{"transformer.wte.weight", DType::F32, Shape{8, 4}, w.data()}};
         checkpoint::write_safetensors(d / "hf" / "model.safetensors", t);
         fs::resize_file(d / "hf" / "model.safetensors", fs::file_size(d / "hf" / "model.safetensors") - 4);
         return args;
       },
       {"model.safetensors", "truncated"}},
      {"convert_tp_not_integer", CONVERT_CHECKPOINT_EXE,
       [=](const fs::path& d) { return convert(d, "{}", {"--target-tensor-parallel-size", "two"}); },
       {"--target-tensor-parallel-size \"two\" must be a positive integer"}},
      {"convert_direction", CONVERT_CHECKPOINT_EXE,
       [=](const fs::path& d) { return std::vector<std::string>{"--direction", "sideways", "--load-dir", "a", "--save-dir", "b"}; },
       {"--direction \"sideways\" must be hf-to-megatron or megatron-to-hf"}},
      {"generate_no_checkpoint", GENERATE_EXE,
       [=](const fs::path& d) { return std::vector<std::string>{"--load", (d / "nothing").string(), "--prompt-ids", "1"}; },
       {"nothing holds neither latest_checkpointed_iteration.txt nor metadata.json"}},
      {"generate_prompt_ids", GENERATE_EXE, [=](const fs::path& d) { return generate(d, {"--prompt-ids", "1 2 x3"}); },
       {"--prompt-ids: word 3 (\"x3\") is not an integer"}},
      {"generate_top_p", GENERATE_EXE, [=](const fs::path& d) { return generate(d, {"--prompt-ids", "1", "--top-p", "2"}); },
       {"--top-p 2 is outside [0, 1]"}},
      {"generate_shard_corrupt", GENERATE_EXE,
       [=](const fs::path& d) {
         auto args = generate(d, {"--prompt-ids", "1"});
         const fs::path shard = d / "ckpt" / "iter_0000002" / "rank_00000.safetensors";
         int64_t at = 0;  // a byte of a weight (generate reads no optimizer state)
         {
           const auto file = checkpoint::SafetensorsFile::open(shard);
           at = int64_t(file->data_start() + file->entry("embedding.word_embeddings.weight").begin) + 10;
         }
         flip_byte(shard, at);
         return args;
       },
       {"iter_0000002/rank_00000.safetensors is corrupt", "CRC-32C"}},
  };
}

}  // namespace
}  // namespace megatron
