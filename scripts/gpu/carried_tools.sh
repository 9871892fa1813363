#!/usr/bin/env bash
# Saves the GPU machine's build time (about 110 s of a lease for pretrain_gpt) by carrying binaries built here.
#   scripts/gpu/carried_tools.sh pack      here, after a CUDA build in build/: packs build/tools/pretrain_gpt and
#                                          preprocess_data with the shared libraries the GPU machine (Ubuntu
#                                          24.04) lacks (Debian 12's ICU 72) into .deps/bin/tools.tar.xz (~13 MB)
#   scripts/gpu/carried_tools.sh install   there: unpacks them into build-gpu/tools/, puts the libraries in
#                                          /usr/local/lib (ldconfig), and if the binary does not start, builds
#                                          pretrain_gpt and preprocess_data there instead (as scripts/gpu/run.sh)
# Carry `.deps` in the device call.
set -euo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  pack)
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    cp build/tools/pretrain_gpt build/tools/preprocess_data "$stage/"
    # ICU's soname carries its version (72 here, 74 there); everything else the binary links is on both machines.
    for lib in $(ldd build/tools/pretrain_gpt | awk '/libicu/ {print $3}'); do cp -L "$lib" "$stage/"; done
    mkdir -p .deps/bin
    tar cJf .deps/bin/tools.tar.xz -C "$stage" .
    echo "packed $(tar tJf .deps/bin/tools.tar.xz | grep -v '^\./$' | tr '\n' ' ') -> .deps/bin/tools.tar.xz" \
         "($(du -h .deps/bin/tools.tar.xz | cut -f1); commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'))"
    ;;
  install)
    mkdir -p build-gpu/tools
    stage=$(mktemp -d)
    tar xJf .deps/bin/tools.tar.xz -C "$stage"
    mv "$stage"/pretrain_gpt "$stage"/preprocess_data build-gpu/tools/
    cp "$stage"/lib*.so* /usr/local/lib/ 2>/dev/null && ldconfig
    rm -rf "$stage"
    if build-gpu/tools/pretrain_gpt --help >/dev/null 2>&1; then
      echo "carried pretrain_gpt runs here"
    else
      echo "carried pretrain_gpt does not start here ($(ldd build-gpu/tools/pretrain_gpt | grep -c 'not found') missing libraries): building"
      rm -f build-gpu/tools/pretrain_gpt build-gpu/tools/preprocess_data
      cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" -DPCRE2_ROOT="$PWD/.deps/pcre2" -DMEGATRON_TOKENIZERS=ON >/dev/null
      cmake --build build-gpu -j "$(nproc)" --target pretrain_gpt preprocess_data | tail -1
    fi
    ;;
  *) echo "usage: scripts/gpu/carried_tools.sh pack|install" >&2; exit 2 ;;
esac
