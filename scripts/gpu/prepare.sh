#!/usr/bin/env bash
# Run here (not on the GPU machine): copies the cudnn-frontend and nlohmann-json headers into .deps/ (git-ignored) so a device
# call can carry them (`carry: [".deps"]`), since the GPU machine cannot install anything.
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
du -sh .deps
