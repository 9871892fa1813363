// The log line must be Megatron's, character for character (the example from ../shared/MEGATRON-COMPAT.md, which
// was taken from Megatron's format strings), so existing log parsers keep working.
#include <gtest/gtest.h>

#include "megatron/train/log_line.h"

namespace megatron::train {
namespace {

TEST(LogLine, MatchesMegatronsFormat) {
  IterationLog l;
  l.timestamp = "2026-11-22 10:00:00";
  l.iteration = 100;
  l.train_iters = 1000;
  l.consumed_samples = 6400;
  l.seconds_per_iteration = 0.5123;
  l.tflops_per_gpu = 401.2;
  l.learning_rate = 3e-4;
  l.global_batch_size = 64;
  l.lm_loss = 5.123456;
  l.loss_scale = 1.0;
  l.grad_norm = 0.812;
  EXPECT_EQ(format_log_line(l),
            " [2026-11-22 10:00:00] iteration      100/    1000 | consumed samples:         6400 |"
            " elapsed time per iteration (ms): 512.3 | throughput per GPU (TFLOP/s/GPU): 401.2 |"
            " learning rate: 3.000000E-04 | global batch size:    64 | lm loss: 5.123456E+00 | loss scale: 1.0 |"
            " grad norm: 0.812 | number of skipped iterations:   0 | number of nan iterations:   0 |");
}

// --moe-per-layer-logging's values as text: one line per loss, its layers in order, the log line's number format;
// nothing without values.
TEST(LogLine, MoePerLayerLossesOneLinePerLoss) {
  const std::vector<std::pair<std::string, double>> per_layer = {
      {"moe/load_balancing_loss_layer_0", 1.25}, {"moe/load_balancing_loss_layer_1", 0.0},
      {"moe/load_balancing_loss_layer_2", 1.0625}, {"moe/z_loss_layer_0", 3e-4},
      {"moe/z_loss_layer_1", 0.0}, {"moe/z_loss_layer_2", 2.5e-4}};
  EXPECT_EQ(format_moe_per_layer(per_layer),
            "  per-layer load_balancing_loss (layers 0-2): 1.250000E+00 0.000000E+00 1.062500E+00\n"
            "  per-layer z_loss (layers 0-2): 3.000000E-04 0.000000E+00 2.500000E-04\n");
  EXPECT_EQ(format_moe_per_layer({}), "");
}

// --log-num-zeros-in-grad and --log-params-norm: Megatron's fields and formats ({:.1f}, {:.3f}), after the grad norm.
TEST(LogLine, NumZerosAndParamsNormFollowTheGradNorm) {
  IterationLog l;
  l.timestamp = "t";
  l.grad_norm = 0.5;
  l.num_zeros = 1234;
  l.params_norm = 56.78912;
  const std::string s = format_log_line(l);
  EXPECT_NE(s.find(" grad norm: 0.500 | num zeros: 1234.0 | params norm: 56.789 | number of skipped iterations:"),
            std::string::npos)
      << s;
}

TEST(LogLine, TokensPerSecondAndSkippedIterationWithoutGradNorm) {
  IterationLog l;
  l.timestamp = "t";
  l.iteration = 7;
  l.train_iters = 7;
  l.tokens_per_second_per_gpu = 123456.4;
  l.skipped_iterations = 2;
  l.nan_iterations = 1;
  std::string s = format_log_line(l);
  EXPECT_NE(s.find(" tokens per second per GPU: 123456 |"), std::string::npos) << s;
  EXPECT_EQ(s.find("grad norm"), std::string::npos) << s;
  EXPECT_NE(s.find(" number of skipped iterations:   2 | number of nan iterations:   1 |"), std::string::npos) << s;
  EXPECT_NE(s.find("iteration        7/       7 |"), std::string::npos) << s;
}

}  // namespace
}  // namespace megatron::train
