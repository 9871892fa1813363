// Errors are for people: every failed check throws megatron::Error with a message that names what was
// wrong (the op, the shapes, the value and the constraint) and where the check sits in the source.
#pragma once

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>

namespace megatron {

class Error : public std::runtime_error {
 public:
  // The message is stored terminal_safe (core/quoted_bytes.h): bytes of outside text that reached it
  // unescaped -- a library's error text, a file's garbage -- are shown as \xNN, never sent to the terminal raw.
  explicit Error(const std::string& message);
};

// Concatenates anything that has operator<< into one string.
template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

namespace detail {
[[noreturn]] void fail_check(const char* condition, const std::string& message, std::source_location where);
}  // namespace detail

}  // namespace megatron

// MEGATRON_CHECK(cond, message parts...): throws megatron::Error("<message> [check `cond` failed at file:line]").
#define MEGATRON_CHECK(cond, ...)                                                                        \
  do {                                                                                                   \
    if (!(cond)) [[unlikely]]                                                                            \
      ::megatron::detail::fail_check(#cond, ::megatron::str_cat(__VA_ARGS__), std::source_location::current()); \
  } while (0)

#define MEGATRON_FAIL(...) \
  ::megatron::detail::fail_check(nullptr, ::megatron::str_cat(__VA_ARGS__), std::source_location::current())
