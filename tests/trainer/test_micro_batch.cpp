// Batches with Megatron's document flags against Megatron-core's own arrays: tests/data/reference/
// document_masks.txt holds, for six samples (EODs in the middle, first and last, back to back, only as the last
// label, none, a padded last sample) and all eight combinations of --reset-position-ids,
// --reset-attention-mask and --eod-mask-loss, what megatron-core's _get_ltor_masks_and_position_ids and
// GPTDataset.__getitem__ return (scripts/megatron_document_masks_reference.py made it). Our per-sample function
// and the trainer's micro-batches (all six samples in one batch, and each context-parallel rank's share) must
// give the same tokens, labels, loss mask, position ids and attention mask.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "megatron/trainer/micro_batch.h"

namespace megatron::trainer {
namespace {

struct Reference {
  std::string name;
  data::DocumentFlags flags;
  std::vector<int64_t> text, tokens, labels, loss_mask, position_ids;
  std::vector<std::string> masked;  // one row per query: '1' where the key is hidden
};

std::vector<int64_t> numbers(std::istringstream& line) {
  std::vector<int64_t> v;
  for (int64_t x; line >> x;) v.push_back(x);
  return v;
}

std::vector<Reference> read_references(int64_t& eod) {
  std::ifstream in(std::string(MEGATRON_TESTS_SOURCE_DIR) + "/data/reference/document_masks.txt");
  EXPECT_TRUE(in.good()) << "tests/data/reference/document_masks.txt";
  std::vector<Reference> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string key;
    l >> key;
    if (key == "#") {
      const size_t at = line.find(" eod ");
      eod = std::stoll(line.substr(at + 5));
    } else if (key == "sample") {
      Reference r;
      const size_t close = line.rfind('\'');
      r.name = line.substr(8, close - 8);
      std::istringstream f(line.substr(close + 1));
      int p, a, e;
      f >> p >> a >> e;
      r.flags = {.reset_position_ids = p != 0, .reset_attention_mask = a != 0, .eod_mask_loss = e != 0};
      out.push_back(r);
    } else if (key == "text") out.back().text = numbers(l);
    else if (key == "tokens") out.back().tokens = numbers(l);
    else if (key == "labels") out.back().labels = numbers(l);
    else if (key == "loss_mask") out.back().loss_mask = numbers(l);
    else if (key == "position_ids") out.back().position_ids = numbers(l);
    else if (key == "masked") for (std::string row; l >> row;) out.back().masked.push_back(row);
  }
  return out;
}

std::string describe(const Reference& r) {
  return str_cat(r.name, " (reset positions ", r.flags.reset_position_ids, ", reset attention mask ",
                 r.flags.reset_attention_mask, ", eod mask loss ", r.flags.eod_mask_loss, ")");
}

void expect_mask(const Reference& r, std::span<const int64_t> offsets, int64_t first = 0) {
  const int64_t s = int64_t(r.tokens.size());
  for (int64_t q = 0; q < s; ++q)
    for (int64_t k = 0; k < s; ++k)
      ASSERT_EQ(data::attends(offsets, first + q, first + k), r.masked[size_t(q)][size_t(k)] == '0')
          << "query " << q << ", key " << k;
}

TEST(DocumentMasks, EqualMegatronCoreOnEverySampleAndFlagCombination) {
  int64_t eod = -100;
  const std::vector<Reference> refs = read_references(eod);
  ASSERT_EQ(refs.size(), 6u * 8u);
  ASSERT_EQ(eod, 7);
  for (const Reference& r : refs) {
    SCOPED_TRACE(describe(r));
    const data::SampleMasks m = data::ltor_masks_and_position_ids(r.text, eod, r.flags);
    EXPECT_EQ(m.tokens, r.tokens);
    EXPECT_EQ(m.labels, r.labels);
    EXPECT_EQ(std::vector<int64_t>(m.loss_mask.begin(), m.loss_mask.end()), r.loss_mask);
    EXPECT_EQ(m.position_ids, r.position_ids);
    expect_mask(r, m.document_offsets);
  }
}

// The six samples as one micro-batch under `flags`, as a [6, S + 1] host tensor.
Tensor batch_of(const std::vector<const Reference*>& rows, CpuAllocator& host) {
  const int64_t width = int64_t(rows[0]->text.size());
  Tensor t = Tensor::empty(Shape{int64_t(rows.size()), width}, DType::I64, host);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(rows[i]->text.begin(), rows[i]->text.end(), t.data<int64_t>() + int64_t(i) * width);
  return t;
}

TEST(DocumentMasks, MicroBatchesAndContextParallelSharesEqualMegatronCore) {
  int64_t eod = 0;
  const std::vector<Reference> refs = read_references(eod);
  CpuAllocator host;
  for (size_t combo = 0; combo < 8; ++combo) {
    std::vector<const Reference*> rows;
    for (const Reference& r : refs)
      if (size_t(r.flags.reset_position_ids) * 4 + size_t(r.flags.reset_attention_mask) * 2 + r.flags.eod_mask_loss == combo)
        rows.push_back(&r);
    ASSERT_EQ(rows.size(), 6u);
    const data::DocumentFlags flags = rows[0]->flags;
    const Tensor samples = batch_of(rows, host);
    const int64_t S = samples.dim(1) - 1;
    for (int cp : {1, 2}) {
      for (int rank = 0; rank < cp; ++rank) {
        const parallel::SequenceSplit split{cp, rank, S};
        const HostMicroBatch mb = make_host_micro_batch(samples, eod, flags, split, host);
        const int64_t s = split.local_seq();
        double counted = 0;
        for (size_t i = 0; i < rows.size(); ++i) {
          const Reference& r = *rows[i];
          SCOPED_TRACE(str_cat(describe(r), ", CP ", cp, " rank ", rank));
          for (int64_t j = 0; j < s; ++j) {
            const size_t g = size_t(split.global_position(j)), at = i * size_t(s) + size_t(j);
            EXPECT_EQ(mb.tokens.data<int64_t>()[at], r.tokens[g]);
            EXPECT_EQ(mb.labels.data<int64_t>()[at], r.labels[g]);
            EXPECT_EQ(mb.loss_mask.data<float>()[at], float(r.loss_mask[g]));
            if (flags.reset_position_ids) {
              EXPECT_EQ(mb.position_ids.data<int64_t>()[at], r.position_ids[g]);
            }
            counted += double(r.loss_mask[g]);
          }
          EXPECT_EQ(mb.position_ids.defined(), flags.reset_position_ids);
          ASSERT_EQ(mb.cu_seqlens.defined(), flags.reset_attention_mask);
          if (flags.reset_attention_mask) {
            const std::span<const int64_t> offsets(mb.cu_seqlens.data<int64_t>(), size_t(mb.cu_seqlens.numel()));
            expect_mask(r, offsets, int64_t(i) * S);
          }
        }
        EXPECT_EQ(mb.loss_tokens, counted);
        double row_counted = 0;
        for (const Reference* r : rows)
          for (int64_t x : r->loss_mask) row_counted += double(x);
        EXPECT_EQ(mb.row_loss_tokens, row_counted);
      }
    }
  }
}

TEST(DocumentMasks, RefusesSamplesOfTheWrongWidth) {
  CpuAllocator host;
  Tensor samples = Tensor::empty(Shape{2, 9}, DType::I64, host);
  testing::expect_error([&] { make_host_micro_batch(samples, 0, {}, {1, 0, 16}, host); },
                        {"make_host_micro_batch", "i64[b, 17]"});
}

}  // namespace
}  // namespace megatron::trainer
