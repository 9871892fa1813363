#include "megatron/optim/adamw.h"

#include <algorithm>
#include <map>

#include "megatron/core/error.h"
#include "megatron/ops/elementwise/elementwise.h"
#include "megatron/ops/optimizer/optimizer.h"
#include "megatron/optim/offload_transfer_streams.h"

#if MEGATRON_WITH_CUDA
#include "megatron/core/cuda_check.h"
#endif

namespace megatron::optim {

namespace {

// `config` at another learning rate (--decoupled-lr's entries).
ops::AdamWConfig at_lr(ops::AdamWConfig config, double lr) {
  config.lr = float(lr);
  return config;
}

// Elements from one entry's start to the next in the shared state buffers: 64 (256 bytes of fp32), so every
// entry's state keeps the alignment of the update's vector accesses.
constexpr int64_t kStateAlignment = 64;
int64_t aligned(int64_t n) { return (n + kStateAlignment - 1) / kStateAlignment * kStateAlignment; }

// One kind of state (masters, a moment, a staging copy) for many entries: a buffer per dtype, allocated once and
// cut into aligned consecutive views. Every piece is reserved first, then the buffers allocated, then the pieces
// taken in the same order.
class StateArena {
 public:
  void reserve(int64_t n, DType dt) { sizes_[dt] += aligned(n); }
  // make(elements, dtype): one buffer.
  template <class Make>
  void allocate(Make make) {
    for (const auto& [dt, n] : sizes_) buffers_[dt] = {make(n, dt), 0};
  }
  Tensor take(int64_t n, DType dt) {
    Buffer& b = buffers_.at(dt);
    Tensor view = b.buffer.slice(b.used, b.used + n);
    b.used += aligned(n);
    return view;
  }
  // Every buffer, e.g. to fill them at once.
  template <class F>
  void for_each_buffer(F f) {
    for (auto& [dt, b] : buffers_) f(b.buffer);
  }

 private:
  struct Buffer {
    Tensor buffer;
    int64_t used = 0;
  };
  std::map<DType, int64_t> sizes_;
  std::map<DType, Buffer> buffers_;
};

}  // namespace

AdamW::AdamW(Context& ctx, std::vector<AdamWParam> params, const AdamWOptions& options) : options_(options) {
  MEGATRON_CHECK(options.offload_fraction >= 0.0 && options.offload_fraction <= 1.0,
                 "AdamW: offload_fraction ", options.offload_fraction, " must be within [0, 1]");
  int64_t total = 0, offloaded = 0;
  for (const AdamWParam& p : params) total += p.param.defined() ? p.param.numel() : 0;
  const double offload_threshold = options.offload_fraction * double(total);
  entries_.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    AdamWParam& p = params[i];
    MEGATRON_CHECK(p.param.defined() && p.main_grad.defined(), "AdamW: params[", i, "] needs a param and a main_grad");
    MEGATRON_CHECK(p.param.device() == ctx.device() && p.main_grad.device() == ctx.device(), "AdamW: params[", i,
                   "] (", p.param.describe(), ", grad ", p.main_grad.describe(), ") must live on ", ctx.device());
    MEGATRON_CHECK(p.main_grad.numel() == p.param.numel(), "AdamW: params[", i, "] is ", p.param.describe(),
                   " but its main_grad is ", p.main_grad.describe());
    const DType dt = p.param.dtype();
    MEGATRON_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16 || (dt == DType::F64 && !ctx.is_cuda()),
                   "AdamW: params[", i, "] is ", p.param.describe(), "; expected f32, bf16 or f16 (f64 on the CPU)");
    Entry e;
    e.source = std::move(p);
    if (double(offloaded) < offload_threshold) {
      offloaded += e.source.param.numel();
      e.on_host = true;
      e.has_separate_master = true;  // the device parameter is a copy of the host master, whatever its dtype
    } else {
      e.has_separate_master = dt == DType::BF16 || dt == DType::F16;
    }
    entries_.push_back(std::move(e));
  }
  place_host_state(ctx);
  place_device_state(ctx);
  if (overlapped(ctx) && offloaded_entries() > 0) streams_ = std::make_unique<TransferStreams>(entries_.size());
}

// The device entries' masters and moments are views of one buffer each (per dtype: F32, and F64 on the CPU)
// rather than an allocation per entry: the allocator rounds every request up to a size class (up to 25% more
// below 1 GiB), so with per-entry allocations a distributed optimizer's shard pieces that land just past a class
// boundary cost one data-parallel rank gigabytes more than another (Llama-70B's layers at DP = 2: 2.25 GiB).
void AdamW::place_device_state(Context& ctx) {
  StateArena masters, exp_avg, exp_avg_sq;
  const auto moment_dtype = [](const Entry& e) { return e.source.param.dtype() == DType::F64 ? DType::F64 : DType::F32; };
  for (const Entry& e : entries_) {
    if (e.on_host) continue;
    const int64_t n = e.source.param.numel();
    if (e.has_separate_master) masters.reserve(n, DType::F32);
    exp_avg.reserve(n, moment_dtype(e));
    exp_avg_sq.reserve(n, moment_dtype(e));
  }
  const auto on_device = [&](int64_t n, DType dt) { return ctx.empty({n}, dt); };
  masters.allocate(on_device);
  exp_avg.allocate(on_device);
  exp_avg_sq.allocate(on_device);
  exp_avg.for_each_buffer([&](const Tensor& t) { ops::fill(ctx, t, 0.0); });
  exp_avg_sq.for_each_buffer([&](const Tensor& t) { ops::fill(ctx, t, 0.0); });
  for (Entry& e : entries_) {
    if (e.on_host) continue;
    const int64_t n = e.source.param.numel();
    const Tensor flat_param = e.source.param.view({n});
    if (e.has_separate_master) {
      e.master = masters.take(n, DType::F32);
      ops::cast(ctx, e.master, flat_param);
    } else {
      e.master = flat_param;
    }
    e.exp_avg = exp_avg.take(n, moment_dtype(e));
    e.exp_avg_sq = exp_avg_sq.take(n, moment_dtype(e));
  }
}

AdamW::~AdamW() = default;
AdamW::AdamW(AdamW&&) noexcept = default;
AdamW& AdamW::operator=(AdamW&&) noexcept = default;

void AdamW::step(Context& ctx, double lr, double weight_decay, float grad_scale, std::optional<double> decoupled_lr) {
  if (fence_) {  // an asynchronous reader of the state (--async-save's copies) goes first
    std::function<void(Context&)> fence = std::move(fence_);
    fence_ = nullptr;
    fence(ctx);
  }
  ++step_count_;
  if (entries_.empty()) return;
  ops::AdamWConfig config;
  config.lr = float(lr);
  config.beta1 = float(options_.beta1);
  config.beta2 = float(options_.beta2);
  config.eps = float(options_.eps);
  config.weight_decay = float(weight_decay);
  config.step = step_count_;
  config.grad_scale = grad_scale;
  // The device entries in two updates: those at lr, and those at decoupled_lr (an elementwise op: the same bits
  // as one call).
  std::vector<ops::AdamParamGroupTensors> tensors, decoupled;
  std::vector<size_t> offloaded;
  tensors.reserve(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.on_host) {
      offloaded.push_back(i);
      continue;
    }
    ops::AdamParamGroupTensors t;
    t.param = e.master;
    t.exp_avg = e.exp_avg;
    t.exp_avg_sq = e.exp_avg_sq;
    t.grad = e.source.main_grad.view({e.source.main_grad.numel()});
    if (e.has_separate_master) t.model_param = e.source.param.view({e.source.param.numel()});
    t.weight_decay = e.source.no_weight_decay ? 0.0f : float(weight_decay);
    (decoupled_lr && e.source.embedding_or_output ? decoupled : tensors).push_back(std::move(t));
  }
  // Overlapped: the remaining gradient copies are queued before the device update, so they run beside it.
  if (overlapped(ctx) && !offloaded.empty()) {
#if MEGATRON_WITH_CUDA
    streams_->ready.record(ctx.stream());
    streams_->to_host.wait(streams_->ready.get());
    streams_->to_device.wait(streams_->ready.get());
#endif
    for (size_t i : offloaded) copy_gradient_to_host(ctx, i);
  }
  if (!tensors.empty()) ops::adamw_step(ctx, tensors, config);
  if (!decoupled.empty()) ops::adamw_step(ctx, decoupled, at_lr(config, *decoupled_lr));
  if (!offloaded.empty()) step_offloaded(ctx, offloaded, config, weight_decay, decoupled_lr);
}

void AdamW::copy_gradient_to_host(Context& ctx, size_t i) {
  Entry& e = entries_[i];
  if (e.grad_copied) return;
  e.grad_copied = true;
  copy_order_.push_back(i);
  const Tensor grad = e.source.main_grad.view({e.source.main_grad.numel()});
  if (!overlapped(ctx)) {
    copy_tensor(ctx, e.grad_host, grad);  // waits for ctx's stream on CUDA
    return;
  }
#if MEGATRON_WITH_CUDA
  CUDA_CHECK_MSG(cudaMemcpyAsync(e.grad_host.data_ptr(), grad.data_ptr(), grad.nbytes(), cudaMemcpyDeviceToHost,
                                 streams_->to_host.get()),
                 " (offloaded gradient ", grad.describe(), " -> host)");
  streams_->copied[i]->record(streams_->to_host.get());
#endif
}

void AdamW::prefetch_gradients(Context& ctx, const Tensor& region, StreamHandle stream) {
  if (!options_.overlap_offload_transfers || offloaded_entries() == 0) return;
  const auto* lo = static_cast<const char*>(region.data_ptr());
  const auto* hi = lo + region.nbytes();
  [[maybe_unused]] bool ordered = false;  // the copy stream waits for `stream` once, before the first copy (CUDA)
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (!e.on_host || e.grad_copied || e.source.grad_changes_after_reduction) continue;
    const auto* g = static_cast<const char*>(e.source.main_grad.data_ptr());
    if (g < lo || g + e.source.main_grad.nbytes() > hi) continue;
#if MEGATRON_WITH_CUDA
    if (overlapped(ctx) && !ordered) {
      streams_->ready.record(stream);
      streams_->to_host.wait(streams_->ready.get());
    }
#else
    (void)stream;
#endif
    ordered = true;
    copy_gradient_to_host(ctx, i);
  }
}

void AdamW::join_gradient_prefetches(Context& ctx) {
#if MEGATRON_WITH_CUDA
  if (!overlapped(ctx) || copy_order_.empty()) return;
  streams_->to_host_done.record(streams_->to_host.get());
  CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), streams_->to_host_done.get(), 0));
#else
  (void)ctx;
#endif
}

void AdamW::discard_gradient_prefetches() {
  for (size_t i : copy_order_) entries_[i].grad_copied = false;
  copy_order_.clear();
}

Context& AdamW::host(Context& ctx) {
  if (!ctx.is_cuda()) return ctx;
  if (!host_ctx_) host_ctx_ = Context::cpu();
  return *host_ctx_;
}

// The offloaded entries' host tensors -- the fp32 masters and moments (F64 for F64 parameters) and the
// gradient's and updated parameter's staging copies -- are views of one host buffer per kind and dtype
// (page-locked on CUDA, for the asynchronous copies), as the device state is (place_device_state: the allocator's
// size classes would round every entry up on its own); the masters from the parameters' values.
void AdamW::place_host_state(Context& ctx) {
  StateArena param_host, grad_host, masters, exp_avg, exp_avg_sq;
  const auto master_dtype = [](const Entry& e) { return e.source.param.dtype() == DType::F64 ? DType::F64 : DType::F32; };
  for (const Entry& e : entries_) {
    if (!e.on_host) continue;
    const int64_t n = e.source.param.numel();
    param_host.reserve(n, e.source.param.dtype());
    grad_host.reserve(n, e.source.main_grad.dtype());
    for (StateArena* state : {&masters, &exp_avg, &exp_avg_sq}) state->reserve(n, master_dtype(e));
  }
  Allocator& memory = ctx.is_cuda() ? ctx.pinned_allocator() : ctx.allocator();
  for (StateArena* a : {&param_host, &grad_host, &masters, &exp_avg, &exp_avg_sq})
    a->allocate([&](int64_t n, DType dt) { return Tensor::empty({n}, dt, memory); });
  Context& cpu = host(ctx);
  for (StateArena* moment : {&exp_avg, &exp_avg_sq}) moment->for_each_buffer([&](const Tensor& t) { ops::fill(cpu, t, 0.0); });
  for (Entry& e : entries_) {
    if (!e.on_host) continue;
    const Tensor& param = e.source.param;
    const int64_t n = param.numel();
    e.param_host = param_host.take(n, param.dtype());
    e.grad_host = grad_host.take(n, e.source.main_grad.dtype());
    e.master = masters.take(n, master_dtype(e));
    e.exp_avg = exp_avg.take(n, master_dtype(e));
    e.exp_avg_sq = exp_avg_sq.take(n, master_dtype(e));
    copy_tensor(ctx, e.param_host, param.view({n}));  // waits for the copy
    ops::cast(cpu, e.master, e.param_host);
  }
}

// The offloaded entries. Plain: their gradients to the host (copy_tensor into host memory waits for the device,
// so the gradients are final), one CPU AdamW over them writing the rounded parameters into the host staging, and
// those back to the device on ctx's stream (the staging is not written again before the next step's gradient
// copy, which waits for the stream). Overlapped (CUDA): step() queued every gradient copy on the device-to-host
// stream; entry by entry, in the order the copies were queued, the host waits for the entry's copy, updates it
// and queues its parameter's copy back on the host-to-device stream, so the transfers of one entry run while the
// host updates another; ctx's stream then waits for the last copy back. The staging is safe the same way: the next
// round's gradient copies wait for ctx's stream, which waited for these copies back.
void AdamW::step_offloaded(Context& ctx, const std::vector<size_t>& entries, const ops::AdamWConfig& config,
                           double weight_decay, std::optional<double> decoupled_lr) {
  const auto host_tensors = [&](size_t i) {
    Entry& e = entries_[i];
    ops::AdamParamGroupTensors t;
    t.param = e.master;
    t.exp_avg = e.exp_avg;
    t.exp_avg_sq = e.exp_avg_sq;
    t.grad = e.grad_host;
    t.model_param = e.param_host;
    t.weight_decay = e.source.no_weight_decay ? 0.0f : float(weight_decay);
    return t;
  };
  if (!overlapped(ctx)) {
    std::vector<ops::AdamParamGroupTensors> tensors, decoupled;
    for (size_t i : entries) {
      copy_gradient_to_host(ctx, i);
      (decoupled_lr && entries_[i].source.embedding_or_output ? decoupled : tensors).push_back(host_tensors(i));
    }
    if (!tensors.empty()) ops::adamw_step(host(ctx), tensors, config);
    if (!decoupled.empty()) ops::adamw_step(host(ctx), decoupled, at_lr(config, *decoupled_lr));
    for (size_t i : entries) copy_tensor(ctx, entries_[i].source.param.view({entries_[i].source.param.numel()}),
                                         entries_[i].param_host);
    discard_gradient_prefetches();
    return;
  }
#if MEGATRON_WITH_CUDA
  for (size_t i : copy_order_) {
    Entry& e = entries_[i];
    streams_->copied[i]->synchronize();
    const bool own_rate = decoupled_lr && e.source.embedding_or_output;
    ops::adamw_step(host(ctx), {host_tensors(i)}, own_rate ? at_lr(config, *decoupled_lr) : config);
    CUDA_CHECK_MSG(cudaMemcpyAsync(e.source.param.data_ptr(), e.param_host.data_ptr(), e.param_host.nbytes(),
                                   cudaMemcpyHostToDevice, streams_->to_device.get()),
                   " (updated offloaded parameter -> ", e.source.param.describe(), ")");
  }
  streams_->to_device_done.record(streams_->to_device.get());
  CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), streams_->to_device_done.get(), 0));
#endif
  discard_gradient_prefetches();
}

void AdamW::reload_model_params(Context& ctx) {
  for (Entry& e : entries_) {
    const Tensor param = e.source.param.view({e.source.param.numel()});
    if (e.on_host) {
      copy_tensor(ctx, e.param_host, param);
      ops::cast(host(ctx), e.master, e.param_host);
    } else if (e.has_separate_master) {
      ops::cast(ctx, e.master, param);
    }
  }
}

size_t AdamW::state_bytes() const {
  size_t bytes = 0;
  for (const Entry& e : entries_)
    if (!e.on_host)
      bytes += e.exp_avg.nbytes() + e.exp_avg_sq.nbytes() + (e.has_separate_master ? e.master.nbytes() : 0);
  return bytes;
}

size_t AdamW::host_state_bytes() const {
  size_t bytes = 0;
  for (const Entry& e : entries_)
    if (e.on_host)
      bytes += e.exp_avg.nbytes() + e.exp_avg_sq.nbytes() + e.master.nbytes() + e.grad_host.nbytes() +
               e.param_host.nbytes();
  return bytes;
}

size_t AdamW::offloaded_entries() const {
  return size_t(std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.on_host; }));
}

void AdamW::set_step_count(int64_t steps) {
  MEGATRON_CHECK(steps >= 0, "AdamW::set_step_count: ", steps, " must be >= 0");
  step_count_ = steps;
}

}  // namespace megatron::optim
