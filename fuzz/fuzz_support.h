// What every fuzz target shares (fuzz/README in docs/robustness.md).
//
// A target feeds one input to a parser of outside bytes the way the tools do. The parsers read files, so the
// input (or each of its parts) is written to a file in a scratch directory first. The contract under test:
// bad input ends in a megatron::Error whose message a person can read (no raw control bytes: outside text
// is shown through megatron::quoted_bytes), never in a crash, an undefined operation (the build runs AddressSanitizer
// and UndefinedBehaviorSanitizer), another exception type, a hang or an unbounded allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::fuzz {

// Separates the parts of an input that stands for several files ("idx bytes" SEPARATOR "bin bytes").
inline constexpr std::string_view kPartSeparator = "\n--megatron-fuzz-part--\n";

// The input as text.
std::string_view as_text(const uint8_t* data, size_t size);
// The first `count` parts of the input (missing ones are empty; the last takes the rest).
std::vector<std::string_view> split_parts(std::string_view input, size_t count);

// This process's scratch directory (under /dev/shm when it exists: the targets write a file per input),
// created on first use and removed when the process exits.
const std::filesystem::path& scratch_dir();
// Writes `bytes` to `path`, replacing it; creates the parent directories.
void write_file(const std::filesystem::path& path, std::string_view bytes);

// Runs `parse`. A megatron::Error is what bad input must give: its message is checked (no raw control bytes
// other than '\n' and '\t') and the run goes on. Any other exception escapes and ends the run as a finding.
template <class Fn>
void expect_clean_rejection(Fn&& parse);

// The check expect_clean_rejection applies to a message; aborts (a finding) when it fails.
void check_message(const char* what);

}  // namespace megatron::fuzz

#include "megatron/core/error.h"

template <class Fn>
void megatron::fuzz::expect_clean_rejection(Fn&& parse) {
  try {
    parse();
  } catch (const megatron::Error& e) {
    check_message(e.what());
  }
}
