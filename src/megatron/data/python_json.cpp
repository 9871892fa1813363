#include "megatron/data/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace megatron::data {
namespace {

void append_escaped(std::string& out, const std::string& s) {
  out += '"';
  auto hex4 = [&](unsigned v) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\u%04x", v);
    out += buf;
  };
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) hex4(c);
          else out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // Decode one UTF-8 sequence; escape the code point (surrogate pair above the BMP) like ensure_ascii.
    int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    uint32_t cp = extra == 3 ? c & 0x07 : extra == 2 ? c & 0x0f : extra == 1 ? c & 0x1f : c;
    if (extra == 0 || i + extra >= s.size()) {
      hex4(c);  // not valid UTF-8: escape the byte (Python would hold a surrogate-escaped code point)
      ++i;
      continue;
    }
    for (int k = 1; k <= extra; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    i += extra + 1;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      hex4(0xd800 + (cp >> 10));
      hex4(0xdc00 + (cp & 0x3ff));
    } else {
      hex4(cp);
    }
  }
  out += '"';
}

void newline(std::string& out, int indent, int depth) {
  out += '\n';
  out.append(static_cast<size_t>(indent * depth), ' ');
}

}  // namespace

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";  // json.dumps spelling
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, result.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  auto e_at = sci.find('e');
  std::string digits = sci.substr(0, e_at);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  int exponent = std::stoi(sci.substr(e_at + 1));
  int decpt = exponent + 1;
  int ndigits = static_cast<int>(digits.size());
  std::string body;
  if (decpt <= -4 || decpt > 16) {
    body = digits.substr(0, 1);
    if (ndigits > 1) body += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    body += exp_buf;
  } else if (decpt <= 0) {
    body = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (decpt >= ndigits) {
    body = digits + std::string(static_cast<size_t>(decpt - ndigits), '0') + ".0";
  } else {
    body = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
  }
  return sign + body;
}

std::string PyJson::dumps(int indent) const {
  std::string out;
  render(out, indent, 0);
  return out;
}

void PyJson::render(std::string& out, int indent, int depth) const {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::nullptr_t>) out += "null";
        else if constexpr (std::is_same_v<T, bool>) out += v ? "true" : "false";
        else if constexpr (std::is_same_v<T, int64_t>) out += std::to_string(v);
        else if constexpr (std::is_same_v<T, double>) out += python_float_repr(v);
        else if constexpr (std::is_same_v<T, std::string>) append_escaped(out, v);
        else if constexpr (std::is_same_v<T, Array>) {
          if (v.empty()) { out += "[]"; return; }
          out += '[';
          for (size_t i = 0; i < v.size(); ++i) {
            if (i > 0) out += ',';
            newline(out, indent, depth + 1);
            v[i].render(out, indent, depth + 1);
          }
          newline(out, indent, depth);
          out += ']';
        } else {
          if (v.empty()) { out += "{}"; return; }
          out += '{';
          for (size_t i = 0; i < v.size(); ++i) {
            if (i > 0) out += ',';
            newline(out, indent, depth + 1);
            append_escaped(out, v[i].first);
            out += ": ";
            v[i].second.render(out, indent, depth + 1);
          }
          newline(out, indent, depth);
          out += '}';
        }
      },
      value_);
}

}  // namespace megatron::data
