#include "megatron/core/error.h"

#include <filesystem>

#include "megatron/core/quoted_bytes.h"

namespace megatron {

Error::Error(const std::string& message) : std::runtime_error(terminal_safe(message)) {}

}  // namespace megatron

namespace megatron::detail {

void fail_check(const char* condition, const std::string& message, std::source_location where) {
  std::string file = std::filesystem::path(where.file_name()).filename().string();
  std::string text = message;
  if (condition != nullptr) text += str_cat(" [check `", condition, "` failed at ", file, ":", where.line(), "]");
  else text += str_cat(" [", file, ":", where.line(), "]");
  throw Error(text);
}

}  // namespace megatron::detail
