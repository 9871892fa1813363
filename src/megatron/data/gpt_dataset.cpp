#include "megatron/data/gpt_dataset.h"

#include <fstream>
#include <sstream>
#include <unistd.h>

#include "megatron/core/error.h"
#include "megatron/data/md5.h"
#include "megatron/data/npy_file.h"

namespace megatron::data {
namespace {

constexpr const char* kClassName = "GPTDataset";

template <class T>
void save_array_as(const std::filesystem::path& path, std::span<const int64_t> values, std::span<const int64_t> shape) {
  std::vector<T> narrow(values.begin(), values.end());
  save_npy(path, std::span<const T>(narrow), shape);
}

// Writes via a temporary name in the same directory, then renames.
template <class Write>
void write_atomically(const std::filesystem::path& path, Write&& write) {
  std::filesystem::path temp = path.string() + ".tmp" + std::to_string(::getpid());
  try {
    write(temp);
    std::filesystem::rename(temp, path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw;
  }
}

}  // namespace

PyJson split_matrix_json(const SplitBookends& bookends) {
  PyJson::Array rows;
  for (int i = 0; i < kNumSplits; ++i) {
    if (!bookends[i]) {
      rows.emplace_back(nullptr);
      continue;
    }
    PyJson::Array row;
    if (i == 0) row.emplace_back(int64_t{0});  // Python's expansion starts with the int 0
    else row.emplace_back(bookends[i]->first);
    row.emplace_back(bookends[i]->second);
    rows.emplace_back(std::move(row));
  }
  return rows;
}

GPTDataset::GPTDataset(const TokenSequences& source, std::string dataset_path, SequenceRange sequences,
                       std::optional<int64_t> num_samples, Split split, GPTDatasetConfig config)
    : source_(&source),
      dataset_path_(std::move(dataset_path)),
      sequences_(sequences),
      num_samples_(num_samples),
      split_(split),
      config_(std::move(config)) {
  if (!config_.mock) {
    unique_identifiers_ = PyJson::Object{
        {"class", kClassName},
        {"dataset_path", dataset_path_},
        {"num_samples", num_samples_ ? PyJson(*num_samples_) : PyJson(nullptr)},
        {"index_split", split_name(split_)},
        {"random_seed", static_cast<int64_t>(config_.random_seed)},
        {"sequence_length", config_.sequence_length},
        {"split", config_.split},
        {"split_matrix", split_matrix_json(split_bookends(config_.split))},
        {"tokenizer", config_.tokenizer},
    };
    unique_description_ = unique_identifiers_.dumps(4);
    unique_description_hash_ = md5_hex(unique_description_);
    cache_directory_ = config_.path_to_cache ? std::filesystem::path(*config_.path_to_cache)
                                             : std::filesystem::path(dataset_path_) / "cache" / "GPTDataset_indices";
  }
  if (!cache_directory_.empty() && load_cache()) return;
  MEGATRON_CHECK(cache_directory_.empty() || config_.may_build_cache, dataset_path_, ": ", split_name(split_),
                 " index cache missing in ", cache_directory_.string(), " (", cache_file("description.txt").filename().string(),
                 ") and this process does not build it; build it on the first rank first");
  indices_ = build();
  built_anew_ = true;
  if (!cache_directory_.empty()) save_cache();
}

GptIndexRequest GPTDataset::index_request() const {
  GptIndexRequest request;
  request.sequence_lengths = source_->sequence_lengths();
  request.sequences = sequences_;
  request.num_samples = num_samples_;
  request.sequence_length = config_.sequence_length;
  request.random_seed = config_.random_seed;
  request.add_extra_token_to_sequence = config_.add_extra_token_to_sequence;
  request.drop_last_partial_sequence = split_ == Split::valid ? config_.drop_last_partial_validation_sequence : true;
  return request;
}

GptIndices GPTDataset::build() const {
  return build_gpt_indices(index_request(), str_cat(config_.mock ? std::string("mock data") : dataset_path_,
                                                    ": split '", split_name(split_), "'"));
}

std::filesystem::path GPTDataset::cache_file(const std::string& affix) const {
  return cache_directory_ / str_cat(unique_description_hash_, "-", kClassName, "-", split_name(split_), "-", affix);
}

bool GPTDataset::load_cache() {
  for (const char* affix : {"description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy"})
    if (!std::filesystem::is_regular_file(cache_file(affix))) return false;
  const auto document_path = cache_file("document_index.npy");
  const auto sample_path = cache_file("sample_index.npy");
  const auto shuffle_path = cache_file("shuffle_index.npy");
  NpyArray document = load_npy(document_path);
  NpyArray sample = load_npy(sample_path);
  NpyArray shuffle = load_npy(shuffle_path);
  MEGATRON_CHECK(document.descr == "<i4" && document.shape.size() == 1, document_path.string(),
                 ": expected a 1-D int32 array, found dtype ", document.descr, " with ", document.shape.size(), " dims");
  MEGATRON_CHECK(sample.shape.size() == 2 && sample.shape[1] == 2 && sample.shape[0] >= 1, sample_path.string(),
                 ": expected shape [samples + 1, 2]");
  MEGATRON_CHECK(shuffle.shape.size() == 1 && shuffle.shape[0] == sample.shape[0] - 1, shuffle_path.string(),
                 ": expected ", sample.shape[0] - 1, " entries (one per sample), found ",
                 shuffle.shape.empty() ? 0 : shuffle.shape[0]);
  GptIndices loaded;
  auto doc64 = document.to_int64(document_path);
  loaded.document_index.assign(doc64.begin(), doc64.end());
  loaded.sample_index = sample.to_int64(sample_path);
  loaded.sample_index_is_int64 = sample.descr == "<i8";
  loaded.shuffle_index = shuffle.to_int64(shuffle_path);
  loaded.shuffle_index_is_int64 = shuffle.descr == "<i8";
  check_gpt_indices(loaded, index_request(),
                    str_cat("the index cache ", cache_file("{document,sample,shuffle}_index.npy").string(), " of ",
                            dataset_path_, ", split '", split_name(split_), "' (delete these files to rebuild them)"));
  indices_ = std::move(loaded);
  return true;
}

void GPTDataset::save_cache() const {
  std::filesystem::create_directories(cache_directory_);
  const int64_t samples = indices_.num_samples();
  const int64_t doc_shape[] = {static_cast<int64_t>(indices_.document_index.size())};
  write_atomically(cache_file("document_index.npy"), [&](const std::filesystem::path& p) {
    save_npy(p, std::span<const int32_t>(indices_.document_index), doc_shape);
  });
  const int64_t sample_shape[] = {samples + 1, 2};
  write_atomically(cache_file("sample_index.npy"), [&](const std::filesystem::path& p) {
    if (indices_.sample_index_is_int64) save_npy(p, std::span<const int64_t>(indices_.sample_index), sample_shape);
    else save_array_as<int32_t>(p, indices_.sample_index, sample_shape);
  });
  const int64_t shuffle_shape[] = {samples};
  write_atomically(cache_file("shuffle_index.npy"), [&](const std::filesystem::path& p) {
    if (indices_.shuffle_index_is_int64) save_npy(p, std::span<const int64_t>(indices_.shuffle_index), shuffle_shape);
    else save_array_as<uint32_t>(p, indices_.shuffle_index, shuffle_shape);
  });
  write_atomically(cache_file("description.txt"), [&](const std::filesystem::path& p) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << unique_description_;
    MEGATRON_CHECK(out.good(), p.string(), ": write failed");
  });
}

void GPTDataset::sample(int64_t index, std::span<int64_t> tokens) const {
  MEGATRON_CHECK(index >= 0 && index < size(), dataset_path_, ": ", split_name(split_), " sample ", index,
                 " out of range [0, ", size(), ")");
  MEGATRON_CHECK(static_cast<int64_t>(tokens.size()) == sample_tokens(), "sample buffer holds ", tokens.size(),
                 " tokens, expected ", sample_tokens());
  const int64_t extra = config_.add_extra_token_to_sequence ? 1 : 0;
  const int64_t shuffled = indices_.shuffle_index[static_cast<size_t>(index)];
  const int64_t begin_doc = indices_.sample_index[static_cast<size_t>(2 * shuffled)];
  const int64_t begin_offset = indices_.sample_index[static_cast<size_t>(2 * shuffled + 1)];
  const int64_t end_doc = indices_.sample_index[static_cast<size_t>(2 * shuffled + 2)];
  const int64_t end_offset = indices_.sample_index[static_cast<size_t>(2 * shuffled + 3)];
  const auto lengths = source_->sequence_lengths();
  size_t filled = 0;
  for (int64_t d = begin_doc; d <= end_doc; ++d) {
    const int64_t sequence = indices_.document_index[static_cast<size_t>(d)];
    const int64_t offset = d == begin_doc ? begin_offset : 0;
    const int64_t stop = d == end_doc ? end_offset + extra : lengths[static_cast<size_t>(sequence)];
    const int64_t count = std::min<int64_t>(stop - offset, static_cast<int64_t>(tokens.size() - filled));
    if (count <= 0) continue;
    source_->read_tokens(sequence, offset, tokens.subspan(filled, static_cast<size_t>(count)));
    filled += static_cast<size_t>(count);
  }
  for (; filled < tokens.size(); ++filled) tokens[filled] = -1;  // Megatron's _PAD_TOKEN_ID
}

std::vector<int64_t> GPTDataset::sample(int64_t index) const {
  std::vector<int64_t> tokens(static_cast<size_t>(sample_tokens()));
  sample(index, tokens);
  return tokens;
}

std::array<std::optional<GPTDataset>, kNumSplits> build_gpt_dataset_splits(
    const TokenSequences& source, const std::string& dataset_path,
    const std::array<std::optional<int64_t>, kNumSplits>& sizes, const GPTDatasetConfig& config) {
  const SplitBookends bookends = split_bookends(config.split);
  const int64_t num_sequences = static_cast<int64_t>(source.sequence_lengths().size());
  std::array<std::optional<GPTDataset>, kNumSplits> out;
  for (int i = 0; i < kNumSplits; ++i) {
    if (!bookends[i]) continue;
    out[i].emplace(source, dataset_path, split_range(*bookends[i], num_sequences), sizes[i], static_cast<Split>(i),
                   config);
  }
  return out;
}

}  // namespace megatron::data
