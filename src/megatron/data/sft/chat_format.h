// Conversations rendered as tokens with the loss mask of supervised fine-tuning, without a Jinja engine.
//
// A chat format is one of a few named layouts (--sft-tokenizer-prompt-format), each the rendering of a
// well-known chat template:
//   llama3              Llama 3 Instruct: <|begin_of_text|> once, then per message
//                       "<|start_header_id|>{role}<|end_header_id|>\n\n{content, stripped}<|eot_id|>"
//   chatml              ChatML (Qwen, many others): per message "<|im_start|>{role}\n{content}<|im_end|>\n"
//   nemotron-h-aligned  Megatron's default SFT format: "<SPECIAL_10>System\n{c}\n", "<SPECIAL_11>User\n{c}\n"
//                       "<SPECIAL_11>Assistant\n", then the answer "{c}\n" (contents stripped)
//   identity            the contents concatenated
//   default             the tokenizer's own template (tokenizer_config.json's chat_template, next to
//                       tokenizer.json), recognised by its markers as llama3 or chatml; any other template is
//                       refused (Jinja is not interpreted here: name a format instead)
// The loss mask marks the assistant's content and its end-of-turn marker (<|eot_id|>, <|im_end|>, or the
// "\n" ending a nemotron answer): what the model must learn to say and when to stop. Every other token
// (system and user turns, headers, role names) is context only.
//
// Contract:
// - Roles are "system", "user", "assistant" and "tool" (Megatron's set); any other role is an error naming it.
// - "Stripped" is Jinja's trim / Python's str.strip() restricted to ASCII whitespace.
// - Text pieces are encoded one by one and concatenated: special markers are encoded alone (each must be a
//   single token of the tokenizer, else an error names it), a message's header apart from its content. For
//   the byte-level BPE tokenizers of these families the cuts fall on pre-token boundaries (newlines and
//   special tokens), so the tokens equal those of encoding the whole rendered text.
// - Megatron's "default" trains on every token; here every format, "default" included, trains on the
//   assistant tokens only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/data/tokenizers/tokenizer.h"

namespace megatron::data {

enum class ChatFormat { Llama3, ChatML, NemotronHAligned, Identity };

struct ChatMessage {
  std::string role;
  std::string content;
};

// One rendered piece of text; `special`: a marker that must encode to a single token.
struct ChatPiece {
  std::string text;
  bool trained = false;
  bool special = false;
};

struct ConversationTokens {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // 1 where the token is an assistant target
};

// The format named by --sft-tokenizer-prompt-format. "default" reads `tokenizer_model` (tokenizer.json or its
// folder): the chat_template of tokenizer_config.json beside it, recognised by its markers.
ChatFormat resolve_chat_format(std::string_view name, const std::string& tokenizer_model);
// Which named format a Jinja chat template is, by its markers; refused (naming the formats) when neither.
ChatFormat recognise_chat_template(std::string_view chat_template, std::string_view where);
const char* chat_format_name(ChatFormat format);

// The pieces of one conversation, in order; their texts concatenated are the whole rendering.
std::vector<ChatPiece> render_conversation(ChatFormat format, const std::vector<ChatMessage>& messages);
ConversationTokens tokenize_conversation(ChatFormat format, const std::vector<ChatMessage>& messages,
                                         const Tokenizer& tokenizer);

}  // namespace megatron::data
