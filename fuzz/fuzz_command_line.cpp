// Fuzz target: pretrain_gpt's command line, up to the point where a run starts allocating: the flags, the
// derived defaults and every cross-field constraint, the pipeline split, --data-path and --split.
// Input: one byte choosing the world size (1..8), then the arguments separated by '\n'.
#include "fuzz_support.h"
#include "megatron/data/dataset_split.h"
#include "megatron/parallel/pipeline_split.h"
#include "megatron/train/arguments.h"
#include "megatron/train/flags.h"
#include "megatron/trainer/batches.h"

using namespace megatron;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<std::string> argv;
  std::string_view rest = fuzz::as_text(data + 1, size - 1);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    argv.emplace_back(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
  }
  fuzz::expect_clean_rejection([&] {
    train::Arguments args = train::parse_arguments(argv);
    args.parallel.world_size = 1 + data[0] % 8;
    train::resolve_and_validate(args);
    (void)parallel::describe(parallel::split_layers(train::pipeline_split_config(args)));
    (void)train::describe_arguments(args);
    if (!args.data.data_path.empty()) (void)trainer::parse_data_path(args.data.data_path);
    (void)data::split_bookends(args.data.split);
  });
  return 0;
}
