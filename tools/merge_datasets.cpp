// merge_datasets: concatenates Megatron indexed datasets (documents in the order given) into one
// <output-prefix>.{bin,idx}, as Megatron's tools/merge_datasets.py.
//   merge_datasets --input A B C --output-prefix OUT   prefixes, in this order
//   merge_datasets --input DIR --output-prefix OUT     every <prefix>.{bin,idx} pair in DIR, sorted by name
// Every input is validated first (magic, version, counts, .bin size); inputs of different dtypes are refused
// with one message listing each input's dtype. Exit status: 0 done, 1 an error (no .idx written), 2 a
// command-line syntax error.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/data/indexed_dataset.h"

namespace {

namespace fs = std::filesystem;
using megatron::str_cat;

// The dataset prefixes in `dir`, sorted; a .bin without its .idx (or the reverse) is an error.
std::vector<std::string> prefixes_in_directory(const fs::path& dir) {
  std::set<std::string> bins, idxs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const fs::path& p = entry.path();
    const std::string prefix = (p.parent_path() / p.stem()).string();
    if (p.extension() == ".bin") bins.insert(prefix);
    if (p.extension() == ".idx") idxs.insert(prefix);
  }
  std::vector<std::string> unpaired;
  for (const auto& b : bins) {
    if (!idxs.count(b)) unpaired.push_back(b + ".bin (no .idx)");
  }
  for (const auto& i : idxs) {
    if (!bins.count(i)) unpaired.push_back(i + ".idx (no .bin)");
  }
  if (!unpaired.empty()) {
    std::string text = str_cat(dir.string(), ": files without their pair:");
    for (const auto& u : unpaired) text += "\n  " + u;
    throw megatron::Error(text);
  }
  MEGATRON_CHECK(!idxs.empty(), dir.string(), ": no <prefix>.{bin,idx} pairs in this directory");
  return {idxs.begin(), idxs.end()};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  std::string output_prefix;
  CLI::App app{"Concatenates Megatron indexed datasets into <output-prefix>.{bin,idx}."};
  app.add_option("--input", inputs, "Dataset prefixes (in order), or one directory holding <prefix>.{bin,idx} pairs")
      ->required()
      ->expected(1, 1 << 20);
  app.add_option("--output-prefix", output_prefix, "Output prefix (writes <prefix>.bin and <prefix>.idx)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  try {
    std::vector<std::string> prefixes = inputs;
    if (inputs.size() == 1 && fs::is_directory(inputs[0])) prefixes = prefixes_in_directory(inputs[0]);
    const auto same_file = [](const std::string& a, const std::string& b) {
      std::error_code ec;
      return fs::weakly_canonical(a + ".bin", ec) == fs::weakly_canonical(b + ".bin", ec);
    };
    for (const auto& p : prefixes) {
      MEGATRON_CHECK(!same_file(p, output_prefix), "--output-prefix ", output_prefix, " is also an input (", p,
                     "); write the merge elsewhere");
    }

    // Validate every input and compare dtypes before anything is written.
    int64_t documents = 0, sequences = 0, tokens = 0;
    std::vector<megatron::data::TokenDType> dtypes;
    for (const auto& p : prefixes) {
      const megatron::data::IndexedDatasetReader reader(p);
      dtypes.push_back(reader.dtype());
      documents += reader.num_documents();
      sequences += reader.num_sequences();
      for (int32_t n : reader.sequence_lengths()) tokens += n;
    }
    if (std::any_of(dtypes.begin(), dtypes.end(), [&](auto d) { return d != dtypes.front(); })) {
      std::string text = "inputs have different token dtypes (a merge needs one dtype; re-run preprocess_data "
                         "with the same tokenizer):";
      for (size_t i = 0; i < prefixes.size(); ++i) {
        text += str_cat("\n  ", prefixes[i], ": ", megatron::data::token_dtype_name(dtypes[i]));
      }
      throw megatron::Error(text);
    }

    megatron::data::merge_indexed_datasets(prefixes, output_prefix);
    std::printf("merge_datasets: %zu inputs -> %s.{bin,idx}: %lld documents, %lld sequences, %lld tokens, %s\n",
                prefixes.size(), output_prefix.c_str(), static_cast<long long>(documents),
                static_cast<long long>(sequences), static_cast<long long>(tokens),
                megatron::data::token_dtype_name(dtypes.front()));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "merge_datasets: error: " << e.what() << std::endl;
    return 1;
  }
}
