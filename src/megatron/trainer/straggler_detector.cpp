#include "megatron/trainer/straggler_detector.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <numeric>

namespace megatron::trainer {
namespace {

constexpr size_t kHostChars = 64;  // a host name's first characters, gathered as numbers
constexpr size_t kFields = 5 + kHostChars;

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

// Every rank's row of `mine` (`width` values), gathered as a sum of rows that are zero except on their rank.
std::vector<double> gather_rows(comm::Communicator& world, const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * size_t(world.size()), 0.0);
  std::copy(mine.begin(), mine.end(), all.begin() + std::ptrdiff_t(mine.size() * size_t(world.rank())));
  world.all_reduce_host(all, comm::ReduceOp::Sum);
  return all;
}

std::string now_timestamp() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string fixed2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

// Four significant digits: a small model's TFLOP/s per rank are not all 0.00.
std::string digits4(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

}  // namespace

std::string describe(const RankPosition& p) {
  return str_cat("rank ", p.rank, " (tp ", p.tp, ", pp ", p.pp, ", dp ", p.dp, ", cp ", p.cp, ", host ", p.host, ")");
}

StragglerDetector::StragglerDetector(const parallel::ParallelContext& parallel, int minmax_count)
    : world_(*parallel.world().comm), minmax_count_(std::max(minmax_count, 1)) {
  std::vector<double> mine(kFields, 0.0);
  mine[0] = parallel.tp().rank(), mine[1] = parallel.pp().rank(), mine[2] = parallel.dp().rank();
  mine[3] = parallel.cp().rank(), mine[4] = 1.0;
  const std::string host = host_name();
  for (size_t i = 0; i < host.size() && i < kHostChars; ++i) mine[5 + i] = double(static_cast<unsigned char>(host[i]));
  const std::vector<double> all = gather_rows(world_, mine);
  for (int r = 0; r < world_.size(); ++r) {
    const double* row = all.data() + size_t(r) * kFields;
    RankPosition p{r, int(row[0]), int(row[1]), int(row[2]), int(row[3]), ""};
    for (size_t i = 0; i < kHostChars && row[5 + i] != 0.0; ++i) p.host.push_back(char(int(row[5 + i])));
    positions_.push_back(p);
  }
}

StragglerReport StragglerDetector::report(double data_seconds, double compute_seconds, double iterations,
                                          double tflop_per_rank, int64_t last_iteration) {
  const double per = 1.0 / std::max(iterations, 1.0);
  // Seconds per iteration by rank: own work (data + compute) and data alone.
  const std::vector<double> rows = gather_rows(world_, {(data_seconds + compute_seconds) * per, data_seconds * per});
  const int n = world_.size();
  std::vector<double> times(static_cast<size_t>(n)), data(static_cast<size_t>(n)), tflops(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    times[size_t(r)] = rows[2 * size_t(r)], data[size_t(r)] = rows[2 * size_t(r) + 1];
    tflops[size_t(r)] = times[size_t(r)] > 0 ? tflop_per_rank / times[size_t(r)] : 0.0;
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tflops[size_t(a)] < tflops[size_t(b)]; });
  StragglerReport out;
  out.slowest_rank = order.front(), out.fastest_rank = order.back();
  out.slowest_tflops = tflops[size_t(out.slowest_rank)], out.fastest_tflops = tflops[size_t(out.fastest_rank)];
  if (world_.rank() != 0) return out;
  // "12.34ms/3": the smallest or largest value with its rank.
  auto ms_with_rank = [](const std::vector<double>& v, bool largest) {
    const auto it = largest ? std::max_element(v.begin(), v.end()) : std::min_element(v.begin(), v.end());
    return str_cat(fixed2(1e3 * *it), "ms/", it - v.begin());
  };
  out.text = str_cat(" [", now_timestamp(), "] straggler report at iteration ", last_iteration,
                     " | MnRtt/Rnk: ", ms_with_rank(times, false), " | MxRtt/Rnk: ", ms_with_rank(times, true),
                     " | MnDRtt/Rnk: ", ms_with_rank(data, false), " | MxDRtt/Rnk: ", ms_with_rank(data, true),
                     " | MnEtpt/Rnk: ", fixed2(out.slowest_tflops), "TF/", out.slowest_rank,
                     " | MxEtpt/Rnk: ", fixed2(out.fastest_tflops), "TF/", out.fastest_rank, "\n");
  const int count = std::min(minmax_count_, n);
  auto line = [&](int r) {
    const double relative = out.fastest_tflops > 0 ? 100.0 * tflops[size_t(r)] / out.fastest_tflops : 0.0;
    return str_cat("    ", describe(positions_[size_t(r)]), ": ", digits4(tflops[size_t(r)]), " TFLOP/s, ",
                   fixed2(relative), "% of the fastest, ", fixed2(1e3 * times[size_t(r)]), " ms of own work per iteration\n");
  };
  out.text += str_cat("  slowest ", count, " rank(s) (own work: data, forward, backward):\n");
  for (int i = 0; i < count; ++i) out.text += line(order[size_t(i)]);
  out.text += str_cat("  fastest ", count, " rank(s):\n");
  for (int i = 0; i < count; ++i) out.text += line(order[size_t(n - 1 - i)]);
  return out;
}

}  // namespace megatron::trainer
