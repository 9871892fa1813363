#include "megatron/runtime/upload_staging.h"

#include <cstring>

#include "megatron/core/error.h"

#if MEGATRON_WITH_CUDA
#include "megatron/runtime/cuda_stream.h"
#endif

namespace megatron {

#if MEGATRON_WITH_CUDA
namespace {

// Each transfer starts on a 256-byte boundary of the slot's buffer (cudaMalloc's alignment, so a staged tensor
// is aligned as the device tensors it is copied to).
constexpr size_t kAlignment = 256;

size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

struct UploadStaging::Slot {
  Tensor buffer;       // page-locked bytes, or undefined before the first upload through this slot
  CudaEvent copied;    // recorded on ctx's stream after this slot's last copies
  bool queued = false; // `copied` was recorded and not yet waited for
};
#else
struct UploadStaging::Slot {};
#endif

UploadStaging::UploadStaging(Context& ctx, int slots) : ctx_(ctx) {
  MEGATRON_CHECK(slots >= 1, "UploadStaging: needs at least one slot, got ", slots);
  // Only a CUDA context has slots: their events need a CUDA driver, which a CUDA build on a CPU machine lacks.
  if (!ctx.is_cuda()) return;
  for (int i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>());
}

UploadStaging::~UploadStaging() {
#if MEGATRON_WITH_CUDA
  for (const auto& slot : slots_)
    if (slot->queued) slot->copied.synchronize();
#endif
}

void UploadStaging::wait_for_free_slot() {
#if MEGATRON_WITH_CUDA
  if (slots_.empty()) return;  // a CPU context
  Slot& slot = *slots_[next_];
  if (!slot.queued) return;
  slot.copied.synchronize();
  slot.queued = false;
#endif
}

void UploadStaging::upload(std::span<const Transfer> transfers) {
  for (const Transfer& t : transfers)
    MEGATRON_CHECK(t.host.device().is_cpu() && t.device.dtype() == t.host.dtype() && t.device.numel() == t.host.numel(),
                   "UploadStaging: cannot upload ", t.host.describe(), " into ", t.device.describe(),
                   " (the source must be a host tensor of the destination's dtype and number of elements)");
  if (!ctx_.is_cuda()) {
    for (const Transfer& t : transfers) copy_tensor(ctx_, t.device, t.host);
    return;
  }
#if MEGATRON_WITH_CUDA
  wait_for_free_slot();
  Slot& slot = *slots_[next_];
  size_t total = 0;
  for (const Transfer& t : transfers) total += aligned(t.host.nbytes());
  if (total == 0) return;
  if (!slot.buffer.defined() || slot.buffer.nbytes() < total)  // the slot is idle: its old buffer may go
    slot.buffer = Tensor::empty({int64_t(total)}, DType::U8, ctx_.pinned_allocator());
  char* base = static_cast<char*>(slot.buffer.data_ptr());
  size_t offset = 0;
  for (const Transfer& t : transfers) {
    std::memcpy(base + offset, t.host.data_ptr(), t.host.nbytes());
    copy_tensor(ctx_, t.device, Tensor::from_blob(base + offset, t.host.shape(), t.host.dtype(), Device::cpu()));
    offset += aligned(t.host.nbytes());
  }
  slot.copied.record(ctx_.stream());
  slot.queued = true;
  next_ = (next_ + 1) % slots_.size();
#endif
}

}  // namespace megatron
