#!/usr/bin/env bash
# Saves the GPU machine's build time (about 110 s of a lease for pretrain_gpt) by carrying binaries built here.
#   scripts/gpu/carried_tools.sh pack      here, after a CUDA build in build/: packs build/tools/pretrain_gpt and
#                                          preprocess_data with the shared libraries the GPU machine (Ubuntu
#                                          24.04) lacks (Debian 12's ICU 72) into .deps/bin/tools.tar.xz (~13 MB)
#   scripts/gpu/carried_tools.sh install   there: unpacks them into build-gpu/tools/, puts the libraries in
#                                          /usr/local/lib (ldconfig), and if the binary does not start, builds
#                                          pretrain_gpt and preprocess_data there instead (as scripts/gpu/run.sh)
#   CARRY_TESTS="test_a test_b" scripts/gpu/carried_tools.sh pack
#                                          also packs those test executables from build/tests/; `install` puts
#                                          them back in build/tests/ (and pretrain_gpt in build/tools/) and, since
#                                          the tests hold their helpers' absolute paths from this machine's
#                                          build, links this machine's checkout path to the GPU machine's copy
# Carry `.deps` in the device call.
set -euo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  pack)
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    cp build/tools/pretrain_gpt build/tools/preprocess_data "$stage/"
    if [ -n "${CARRY_TESTS:-}" ]; then
      mkdir -p "$stage/tests"
      for t in $CARRY_TESTS; do cp "build/tests/$t" "$stage/tests/"; done
      echo "$PWD" >"$stage/tests/checkout_path"
    fi
    # ICU's and yaml-cpp's sonames carry their versions (ICU 72 and yaml-cpp 0.7 here, 74 and 0.8 there);
    # everything else the binary links is on both machines.
    for lib in $(ldd build/tools/pretrain_gpt | awk '/libicu|libyaml-cpp/ {print $3}'); do cp -L "$lib" "$stage/"; done
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
    if build-gpu/tools/pretrain_gpt --help >/dev/null 2>&1; then
      echo "carried pretrain_gpt runs here"
    else
      echo "carried pretrain_gpt does not start here ($(ldd build-gpu/tools/pretrain_gpt | grep -c 'not found') missing libraries): building"
      rm -f build-gpu/tools/pretrain_gpt build-gpu/tools/preprocess_data
      cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCUDNN_FRONTEND_ROOT="$PWD/.deps/cudnn_frontend" -DPCRE2_ROOT="$PWD/.deps/pcre2" -DMEGATRON_TOKENIZERS=ON >/dev/null
      cmake --build build-gpu -j "$(nproc)" --target pretrain_gpt preprocess_data | tail -1
    fi
    if [ -d "$stage/tests" ]; then
      home=$(cat "$stage/tests/checkout_path")
      mkdir -p build/tests build/tools
      mv "$stage"/tests/test_* build/tests/
      cp build-gpu/tools/pretrain_gpt build/tools/
      if [ "$home" != "$PWD" ] && [ ! -e "$home" ]; then mkdir -p "$(dirname "$home")" && ln -s "$PWD" "$home"; fi
      echo "carried tests: $(ls build/tests | tr '\n' ' ')(built at $home)"
    fi
    rm -rf "$stage"
    ;;
  *) echo "usage: scripts/gpu/carried_tools.sh pack|install" >&2; exit 2 ;;
esac
