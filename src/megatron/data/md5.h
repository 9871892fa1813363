// MD5 (RFC 1321) of a byte string, as a 32-character lowercase hex digest — what Python's
// hashlib.md5(text.encode("utf-8")).hexdigest() returns. Used only to name index caches the way Megatron
// does; not for security.
#pragma once

#include <string>
#include <string_view>

namespace megatron::data {

std::string md5_hex(std::string_view bytes);

}  // namespace megatron::data
