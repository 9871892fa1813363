// SentencePieceTokenizer: a sentencepiece .model through libsentencepiece (EncodeAsIds / DecodeIds), as
// Megatron's GPTSentencePieceTokenizer: no extra tokens, eod = eos, bos/eos/pad from the model.
// (Megatron's older _SentencePieceTokenizer also appends <CLS>/<SEP>/<EOD>/<MASK> ids that are not in the
// model; that variant is not reproduced.)
#pragma once

#include <memory>
#include <string>

#include "megatron/data/tokenizers/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace megatron::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_file);
  ~SentencePieceTokenizer() override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  int32_t bos() const override;
  int32_t eos() const override;
  int32_t pad() const override;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace megatron::data
