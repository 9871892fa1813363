#!/usr/bin/env bash
# Run here (not on the GPU machine): copies the cudnn-frontend and nlohmann-json headers, PCRE2 (header and
# static library) and Protobuf (headers, static library, protoc) into .deps/ (git-ignored) so a device call can
# carry them (`carry: [".deps"]`), since the GPU machine cannot install anything.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/deps.sh
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
mkdir -p .deps/cudnn_frontend
rm -rf .deps/cudnn_frontend/include
cp -r "$SP/include" .deps/cudnn_frontend/include
# nlohmann-json (header only) for the checkpoint library, in case the GPU machine lacks the system package.
if [ -f /usr/include/nlohmann/json.hpp ]; then
  rm -rf .deps/nlohmann_json && mkdir -p .deps/nlohmann_json/include
  cp -r /usr/include/nlohmann .deps/nlohmann_json/include/
fi
# PCRE2 for the GPT-2 / HF / tiktoken tokenizers: the GPU machine (Ubuntu 24.04) has no libpcre2-dev. Debian
# 12 and Ubuntu 24.04 both ship PCRE2 10.42; its one header and the static 8-bit library (position
# independent, no dependencies) are all a build needs. scripts/gpu/run.sh passes -DPCRE2_ROOT=.deps/pcre2.
PCRE2_INCLUDE=$(pkg-config --variable=includedir libpcre2-8)
PCRE2_LIB=$(pkg-config --variable=libdir libpcre2-8)
rm -rf .deps/pcre2 && mkdir -p .deps/pcre2/include .deps/pcre2/lib
cp "$PCRE2_INCLUDE/pcre2.h" .deps/pcre2/include/
cp "$PCRE2_LIB/libpcre2-8.a" .deps/pcre2/lib/
echo "pcre2 $(pkg-config --modversion libpcre2-8) -> .deps/pcre2"
# CUPTI (--use-pytorch-profiler's kernel records), in case the GPU machine's toolkit lacks its extras: the
# headers and the library of this toolkit; scripts/gpu/fp8_bench.sh passes -DCUPTI_ROOT=.deps/cupti (CMake
# prefers the machine's own toolkit).
CUPTI_H=$(dirname "$({ find /usr/local/cuda/include /usr/local/cuda/extras/CUPTI/include -name cupti_activity.h 2>/dev/null || true; } | head -1)")
CUPTI_SO=$({ find -L /usr/local/cuda/lib64 /usr/local/cuda/extras/CUPTI/lib64 -name 'libcupti.so.*' 2>/dev/null || true; } | head -1)
if [ -n "$CUPTI_SO" ] && [ -f "$CUPTI_H/cupti_activity.h" ]; then
  rm -rf .deps/cupti && mkdir -p .deps/cupti/include .deps/cupti/lib
  cp "$CUPTI_H"/cupti*.h .deps/cupti/include/
  cp -L "$CUPTI_SO" .deps/cupti/lib/ && ln -sf "$(basename "$CUPTI_SO")" .deps/cupti/lib/libcupti.so
  echo "cupti $(basename "$CUPTI_SO") -> .deps/cupti"
fi
# Protobuf for TensorBoard's event files (--tensorboard-dir): the GPU machine has no libprotobuf-dev. Debian 12's
# headers, static library and protoc (with the two shared libraries it needs, found next to it by a wrapper);
# scripts/gpu/run.sh passes -DProtobuf_ROOT=.deps/protobuf, and a protoc that does not run there leaves
# TensorBoard out of the build (src/megatron/tensorboard/CMakeLists.txt) rather than failing it.
if command -v protoc >/dev/null 2>&1 && [ -f /usr/include/google/protobuf/message.h ]; then
  PB_LIB=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libprotobuf.so[.0-9]* /{print $NF; exit}')")")
  rm -rf .deps/protobuf && mkdir -p .deps/protobuf/include/google .deps/protobuf/lib .deps/protobuf/bin
  cp -r /usr/include/google/protobuf .deps/protobuf/include/google/
  cp "$PB_LIB/libprotobuf.a" .deps/protobuf/lib/
  cp "$(readlink -f "$(command -v protoc)")" .deps/protobuf/bin/protoc.bin
  for so in $(ldd "$(command -v protoc)" | awk '/libproto/{print $3}'); do cp -L "$so" .deps/protobuf/bin/; done
  cat > .deps/protobuf/bin/protoc <<'SH'
#!/bin/sh
here=$(dirname "$0")
LD_LIBRARY_PATH="$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/protoc.bin" "$@"
SH
  chmod +x .deps/protobuf/bin/protoc
  echo "protobuf $(.deps/protobuf/bin/protoc --version) -> .deps/protobuf"
fi
du -sh .deps
