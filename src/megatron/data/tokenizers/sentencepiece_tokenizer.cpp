#include "megatron/data/tokenizers/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/data/tokenizers/families.h"
#include "megatron/data/tokenizers/sentencepiece_model_check.h"
#include "megatron/data/utf8.h"

namespace megatron::data {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  std::error_code error;  // a directory opens as a stream and reads as empty: named here, not as an empty model
  MEGATRON_CHECK(std::filesystem::is_regular_file(model_file, error), "SentencePieceTokenizer: ", model_file,
                 std::filesystem::exists(model_file, error) ? " is not a regular file" : ": no such file");
  std::ifstream in(model_file, std::ios::binary);
  MEGATRON_CHECK(in.good(), "SentencePieceTokenizer: cannot open ", model_file);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  MEGATRON_CHECK(!in.bad(), "SentencePieceTokenizer: cannot read ", model_file);
  const std::string model = std::move(bytes).str();
  check_sentencepiece_pieces(model, model_file);  // what the library would end the process on
  const auto status = sp_->LoadFromSerializedProto(model);
  MEGATRON_CHECK(status.ok(), "SentencePieceTokenizer: cannot load ", model_file, ": ", status.ToString());
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(sanitize_utf8(text), &ids);
  MEGATRON_CHECK(status.ok(), "SentencePieceTokenizer::encode: ", status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids)
    MEGATRON_CHECK(id >= 0 && id < sp_->GetPieceSize(), "SentencePieceTokenizer::decode: id ", id, " outside [0, ",
                   sp_->GetPieceSize(), ")");
  std::string out;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  MEGATRON_CHECK(status.ok(), "SentencePieceTokenizer::decode: ", status.ToString());
  return out;
}

int64_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t SentencePieceTokenizer::bos() const { return sp_->bos_id(); }
int32_t SentencePieceTokenizer::eos() const { return sp_->eos_id(); }
int32_t SentencePieceTokenizer::pad() const { return sp_->pad_id(); }

namespace detail {

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerConfig& c) {
  require_flag(c, c.tokenizer_model, "--tokenizer-model (a sentencepiece .model)");
  return std::make_unique<SentencePieceTokenizer>(c.tokenizer_model);
}

}  // namespace detail
}  // namespace megatron::data
