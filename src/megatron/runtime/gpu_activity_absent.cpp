// GpuActivity where the build found no CUPTI (CPU-only builds, or a CUDA toolkit without its extras): nothing
// can be recorded, and constructing a recorder says so.
#include "megatron/core/error.h"
#include "megatron/runtime/gpu_activity.h"

namespace megatron {

bool GpuActivity::available() { return false; }

GpuActivity::GpuActivity() {
  MEGATRON_FAIL("recording GPU kernels needs CUPTI, which this build did not find (a CPU-only build, or a CUDA "
                "toolkit without extras/CUPTI; configure with -DCUPTI_ROOT=<dir with include/ and lib/>)");
}

GpuActivity::~GpuActivity() = default;
void GpuActivity::enable() {}
void GpuActivity::disable() {}
std::vector<GpuActivityRecord> GpuActivity::take() { return {}; }

}  // namespace megatron
