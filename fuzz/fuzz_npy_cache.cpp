// Fuzz target: .npy files and GPTDataset's index cache (document_index, sample_index, shuffle_index).
// Input: three .npy files separated by kPartSeparator. Each is parsed on its own (and widened when it holds
// integers); then the three are put in place as the cache of a small dataset, which must either refuse them
// or serve every sample from within its sequences.
#include <cstdlib>

#include "fuzz_support.h"
#include "megatron/data/gpt_dataset.h"
#include "megatron/data/npy_file.h"
#include "small_sequences.h"

using namespace megatron;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 3);
  const auto cache = fuzz::scratch_dir() / "cache";
  for (size_t k = 0; k < 3; ++k) {
    const auto path = fuzz::scratch_dir() / ("part" + std::to_string(k) + ".npy");
    fuzz::write_file(path, parts[k]);
    fuzz::expect_clean_rejection([&] {
      const data::NpyArray array = data::load_npy(path);
      if (array.descr.size() == 3 && array.descr[1] != 'f') (void)array.to_int64(path);
    });
  }
  const fuzz::SmallSequences sequences;
  const data::SequenceRange all{0, fuzz::SmallSequences::kCount};
  const data::GPTDatasetConfig config = fuzz::small_dataset_config(cache.string(), /*may_build=*/false);
  // The cache's file names hold the md5 of the dataset's description: learned once from a dataset built here.
  static const std::string hash =
      data::GPTDataset(sequences, "fuzz", all, fuzz::kSmallDatasetSamples, data::Split::train,
                       fuzz::small_dataset_config((fuzz::scratch_dir() / "names").string(), /*may_build=*/true))
          .unique_description_hash();
  const char* affixes[] = {"document_index.npy", "sample_index.npy", "shuffle_index.npy"};
  for (size_t k = 0; k < 3; ++k) fuzz::write_file(cache / (hash + "-GPTDataset-train-" + affixes[k]), parts[k]);
  fuzz::write_file(cache / (hash + "-GPTDataset-train-description.txt"), "");
  fuzz::expect_clean_rejection([&] {
    const data::GPTDataset dataset(sequences, "fuzz", all, fuzz::kSmallDatasetSamples, data::Split::train, config);
    std::vector<int64_t> tokens(static_cast<size_t>(dataset.sample_tokens()));
    for (int64_t i = 0; i < dataset.size(); ++i) dataset.sample(i, tokens);
  });
  return 0;
}
