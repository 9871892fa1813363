// Megatron-LM flags that pretrain_gpt accepts as documented no-ops (the design makes them moot) or refuses
// with a reason that names what to use instead. Sources: the flags of Megatron-LM's examples/gpt3,
// examples/llama and examples/mixtral scripts and the MoE guide's script, and the guides' list in
// MEGATRON-COMPAT.md (docs/flags.md has the table; tests/train/megatron_flags/ the lists).
#include "megatron/train/flag_spec.h"

namespace megatron::train {
namespace {

using F = FlagForm;

const char* kFusedKernels =
    "a kernel-fusion choice of Megatron's PyTorch path; the kernels here are fixed and compute the same math";

std::vector<FlagSpec> noop_flags() {
  return {
      noop_flag("--use-flash-attn", F::Switch,
                "fused attention is always on (cuDNN's fused flash attention on GPUs, an exact blocked kernel on CPUs)"),
      noop_flag("--attention-backend", F::Value, "fused attention is always on (cuDNN's on GPUs); the backend is not a choice",
                {"flash", "fused", "unfused", "local", "auto"}),
      noop_flag("--transformer-impl", F::Value,
                "one implementation: its fused paths play Transformer Engine's part (fused attention, cuBLASLt "
                "epilogues, FP8 linears)",
                {"local", "transformer_engine", "inference_optimized"}),
      noop_flag("--use-mcore-models", F::Switch, "Megatron-core models are the only models (Megatron ignores the flag too)"),
      noop_flag("--no-gradient-accumulation-fusion", F::Switch,
                "the weight-gradient GEMM always accumulates straight into the fp32 main gradient; there is no "
                "unfused path"),
      noop_flag("--num-workers", F::Value, "data is memory-mapped and read on the training thread; there are no loader workers"),
      noop_flag("--no-mmap-bin-files", F::Switch, ".bin files are always memory-mapped (read-only: the same bytes)"),
      noop_flag("--no-create-attention-mask-in-dataloader", F::Switch,
                "no attention mask is ever built: attention is causal by construction"),
      noop_flag("--no-masked-softmax-fusion", F::Switch, kFusedKernels),
      noop_flag("--no-bias-gelu-fusion", F::Switch, kFusedKernels),
      noop_flag("--no-bias-swiglu-fusion", F::Switch, kFusedKernels),
      noop_flag("--no-bias-dropout-fusion", F::Switch, kFusedKernels),
      noop_flag("--no-rope-fusion", F::Switch, kFusedKernels),
      noop_flag("--no-persist-layer-norm", F::Switch, kFusedKernels),
      noop_flag("--cross-entropy-loss-fusion", F::Switch, "the cross-entropy is always one fused kernel (loss and gradient)"),
      noop_flag("--cross-entropy-fusion-impl", F::Value, "the cross-entropy is always one fused kernel", {"native", "te"}),
      noop_flag("--moe-permute-fusion", F::Switch, "token permutation is always one fused gather/scatter here"),
      noop_flag("--manual-gc", F::Switch, "Python's garbage collector: there is none here"),
      noop_flag("--manual-gc-interval", F::Value, "Python's garbage collector: there is none here"),
      noop_flag("--no-manual-gc-eval", F::Switch, "Python's garbage collector: there is none here"),
      noop_flag("--empty-unused-memory-level", F::Value,
                "torch.cuda.empty_cache(): the caching allocator keeps its blocks (it releases them and retries once "
                "when an allocation fails)",
                {"0", "1", "2"}),
      noop_flag("--auto-detect-ckpt-format", F::Switch, "there is one checkpoint format (metadata.json says it)"),
      noop_flag("--grad-reduce-in-bf16", F::Switch,
                "gradients are always accumulated and reduced in fp32 here (more precise; bf16 only saves bandwidth)"),
      noop_flag("--pytorch-profiler-collect-shapes", F::Switch,
                "--use-pytorch-profiler records the GPU's kernels and copies (with their byte counts), not PyTorch "
                "operators, so there are no operator shapes to add"),
      noop_flag("--pytorch-profiler-collect-callstack", F::Switch,
                "there is no Python call stack; the trace's spans name each micro-batch's forward and backward"),
  };
}

// --ckpt-format: torch_dist is the sharded format written here; the others are refused.
FlagSpec ckpt_format_flag() {
  FlagSpec f = noop_flag("--ckpt-format", F::Value,
                         "torch_dist (Megatron's default) is the sharded, resharding format written here "
                         "(docs/checkpoint.md); the other formats are refused",
                         {"torch", "torch_dist", "torch_dcp", "fsdp_dtensor", "zarr"});
  f.set = [](Arguments& a, const std::string& v) {
    if (v != "torch_dist")
      refuse(a, "--ckpt-format", v,
             "checkpoints here are sharded with global offsets, Megatron's torch_dist layout (docs/checkpoint.md); "
             "use --ckpt-format torch_dist or leave the flag out");
    return std::string();
  };
  return f;
}

std::vector<FlagSpec> refused_flags() {
  const std::string hydra = "a Hydra option of NeMo / Megatron-Bridge recipe scripts, not of Megatron-LM's pretrain_gpt; "
                            "pass Megatron's flags (or --yaml-cfg FILE)";
  return {
      refused_flag("--config-name", F::Value, hydra),
      refused_flag("--config-path", F::Value, hydra),
      refused_flag("--pytorch-profiler-collect-chakra", F::Switch,
                   "there is no Chakra execution-trace writer here; --use-pytorch-profiler's Chrome trace holds the "
                   "kernels, copies and spans of the profiled iterations"),
      refused_flag("--record-memory-history", F::Switch,
                   "PyTorch's allocator history (a pickle for its memory viz) has no equivalent here; the log's memory "
                   "line (peak allocated, model state, peak activations) and --dry-run's per-rank plan show where "
                   "memory goes"),
      refused_flag("--consistency-check", F::Switch,
                   "not an argument of Megatron-LM's pretrain_gpt (megatron/training/arguments.py); drop the flag"),
  };
}

}  // namespace

std::vector<FlagSpec> compat_flags() {
  std::vector<FlagSpec> all = noop_flags();
  all.push_back(ckpt_format_flag());
  for (FlagSpec& f : refused_flags()) all.push_back(std::move(f));
  return all;
}

}  // namespace megatron::train
