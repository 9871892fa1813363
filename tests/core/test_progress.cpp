// The progress line (core/progress.h): tqdm's layout with and without a known total, its time format, and
// when it is drawn: never into a file unless MEGATRON_PROGRESS=1 asks, then a final line at the end.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "megatron/core/progress.h"

namespace megatron {
namespace {

TEST(Progress, TqdmsLayout) {
  EXPECT_EQ(format_progress("building the sample index", 4500, 10000, "samples", 12.0),
            "building the sample index:  45%|#########           | 4500/10000 samples [00:12<00:14, 375.00 samples/s]");
  EXPECT_EQ(format_progress("loading", 10, 10, "tensors", 2.0, 4), "loading: 100%|####| 10/10 tensors [00:02<00:00, 5.00 tensors/s]");
  EXPECT_EQ(format_progress("reading", 0, 100, "MB", 0.0, 4), "reading:   0%|    | 0/100 MB [00:00<?, ? MB/s]");
  EXPECT_EQ(format_progress("indexing", 7200, 0, "docs", 3725.0), "indexing: 7200 docs [1:02:05, 1.93 docs/s]");
}

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(char(c));
  return s;
}

TEST(Progress, QuietInAFileUnlessAsked) {
  unsetenv("MEGATRON_PROGRESS");
  std::FILE* quiet = std::tmpfile();
  {
    Progress p("reading", 3, "files", quiet);
    EXPECT_FALSE(p.active());
    p.advance(3);
  }
  EXPECT_EQ(contents(quiet), "");
  std::fclose(quiet);

  setenv("MEGATRON_PROGRESS", "1", 1);
  std::FILE* asked = std::tmpfile();
  {
    Progress p("reading", 3, "files", asked);
    EXPECT_TRUE(p.active());
    p.advance(2);
    p.advance(1);
  }
  const std::string text = contents(asked);
  EXPECT_NE(text.find("reading: 100%|####################| 3/3 files ["), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\r'), std::string::npos) << "no carriage returns in a log";
  std::fclose(asked);
  unsetenv("MEGATRON_PROGRESS");
}

}  // namespace
}  // namespace megatron
