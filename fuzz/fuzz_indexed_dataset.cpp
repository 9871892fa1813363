// Fuzz target: Megatron's indexed dataset, <prefix>.idx (header and arrays) with its <prefix>.bin.
// Input: idx bytes, kPartSeparator, bin bytes. A dataset that opens is read in full (every sequence, both
// widths where the dtype allows) and merged into a new dataset, which must read back the same tokens.
#include <cstdlib>

#include "fuzz_support.h"
#include "megatron/data/indexed_dataset.h"

using namespace megatron;

namespace {

void read_everything(const data::IndexedDatasetReader& reader) {
  for (int64_t s = 0; s < reader.num_sequences(); ++s) {
    (void)reader.get_bytes(s);
    const data::TokenDType d = reader.dtype();
    if (d == data::TokenDType::F32 || d == data::TokenDType::F64) continue;  // not integer tokens
    const std::vector<int64_t> tokens = reader.get(s);
    if (tokens.size() != static_cast<size_t>(reader.sequence_lengths()[s])) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 2);
  const std::string prefix = (fuzz::scratch_dir() / "in").string();
  fuzz::write_file(data::idx_path(prefix), parts[0]);
  fuzz::write_file(data::bin_path(prefix), parts[1]);
  fuzz::expect_clean_rejection([&] {
    data::IndexedDatasetReader reader(prefix);
    read_everything(reader);
    const std::string merged = (fuzz::scratch_dir() / "merged").string();
    data::merge_indexed_datasets({prefix, prefix}, merged);
    data::IndexedDatasetReader again(merged);
    if (again.num_sequences() != 2 * reader.num_sequences() || again.num_documents() != 2 * reader.num_documents())
      std::abort();
    for (int64_t s = 0; s < reader.num_sequences(); ++s) {
      const auto a = reader.get_bytes(s), b = again.get_bytes(s + reader.num_sequences());
      if (a.size() != b.size() || !std::equal(a.begin(), a.end(), b.begin())) std::abort();
    }
  });
  return 0;
}
