#!/usr/bin/env bash
# Installs what megatron.cpp needs to build and test, if it is missing: Debian/Ubuntu packages via apt-get
# and, when a CUDA toolkit is present, the header-only cudnn-frontend via pip. Idempotent and quiet when
# everything is there already.
#
#   scripts/deps.sh           # to build, train and run the quickstart
#   scripts/deps.sh --tests   # also what only tests use: torchrun (Debian's python3-torch), the tensorboard
#                             # package (its EventAccumulator reads the event files back) and ccache, for
#                             # scripts/test.sh
#   scripts/deps.sh --tests --sanitizers   # and clang-19 with its runtime libraries (libFuzzer, ASan, UBSan)
#                             # for scripts/robustness.sh
set -euo pipefail
WITH_TESTS=0 WITH_SANITIZERS=0
for arg in "$@"; do
  case $arg in
    --tests) WITH_TESTS=1 ;;
    --sanitizers) WITH_SANITIZERS=1 ;;
    *) echo "deps: unknown argument $arg (--tests, --sanitizers)" >&2; exit 2 ;;
  esac
done

APT_PACKAGES=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libopenblas-dev nlohmann-json3-dev
              libcli11-dev libpcre2-dev libicu-dev libopenmpi-dev openmpi-bin libsentencepiece-dev libyaml-cpp-dev
              libprotobuf-dev protobuf-compiler python3-pip)
# scripts/test.sh compiles through ccache (each build of a fresh clone reuses the previous builds' objects).
[ "$WITH_TESTS" = 1 ] && APT_PACKAGES+=(ccache)
# The sanitizer and fuzzing configuration (scripts/robustness.sh) needs clang >= 15 with its runtime libraries
# (libFuzzer, ASan, UBSan): clang-19 from the distribution's packages.
[ "$WITH_SANITIZERS" = 1 ] && APT_PACKAGES+=(clang-19 libclang-rt-19-dev)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "deps: installing ${missing[*]}"
    $SUDO apt-get update -qq
    UPDATED=1
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "deps: missing packages ${missing[*]} and no apt-get here; install them by hand" >&2
  fi
fi

# torchrun, for the test that launches pretrain_gpt with it (test_trainer_torchrun_launch): Debian's
# python3-torch (torch 1.13, /usr/bin/torchrun). Apart, and allowed to fail: a distribution without the
# package still builds and runs every other test; that one then fails and says how to install torchrun.
if [ "$WITH_TESTS" = 1 ] && ! command -v torchrun >/dev/null 2>&1 && ! dpkg -s python3-torch >/dev/null 2>&1 &&
   command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "deps: installing python3-torch (torchrun)"
  [ "${UPDATED:-0}" = 1 ] || $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-torch >/dev/null ||
    echo "deps: python3-torch could not be installed: test_trainer_torchrun_launch will fail (pip install torch)" >&2
fi

PY=${PYTHON:-python3}
pip_install() {  # pip_install module package [pip args...]
  local module=$1 package=$2
  shift 2
  if ! $PY -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('$module') else 1)" 2>/dev/null; then
    echo "deps: pip install $package"
    $PY -m pip install -q --disable-pip-version-check "$@" "$package" 2>&1 | grep -v "Running pip as the 'root' user" || true
  fi
}

NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -n "$NVCC" ]; then
  # cudnn-frontend is header only; its wheel puts include/ in site-packages, where CMake looks.
  if ! ls "$($PY -c 'import site; print(site.getsitepackages()[0])')/include/cudnn_frontend.h" >/dev/null 2>&1; then
    echo "deps: pip install --no-deps nvidia-cudnn-frontend"
    $PY -m pip install -q --disable-pip-version-check --no-deps nvidia-cudnn-frontend 2>&1 | grep -v "Running pip as the 'root' user" || true
  fi
fi
# Reference implementations the data tests compare against (tokenizer parity, numpy's RandomState), and the
# safetensors package the checkpoint tests read and write files with.
pip_install numpy numpy
pip_install safetensors safetensors
pip_install tokenizers tokenizers
pip_install tiktoken tiktoken
pip_install sentencepiece sentencepiece
# TensorBoard's reader, against which the event files of --tensorboard-dir are tested (~20 s to install).
if [ "$WITH_TESTS" = 1 ]; then
  pip_install tensorboard tensorboard
fi
