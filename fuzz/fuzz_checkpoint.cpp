// Fuzz target: a sharded checkpoint as --load, generate and convert_checkpoint read it: the tracker file,
// metadata.json (tensors, pieces, the saved state) and a shard file's header and data.
// Input: latest_checkpointed_iteration.txt, kPartSeparator, iter_0000001/metadata.json, kPartSeparator,
// iter_0000001/rank_00000.safetensors. What opens is read like a resume: the preview (iteration, seed), the
// model arguments rebuilt from the saved args, and every tensor loaded whole (checksums checked).
#include <cstdlib>

#include "fuzz_support.h"
#include "megatron/checkpoint/shard_reader.h"
#include "megatron/checkpoint/training_checkpoint.h"
#include "megatron/runtime/context.h"
#include "megatron/train/arguments.h"

using namespace megatron;

namespace {

// Tensors up to this many elements are loaded (a real loader allocates what its model holds, not what a
// file claims; the claim is checked against the model's shape first).
constexpr int64_t kMaxLoadedElements = int64_t{1} << 16;

void load_every_tensor(Context& ctx, checkpoint::CheckpointReader& reader) {
  for (const auto& [key, entry] : reader.metadata().tensors) {
    int64_t numel = 1;
    for (int64_t d : entry.global_shape) numel = d > 0 && numel <= kMaxLoadedElements ? numel * d : 0;
    if (numel <= 0 || numel > kMaxLoadedElements) continue;
    Tensor dst = ctx.empty(Shape(entry.global_shape), entry.dtype);
    fuzz::expect_clean_rejection([&] { reader.load_whole(ctx, key, dst); });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), 3);
  const auto root = fuzz::scratch_dir() / "ckpt";
  std::filesystem::remove_all(root);
  fuzz::write_file(root / "latest_checkpointed_iteration.txt", parts[0]);
  fuzz::write_file(root / "iter_0000001" / "metadata.json", parts[1]);
  fuzz::write_file(root / "iter_0000001" / "rank_00000.safetensors", parts[2]);
  static const std::unique_ptr<Context> ctx = Context::cpu();
  fuzz::expect_clean_rejection([&] {
    const checkpoint::CheckpointPreview preview = checkpoint::preview_checkpoint(root);
    checkpoint::CheckpointReader reader = checkpoint::CheckpointReader::open(preview.directory);
    load_every_tensor(*ctx, reader);
    train::Arguments args = checkpoint::arguments_from_state(reader.state());
    train::resolve(args);
    (void)train::constraint_violations(args);
  });
  return 0;
}
