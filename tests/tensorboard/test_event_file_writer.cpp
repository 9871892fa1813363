// TensorBoard event files (tensorboard/): the TFRecord framing with its masked CRC-32C against the definition,
// and an event file written by EventFileWriter read back by the `tensorboard` Python package's
// EventAccumulator (the reader `tensorboard --logdir` uses): every tag, step and value, zero and negative
// values included, the file named as TensorBoard expects; a second writer in the same directory and second
// gets its own file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "harness.h"
#include "megatron/core/crc32c.h"
#include "megatron/tensorboard/event_file_writer.h"
#include "megatron/tensorboard/tfrecord.h"

namespace megatron::tensorboard {
namespace {

namespace fs = std::filesystem;

uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | uint8_t(s[at + size_t(i)]);
  return v;
}

// TensorFlow's definition: rotate right by 15, add 0xa282ead8.
uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

TEST(TfRecord, FramingAndMaskedCrcs) {
  const std::string check = "123456789";
  EXPECT_EQ(masked_crc32c(check.data(), check.size()), masked(0xE3069283u));
  const std::string data = "an event's bytes";
  const std::string r = tfrecord(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | uint8_t(r[size_t(i)]);
  EXPECT_EQ(length, data.size());
  EXPECT_EQ(le32(r, 8), masked(crc32c(r.data(), 8)));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(le32(r, 12 + data.size()), masked(crc32c(data.data(), data.size())));
}

TEST(EventFileWriter, TensorBoardReadsEveryScalarBack) {
  const fs::path dir = testing::make_temp_dir("tensorboard_writer");
  fs::path first, second;
  {
    EventFileWriter w(dir / "run", /*queue_size=*/2);
    first = w.path();
    w.add_scalar("lm loss", 7.25, 1);
    w.add_scalar("lm loss", 0.0, 2);            // a zero is written too
    w.add_scalar("learning-rate", -1.5e-4, 2);  // and a negative value
    w.add_scalar("lm loss vs samples", 3.0, 1234567890123);
    w.add_scalar("moe/z_loss_layer_0", 0.125, 3);
    EventFileWriter other(dir / "run", 1000);  // the same second and process: another file
    second = other.path();
    other.add_scalar("world-size", 2.0, 1);
  }
  EXPECT_NE(first, second);
  EXPECT_NE(first.filename().string().find("events.out.tfevents."), std::string::npos);
  testing::run_python(dir, R"(
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
got = {}
for path in sys.argv[1:]:
    ea = EventAccumulator(path)
    ea.Reload()
    for tag in ea.Tags()["scalars"]:
        got.setdefault(tag, []).extend((e.step, e.value) for e in ea.Scalars(tag))
want = {"lm loss": [(1, 7.25), (2, 0.0)], "learning-rate": [(2, -1.5e-4)],
        "lm loss vs samples": [(1234567890123, 3.0)], "moe/z_loss_layer_0": [(3, 0.125)], "world-size": [(1, 2.0)]}
assert set(got) == set(want), (sorted(got), sorted(want))
for tag, events in want.items():
    assert len(got[tag]) == len(events), (tag, got[tag])
    for (step, value), (s, v) in zip(events, got[tag]):
        assert s == step and abs(v - value) <= 1e-7 * abs(value), (tag, s, v, step, value)
print("tensorboard read", sum(len(v) for v in got.values()), "scalars")
)", first.string() + " " + second.string());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megatron::tensorboard
