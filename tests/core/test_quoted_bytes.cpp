// Outside text in messages: quoted_bytes() shows it as a C string, and every megatron::Error message is made
// terminal-safe, so no raw control byte from a file or a library's error text reaches the terminal.
#include <gtest/gtest.h>

#include <string>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron {
namespace {

TEST(QuotedBytes, PrintableTextStaysControlBytesAndIllFormedUtf8AreEscaped) {
  EXPECT_EQ(quoted_bytes("abc"), "\"abc\"");
  EXPECT_EQ(quoted_bytes("Caf\xc3\xa9 \xe4\xbd\xa0"), "\"Caf\xc3\xa9 \xe4\xbd\xa0\"");  // UTF-8 kept
  EXPECT_EQ(quoted_bytes(std::string("\x1b[2J\0\x7f", 6)), R"("\x1b[2J\x00\x7f")");
  EXPECT_EQ(quoted_bytes("a\"b\\c\n\t\r"), R"("a\"b\\c\n\t\r")");
  EXPECT_EQ(quoted_bytes("\xc3(\xff\xed\xa0\x80"), R"("\xc3(\xff\xed\xa0\x80")");  // bad lead, surrogate
  EXPECT_EQ(quoted_bytes("\xc2\x85x"), R"("\xc2\x85x")");  // a C1 control (U+0085) is not printable
  EXPECT_EQ(quoted_bytes("0123456789", 4), "\"0123\"... (10 bytes)");
}

TEST(QuotedBytes, EveryErrorMessageIsTerminalSafe) {
  EXPECT_EQ(terminal_safe("line 1\n\tline 2 \x1b[31mred\x07"), "line 1\n\tline 2 \\x1b[31mred\\x07");
  try {
    MEGATRON_FAIL("a library said: last read: '\x7f\x01'");
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("last read: '\\x7f\\x01'"), std::string::npos) << message;
  }
  EXPECT_STREQ(Error("plain\nnext").what(), "plain\nnext");
}

}  // namespace
}  // namespace megatron
