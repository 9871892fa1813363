#!/usr/bin/env bash
# Installs what megatron.cpp needs to build and test, if it is missing: Debian/Ubuntu packages via apt-get
# and, when a CUDA toolkit is present, the header-only cudnn-frontend via pip. Idempotent and quiet when
# everything is there already.
set -euo pipefail

APT_PACKAGES=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libopenblas-dev nlohmann-json3-dev
              libcli11-dev libpcre2-dev libicu-dev libopenmpi-dev openmpi-bin libsentencepiece-dev libyaml-cpp-dev
              python3-pip)

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
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "deps: missing packages ${missing[*]} and no apt-get here; install them by hand" >&2
  fi
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
