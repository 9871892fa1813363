// The small tools' command lines (generate, convert_checkpoint): each flag once, typed values in range, and
// errors that name the flag and the text given.
#include <gtest/gtest.h>

#include <limits>

#include "harness.h"
#include "megatron/train/tool_flags.h"

namespace megatron::train {
namespace {

const std::vector<ToolFlag> kKnown = {{"--load"}, {"--top-k"}, {"--top-p"}, {"--device"}, {"--greedy", false}};

ToolFlags parse(std::vector<std::string> args) { return ToolFlags(args, kKnown, "usage: tool ..."); }

TEST(ToolFlags, ReadsValuesSwitchesAndDefaults) {
  const ToolFlags f = parse({"--load", "ckpt", "--greedy", "--top-k", "40", "--top-p", "0.9"});
  EXPECT_EQ(f.text("--load"), "ckpt");
  EXPECT_TRUE(f.has("--greedy"));
  EXPECT_EQ(f.integer("--top-k", 0, 0, 100), 40);
  EXPECT_DOUBLE_EQ(f.number("--top-p", 1.0, 0.0, 1.0), 0.9);
  EXPECT_EQ(f.choice("--device", "auto", {"auto", "cpu"}), "auto");
  EXPECT_FALSE(f.help());
  EXPECT_TRUE(parse({"-h"}).help());
}

TEST(ToolFlags, BadValuesNameTheFlagAndTheText) {
  testing::expect_error([] { parse({"--lod", "x"}); }, {"unknown flag \"--lod\"; did you mean --load?", "usage: tool"});
  testing::expect_error([] { parse({"--load"}); }, {"--load needs a value"});
  testing::expect_error([] { parse({"--load", "a", "--load", "b"}); }, {"--load is given twice"});
  testing::expect_error([] { parse({"--top-k", "x4"}).integer("--top-k", 0, 0, 100); },
                        {"--top-k \"x4\" is not an integer"});
  testing::expect_error([] { parse({"--top-k", "99999999999999999999"}).integer("--top-k", 0, 0, 100); },
                        {"is not an integer"});
  testing::expect_error([] { parse({"--top-k", "-1"}).integer("--top-k", 0, 0, 100); }, {"--top-k -1 is outside [0, 100]"});
  testing::expect_error([] { parse({"--top-p", "nan"}).number("--top-p", 1, 0, 1); }, {"\"nan\" is not a finite number"});
  testing::expect_error([] { parse({"--top-p", "2"}).number("--top-p", 1, 0, 1); }, {"--top-p 2 is outside [0, 1]"});
  testing::expect_error([] { parse({"--device", "tpu"}).choice("--device", "auto", {"auto", "cpu"}); },
                        {"--device \"tpu\" is not one of {auto, cpu}"});
  testing::expect_error([] { parse({}).require("--load"); }, {"--load is required"});
}

TEST(ToolFlags, IntegerListsNameTheWord) {
  EXPECT_EQ(integer_list("--prompt-ids", " 1 2\t3 ", 0, 10), (std::vector<int64_t>{1, 2, 3}));
  testing::expect_error([] { integer_list("--prompt-ids", "1 2 x3", 0, 10); },
                        {"--prompt-ids: word 3 (\"x3\") is not an integer"});
  testing::expect_error([] { integer_list("--prompt-ids", "1 4294967296", 0, std::numeric_limits<int32_t>::max()); },
                        {"4294967296 (word 2) is outside [0, 2147483647]"});
}

}  // namespace
}  // namespace megatron::train
