#!/usr/bin/env bash
# Every test, from a fresh machine: install, build (or reuse) the llama.cpp oracle,
# prepare (or reuse) the test models, run pytest. Caches live in ~/.cache/bankml/.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]'
if [ -x scripts/install_vulkan_cpu.sh ]; then scripts/install_vulkan_cpu.sh; fi
python3 -m bankml.oracle build
python3 -m bankml.testing.models
python3 -m pytest -q "$@"
