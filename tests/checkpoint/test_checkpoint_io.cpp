// The sharded checkpoint on disk: Megatron's layout, per-rank shard files with checksums, loading at
// another layout (TP=2 x DP=2 <-> TP=1, column blocks, flat ranges), corruption and truncation refused with
// the file and the tensor named, crashes during a save (fault hooks and a killed child process) leaving the
// previous checkpoint loadable, --keep-last retention, and the asynchronous writer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "harness.h"
#include "megatron/checkpoint/async_saver.h"
#include "megatron/checkpoint/checkpoint_dir.h"
#include "megatron/checkpoint/checkpoint_verify.h"
#include "megatron/checkpoint/safetensors.h"
#include "megatron/checkpoint/shard_reader.h"
#include "megatron/checkpoint/shard_writer.h"
#include "megatron/checkpoint/snapshot_stager.h"
#include "megatron/checkpoint/training_checkpoint.h"

namespace megatron::checkpoint {
namespace {

namespace fs = std::filesystem;

Context& cpu() { return testing::cpu_context(); }

// A CPU tensor whose element i is base + i * step (exact in f32 for the sizes used).
Tensor make_tensor(const Shape& shape, DType dtype, double base, double step = 1.0) {
  Tensor t = cpu().empty(shape, dtype);
  visit_dtype(dtype, [&]<class T>() {
    for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = from_double<T>(base + double(i) * step);
  });
  return t;
}
std::vector<double> values(const Tensor& t) { return testing::to_doubles(cpu(), t); }

// A "rank's" local piece of a CPU tensor `global` (boxes of a 2-d tensor only).
Tensor local_piece(const Tensor& global, const ShardSpec& s) {
  Tensor out = cpu().empty(Shape(s.local_shape), global.dtype());
  const size_t es = dtype_size(global.dtype());
  const int64_t cols = global.dim(1);
  for (int64_t r = 0; r < s.local_shape[0]; ++r)
    std::memcpy(static_cast<char*>(out.data_ptr()) + size_t(r * s.local_shape[1]) * es,
                static_cast<const char*>(global.data_ptr()) + size_t((s.global_offset[0] + r) * cols + s.global_offset[1]) * es,
                size_t(s.local_shape[1]) * es);
  return out;
}

std::vector<SaveItem> simple_items(double base) {
  return {{whole_tensor("w", {4, 6}, DType::F32), make_tensor({4, 6}, DType::F32, base)},
          {whole_tensor("b", {6}, DType::BF16), make_tensor({6}, DType::BF16, base, 0.5)},
          {whole_tensor("steps", {2}, DType::I64), make_tensor({2}, DType::I64, base)}};
}

TEST(CheckpointIO, SavesMegatronLayoutAndLoadsItBack) {
  fs::path root = testing::make_temp_dir("ckpt_layout");
  save_checkpoint(cpu(), root, 100, simple_items(1.0), {{"note", "hello"}});
  EXPECT_TRUE(fs::is_directory(root / "iter_0000100"));
  EXPECT_TRUE(fs::exists(root / "iter_0000100" / "metadata.json"));
  EXPECT_TRUE(fs::exists(root / "iter_0000100" / "rank_00000.safetensors"));
  std::ifstream tracker(root / "latest_checkpointed_iteration.txt");
  std::string text((std::istreambuf_iterator<char>(tracker)), {});
  EXPECT_EQ(text, "100\n");

  CheckpointReader r = CheckpointReader::open(root);
  EXPECT_EQ(r.iteration(), 100);
  EXPECT_EQ(r.state()["note"], "hello");
  const TensorEntry& w = r.tensor("w");
  EXPECT_EQ(w.global_shape, (std::vector<int64_t>{4, 6}));
  ASSERT_EQ(w.pieces.size(), 1u);
  EXPECT_EQ(w.pieces[0].file, "rank_00000.safetensors");
  EXPECT_EQ(w.pieces[0].bytes, 96u);
  for (const char* key : {"w", "b", "steps"}) {
    const TensorEntry& e = r.tensor(key);
    Tensor got = cpu().empty(Shape(e.global_shape), e.dtype);
    r.load_whole(cpu(), key, got);
    for (const SaveItem& it : simple_items(1.0))
      if (it.spec.key == key) {
        EXPECT_EQ(values(got), values(it.data)) << key;
      }
  }
  // A bf16 tensor loads into f32 (exact) and an f32 one into bf16 (rounded like CUDA does).
  Tensor b32 = cpu().empty({6}, DType::F32);
  r.load(cpu(), whole_tensor("b", {6}, DType::F32), b32);
  EXPECT_EQ(values(b32), values(make_tensor({6}, DType::BF16, 1.0, 0.5)));
  testing::expect_error([&] { r.tensor("nope"); }, {"no tensor 'nope'", "iter_0000100"});
  testing::expect_error([&] { r.load(cpu(), whole_tensor("w", {6, 4}, DType::F32), cpu().empty({6, 4}, DType::F32)); },
                        {"'w'", "[4, 6] in the checkpoint", "[6, 4] in this model"});
  testing::expect_error([&] { r.load(cpu(), whole_tensor("steps", {2}, DType::F32), cpu().empty({2}, DType::F32)); },
                        {"'steps'", "i64", "cannot be loaded as f32"});
}

// Saves a [6, 8] weight and a [8] bias as four ranks of TP=2 x DP=2 would: the weight in TP row blocks
// (each held by both DP ranks, replica id = DP rank), the bias in TP halves.
void save_tp2_dp2(const fs::path& root, int64_t iteration, const Tensor& weight, const Tensor& bias) {
  const fs::path tmp = prepare_save_directory(root, iteration);
  std::vector<SavedPiece> gathered;  // what rank 0 gathers
  for (int tp = 0; tp < 2; ++tp)
    for (int dp = 0; dp < 2; ++dp) {
      const int rank = tp + 2 * dp;  // Megatron's order: TP fastest
      ShardSpec w = block_piece("weight", {6, 8}, DType::F32, 0, tp, 2, dp);
      ShardSpec b = block_piece("bias", {8}, DType::F32, 0, tp, 2, dp);
      Tensor bias_half = cpu().empty({4}, DType::F32);
      std::memcpy(bias_half.data_ptr(), bias.data<float>() + 4 * tp, 16);
      HostSnapshot snap = snapshot(cpu(), rank, {{w, local_piece(weight, w)}, {b, bias_half}}, true);
      std::vector<SavedPiece> mine = write_rank_file(tmp, snap, iteration);
      gathered.insert(gathered.end(), mine.begin(), mine.end());
    }
  publish_checkpoint(root, iteration, gathered, nlohmann::json::object());
}

TEST(CheckpointIO, ReshardsBetweenTp2Dp2AndTp1AndOtherLayouts) {
  fs::path root = testing::make_temp_dir("ckpt_reshard");
  const Tensor weight = make_tensor({6, 8}, DType::F32, 0.0, 0.25), bias = make_tensor({8}, DType::F32, 100.0);
  save_tp2_dp2(root, 5, weight, bias);
  CheckpointReader r = CheckpointReader::open(root);
  // Replicas are not saved: two pieces per tensor, in the files of DP rank 0 (ranks 0 and 1).
  ASSERT_EQ(r.tensor("weight").pieces.size(), 2u);
  EXPECT_EQ(r.tensor("weight").pieces[1].file, "rank_00001.safetensors");
  EXPECT_TRUE(SafetensorsFile::open(r.directory() / "rank_00002.safetensors")->entries().empty());
  // TP=1: the whole tensors.
  Tensor w = cpu().empty({6, 8}, DType::F32), b = cpu().empty({8}, DType::F32);
  r.load_whole(cpu(), "weight", w);
  r.load_whole(cpu(), "bias", b);
  EXPECT_EQ(values(w), values(weight));
  EXPECT_EQ(values(b), values(bias));
  // TP=4 along columns, and a distributed optimizer's flat ranges.
  for (int tp = 0; tp < 4; ++tp) {
    ShardSpec s = block_piece("weight", {6, 8}, DType::F32, 1, tp, 4);
    Tensor got = cpu().empty(Shape(s.local_shape), DType::F32);
    r.load(cpu(), s, got);
    EXPECT_EQ(values(got), values(local_piece(weight, s)));
  }
  ShardSpec flat = flat_piece("weight", {6, 8}, DType::F32, 13, 37);
  Tensor got = cpu().empty({24}, DType::F32);
  r.load(cpu(), flat, got);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(got.data<float>()[i], weight.data<float>()[13 + i]);

  // And back: saved at TP=1, loaded as TP=2 x DP=2 pieces.
  fs::path root1 = testing::make_temp_dir("ckpt_reshard_back");
  save_checkpoint(cpu(), root1, 5, {{whole_tensor("weight", {6, 8}, DType::F32), weight}});
  CheckpointReader r1 = CheckpointReader::open(root1);
  for (int tp = 0; tp < 2; ++tp)
    for (int dp = 0; dp < 2; ++dp) {
      ShardSpec s = block_piece("weight", {6, 8}, DType::F32, 0, tp, 2, dp);
      Tensor piece = cpu().empty(Shape(s.local_shape), DType::F32);
      r1.load(cpu(), s, piece);
      EXPECT_EQ(values(piece), values(local_piece(weight, s)));
    }
}

void write_bytes_at(const fs::path& p, uint64_t offset, char byte) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(offset));
  f.put(byte);
}

TEST(CheckpointIO, CorruptionAndTruncationAreRefusedNamingFileAndTensor) {
  fs::path root = testing::make_temp_dir("ckpt_corrupt");
  save_checkpoint(cpu(), root, 7, simple_items(3.0));
  const fs::path shard = root / "iter_0000007" / "rank_00000.safetensors";
  const std::string shard_text = shard.string();
  Tensor w = cpu().empty({4, 6}, DType::F32);
  {
    // One flipped byte inside w's data.
    auto f = SafetensorsFile::open(shard);
    const uint64_t at = f->data_start() + f->entry("w").begin + 5;
    f.reset();
    std::ifstream in(shard, std::ios::binary);
    in.seekg(std::streamoff(at));
    char c = char(in.get());
    in.close();
    write_bytes_at(shard, at, char(c ^ 0x10));
    CheckpointReader r = CheckpointReader::open(root);
    testing::expect_error([&] { r.load_whole(cpu(), "w", w); }, {shard_text, "corrupt", "tensor 'w'", "CRC-32C"});
    // The other tensors are intact and still load.
    Tensor b = cpu().empty({6}, DType::BF16);
    r.load_whole(cpu(), "b", b);
    write_bytes_at(shard, at, c);
  }
  {
    // Truncated shard file.
    const auto size = fs::file_size(shard);
    fs::resize_file(shard, size - 10);
    CheckpointReader r = CheckpointReader::open(root);
    testing::expect_error([&] { r.load_whole(cpu(), "w", w); }, {shard_text, "tensor 'w'", "truncated"});
  }
  {
    fs::remove(shard);
    CheckpointReader r = CheckpointReader::open(root);
    testing::expect_error([&] { r.load_whole(cpu(), "w", w); }, {shard_text, "tensor 'w'", "cannot open"});
  }
  {
    const fs::path meta = root / "iter_0000007" / "metadata.json";
    fs::resize_file(meta, fs::file_size(meta) / 2);
    testing::expect_error([&] { CheckpointReader::open(root); }, {meta.string(), "not valid JSON"});
  }
  {
    std::ofstream(root / "latest_checkpointed_iteration.txt") << "12x\n";
    testing::expect_error([&] { CheckpointReader::open(root); }, {"latest_checkpointed_iteration.txt", "\"12x\""});
    // Too many digits for an iteration, and binary garbage: the same error, the bytes shown escaped.
    std::ofstream(root / "latest_checkpointed_iteration.txt") << "99999999999999999999999\n";
    testing::expect_error([&] { CheckpointReader::open(root); }, {"\"99999999999999999999999\"", "expected an iteration"});
    std::ofstream(root / "latest_checkpointed_iteration.txt") << "\x1b[31m\x01";
    testing::expect_error([&] { CheckpointReader::open(root); }, {"\"\\x1b[31m\\x01\"", "expected an iteration"});
    std::ofstream(root / "latest_checkpointed_iteration.txt") << "8\n";
    testing::expect_error([&] { CheckpointReader::open(root); }, {"iter_0000008 does not exist"});
  }
}

double first_value(const fs::path& root) {
  CheckpointReader r = CheckpointReader::open(root);
  Tensor w = cpu().empty({4, 6}, DType::F32);
  r.load_whole(cpu(), "w", w);
  return w.data<float>()[0];
}

TEST(CheckpointIO, AFailedSaveLeavesThePreviousCheckpointLoadable) {
  for (const char* stage : {kStageTemporaryDirectoryReady, kStageRankFileWritten, kStageMetadataWritten, kStagePublished}) {
    SCOPED_TRACE(stage);
    fs::path root = testing::make_temp_dir("ckpt_fault");
    save_checkpoint(cpu(), root, 10, simple_items(10.0));
    SaveOptions faulty;
    faulty.hooks.at_stage = [&](const std::string& s) {
      if (s == stage) throw std::runtime_error("injected fault at " + s);
    };
    EXPECT_THROW(save_checkpoint(cpu(), root, 20, simple_items(20.0), {}, faulty), std::runtime_error);
    EXPECT_EQ(CheckpointReader::open(root).iteration(), 10);
    EXPECT_EQ(first_value(root), 10.0);
    // The next save of the same iteration succeeds (and cleans up what the failed one left).
    save_checkpoint(cpu(), root, 20, simple_items(20.0));
    EXPECT_EQ(CheckpointReader::open(root).iteration(), 20);
    EXPECT_EQ(first_value(root), 20.0);
    EXPECT_FALSE(fs::exists(temporary_iteration_dir(root, 20)));
  }
}

TEST(CheckpointIO, AKilledSaveLeavesThePreviousCheckpointLoadable) {
  // A child process saves iteration 20 and is killed with SIGKILL: once at a known point (after its shard
  // file is written, before the metadata), and several times after a random delay during a large save.
  fs::path root = testing::make_temp_dir("ckpt_kill");
  save_checkpoint(cpu(), root, 10, simple_items(10.0));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    SaveOptions o;
    o.hooks.at_stage = [&](const std::string& s) {
      if (s == kStageRankFileWritten) {
        (void)!write(fds[1], "x", 1);
        pause();
      }
    };
    save_checkpoint(cpu(), root, 20, simple_items(20.0), {}, o);
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(fds[0], &c, 1), 1);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  close(fds[0]);
  close(fds[1]);
  EXPECT_TRUE(fs::exists(temporary_iteration_dir(root, 20) / "rank_00000.safetensors"));
  EXPECT_EQ(CheckpointReader::open(root).iteration(), 10);
  EXPECT_EQ(first_value(root), 10.0);

  // Random kill points in a 32 MB save: whatever the tracker names must load, with its own values.
  std::vector<SaveItem> big = simple_items(30.0);
  big.push_back({whole_tensor("big", {8 << 20}, DType::F32), make_tensor({8 << 20}, DType::F32, 1.0)});
  for (int delay_ms : {1, 5, 20, 60}) {
    pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      save_checkpoint(cpu(), root, 30 + delay_ms, big);
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    CheckpointReader r = CheckpointReader::open(root);
    const double v = first_value(root);
    EXPECT_TRUE(r.iteration() == 10 ? v == 10.0 : v == 30.0) << "iteration " << r.iteration() << " value " << v;
  }
}

// metadata.json fields found malformed by fuzz_checkpoint: errors naming the file and the field, not
// std::invalid_argument (stoul) or nlohmann's type_error escaping from the state readers.
TEST(CheckpointIO, MalformedMetadataFieldsAreNamed) {
  fs::path root = testing::make_temp_dir("ckpt_metadata");
  save_checkpoint(cpu(), root, 4, simple_items(4.0), {{"iteration", 4}, {"rng", {{"seed", 7}}}});
  const fs::path meta = iteration_dir(root, 4) / kMetadataFile;
  std::ifstream in(meta);
  const std::string good(std::istreambuf_iterator<char>(in), {});
  in.close();
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(meta, std::ios::trunc) << text;
  };
  const size_t crc = good.find("\"crc32c\": \"0x");
  ASSERT_NE(crc, std::string::npos);
  with(good.substr(crc, 22), "\"crc32c\": \"zz\"");
  testing::expect_error([&] { CheckpointReader::open(root); },
                        {meta.string(), "has crc32c \"zz\"; expected 0x and up to 8 hex digits"});
  with("\"seed\": 7", "\"seed\": \"seven\"");
  testing::expect_error([&] { preview_checkpoint(root); },
                        {meta.string(), "state.rng.seed must be a non-negative integer, got \"\\\"seven\\\"\""});
  with("\"seed\": 7", "\"seed\": 7");
  EXPECT_EQ(preview_checkpoint(root).seed, 7u);
  // Integer fields given as floats out of their type's range (the cast nlohmann would do is undefined
  // behaviour, which the fuzzer found with UBSan) or fractional are refused by name. (`with` edits the good
  // text each time.)
  const size_t bytes = good.find("\"bytes\": ");
  ASSERT_NE(bytes, std::string::npos);
  with(good.substr(bytes, good.find_first_of(",\n}", bytes) - bytes), "\"bytes\": 1.28444e+117");
  testing::expect_error([&] { CheckpointReader::open(root); },
                        {meta.string(), "piece's bytes must be an integer in [0, 18446744073709551615], got \"1.28444e+117\""});
  with("\"iteration\": 4,", "\"iteration\": 4.5,");
  testing::expect_error([&] { CheckpointReader::open(root); }, {meta.string(), "iteration must be an integer", "4.5"});
  const size_t shape = good.find("\"global_shape\": [");
  ASSERT_NE(shape, std::string::npos);
  with(good.substr(shape, good.find(']', shape) + 1 - shape), "\"global_shape\": [-1e300]");
  testing::expect_error([&] { CheckpointReader::open(root); }, {meta.string(), "global_shape[0] must be an integer"});
  with("\"seed\": 7", "\"seed\": 7");
  EXPECT_NO_THROW(CheckpointReader::open(root));
}

TEST(CheckpointIO, IntactCheckpointsAreTellableFromDamagedOnes) {
  fs::path root = testing::make_temp_dir("ckpt_intact");
  for (int64_t it : {1, 2, 3}) save_checkpoint(cpu(), root, it, simple_items(double(it)));
  EXPECT_TRUE(checkpoint_is_intact(iteration_dir(root, 3)));
  EXPECT_TRUE(checkpoint_problems(iteration_dir(root, 3)).empty());
  // Iteration 3's shard cut short, iteration 2's corrupted: the newest intact one is 1.
  const fs::path shard3 = iteration_dir(root, 3) / "rank_00000.safetensors";
  fs::resize_file(shard3, fs::file_size(shard3) - 7);
  const fs::path shard2 = iteration_dir(root, 2) / "rank_00000.safetensors";
  {
    auto f = SafetensorsFile::open(shard2);
    const uint64_t at = f->data_start() + f->entry("w").begin + 3;
    f.reset();
    std::ifstream in(shard2, std::ios::binary);
    in.seekg(std::streamoff(at));
    const char c = char(in.get());
    in.close();
    write_bytes_at(shard2, at, char(c ^ 0x10));
  }
  std::vector<std::string> problems;
  EXPECT_FALSE(checkpoint_is_intact(iteration_dir(root, 3), nullptr, &problems));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("truncated"), std::string::npos) << problems[0];
  problems = checkpoint_problems(iteration_dir(root, 2));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("tensor 'w'"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("is corrupt: CRC-32C"), std::string::npos) << problems[0];
  // Split over two "ranks" (files are dealt out by position): the one file falls to part 0.
  EXPECT_EQ(checkpoint_problems(iteration_dir(root, 2), 1, 2).size(), 0u);
  const std::optional<IntactCheckpoint> intact = newest_intact_checkpoint(root, int64_t{3});
  ASSERT_TRUE(intact.has_value());
  EXPECT_EQ(intact->iteration, 1);
  EXPECT_NE(intact_checkpoint_hint(root, int64_t{3}).find("is iter_0000001 (iteration 1): pass --load-fallback-to-intact"),
            std::string::npos);
  fs::remove_all(iteration_dir(root, 1) / kMetadataFile);
  EXPECT_FALSE(newest_intact_checkpoint(root, int64_t{3}).has_value());
  EXPECT_NE(intact_checkpoint_hint(root, int64_t{3}).find("no intact checkpoint to fall back to"), std::string::npos);
}

TEST(CheckpointIO, RetentionNeverLeavesAPartialIterationDirectory) {
  fs::path root = testing::make_temp_dir("ckpt_retention");
  SaveOptions o;
  o.keep_last = 1;
  save_checkpoint(cpu(), root, 1, simple_items(1.0), {}, o);
  // What a crash in the middle of deleting an old checkpoint leaves: the renamed directory, half deleted.
  fs::create_directories(root / ".iter_0000000.deleted.tmp");
  save_checkpoint(cpu(), root, 2, simple_items(2.0), {}, o);
  EXPECT_EQ(saved_iterations(root), (std::vector<int64_t>{2}));
  for (const auto& entry : fs::directory_iterator(root))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

TEST(CheckpointIO, KeepLastDeletesOlderCheckpoints) {
  fs::path root = testing::make_temp_dir("ckpt_keep");
  SaveOptions o;
  o.keep_last = 2;
  for (int64_t it : {1, 2, 3, 4, 5}) save_checkpoint(cpu(), root, it, simple_items(double(it)), {}, o);
  EXPECT_EQ(saved_iterations(root), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(first_value(root), 5.0);
  save_checkpoint(cpu(), root, 6, simple_items(6.0));  // keep_last 0: keeps everything
  EXPECT_EQ(saved_iterations(root), (std::vector<int64_t>{4, 5, 6}));
}

TEST(CheckpointIO, AsyncSaverWritesASnapshotAndSurfacesErrors) {
  fs::path root = testing::make_temp_dir("ckpt_async");
  std::vector<SaveItem> items = simple_items(1.0);
  AsyncSaver saver;
  const AsyncSaver::Submitted first = saver.submit(cpu(), root, 1, items, {{"k", 1}}, {});
  EXPECT_EQ(first.waited_for_iteration, -1);
  EXPECT_EQ(first.bytes, 96u + 12u + 16u);
  EXPECT_GE(first.buffer_bytes, first.bytes);
  // Training goes on and changes the weights while the save is in flight: the checkpoint has the old ones.
  items[0].data.data<float>()[0] = -5.0f;
  saver.wait();
  EXPECT_FALSE(saver.busy());
  EXPECT_EQ(first_value(root), 1.0);
  EXPECT_EQ(saver.completed_iteration(), 1);
  // Two saves in a row: the second waits for the first; the staging buffer is reused, not reallocated.
  saver.submit(cpu(), root, 2, simple_items(2.0), {}, {});
  const AsyncSaver::Submitted third = saver.submit(cpu(), root, 3, simple_items(3.0), {}, {});
  EXPECT_EQ(third.waited_for_iteration, 2);
  EXPECT_EQ(third.allocate_seconds, 0.0);
  EXPECT_EQ(third.buffer_bytes, first.buffer_bytes);
  while (!saver.finalize(/*blocking=*/false)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(saved_iterations(root), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(first_value(root), 3.0);
  // A failure in the writer thread surfaces on this thread at the next wait(), naming the iteration.
  SaveOptions faulty;
  faulty.hooks.at_stage = [](const std::string& s) {
    if (s == kStageMetadataWritten) throw Error("disk full (injected)");
  };
  saver.submit(cpu(), root, 4, simple_items(4.0), {}, faulty);
  testing::expect_error([&] { saver.wait(); }, {"asynchronous checkpoint save of iteration 4", "disk full"});
  EXPECT_EQ(CheckpointReader::open(root).iteration(), 3);
  // A larger state grows the buffer once.
  std::vector<SaveItem> bigger = simple_items(5.0);
  bigger.push_back({whole_tensor("extra", {1000}, DType::F32), make_tensor({1000}, DType::F32, 0.0)});
  EXPECT_GT(saver.submit(cpu(), root, 5, bigger, {}, {}).buffer_bytes, first.buffer_bytes);
  saver.wait();
  EXPECT_EQ(first_value(root), 5.0);
}

// Both ways of taking a snapshot refuse a piece whose data does not match it, or that does not fit its
// tensor, naming the piece and the data.
TEST(CheckpointIO, SnapshotsRefuseDataThatDoesNotMatchItsPiece) {
  SnapshotStager stager;
  const std::vector<std::pair<SaveItem, std::vector<std::string>>> bad = {
      {{whole_tensor("w", {4, 6}, DType::F32), make_tensor({4, 5}, DType::F32, 0)},
       {"piece w", "24 elements", "f32[4, 5]"}},
      {{whole_tensor("w", {4, 6}, DType::F32), make_tensor({4, 6}, DType::BF16, 0)}, {"piece w", "bf16[4, 6]"}},
      {{whole_tensor("w", {4, 6}, DType::F32), Tensor()}, {"piece w", "undefined"}},
      {{block_piece("w", {4, 6}, DType::F32, 0, 1, 2), make_tensor({2, 6}, DType::F32, 0)}, {}},  // fits: accepted
  };
  for (const auto& [item, parts] : bad) {
    std::vector<SaveItem> items = simple_items(1.0);
    items.push_back(item);
    if (parts.empty()) {
      EXPECT_EQ(snapshot(cpu(), 0, items, true).specs.size(), 4u);
      EXPECT_EQ(stager.stage(cpu(), 0, items).specs.size(), 4u);
      continue;
    }
    testing::expect_error([&] { snapshot(cpu(), 0, items, true); }, parts);
    testing::expect_error([&] { stager.stage(cpu(), 0, items); }, parts);
  }
  ShardSpec outside = whole_tensor("w", {4, 6}, DType::F32);
  outside.global_offset = {2, 0};
  const std::vector<SaveItem> misplaced = {{outside, make_tensor({4, 6}, DType::F32, 0)}};
  testing::expect_error([&] { snapshot(cpu(), 0, misplaced, true); }, {"sharded tensor w", "runs outside"});
  testing::expect_error([&] { stager.stage(cpu(), 0, misplaced); }, {"sharded tensor w", "runs outside"});
}

TEST(CheckpointIO, WritersAreSpreadOverTheDataParallelRanks) {
  // Largest first, each to the least-loaded rank: every rank ends with a similar share.
  const std::vector<uint64_t> bytes = {100, 10, 60, 50, 40, 30, 5, 5};
  const std::vector<int> w = assign_writers(bytes, 3);
  ASSERT_EQ(w.size(), bytes.size());
  std::vector<uint64_t> load(3, 0);
  for (size_t i = 0; i < bytes.size(); ++i) load[size_t(w[i])] += bytes[i];
  EXPECT_EQ(w[0], 0);  // the largest goes to rank 0
  EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), 10u);
  EXPECT_EQ(assign_writers(bytes, 1), std::vector<int>(bytes.size(), 0));
}

}  // namespace
}  // namespace megatron::checkpoint
