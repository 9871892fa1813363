// Temporary directories of the tests, all under one root per test process:
//   <TMPDIR or /tmp>/megatron_tests/<program>_<pid>/<tag>/
// The root is removed when the process that made it exits normally (a forked child that exits does not
// remove its parent's root). Roots left by processes that died (a crash, a kill) are removed by the next
// test process that makes its root, once their pid no longer runs. So a test run leaves nothing behind,
// and a directory a failed test wants to show survives until the process ends.
#pragma once

#include <filesystem>
#include <string>

namespace megatron::testing {

// This process's root (created on first use).
std::filesystem::path temp_root();
// A fresh, empty directory temp_root()/<tag>.
std::filesystem::path make_temp_dir(const std::string& tag);

}  // namespace megatron::testing
