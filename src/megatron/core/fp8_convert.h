// fp8 E4M3 / E5M2 conversions; see float_types.h for the contract.
#pragma once

namespace megatron {

MEGATRON_HD float to_float(fp8e4m3_t v) { return 0.0f; /* TODO(fp8 helper) */ }
MEGATRON_HD float to_float(fp8e5m2_t v) { return 0.0f; /* TODO(fp8 helper) */ }
MEGATRON_HD fp8e4m3_t fp8e4m3_from_float(float f) { return fp8e4m3_t{0}; /* TODO(fp8 helper) */ }
MEGATRON_HD fp8e5m2_t fp8e5m2_from_float(float f) { return fp8e5m2_t{0}; /* TODO(fp8 helper) */ }

}  // namespace megatron
