#!/usr/bin/env bash
# Every test, from a fresh machine: install, build (or reuse) the llama.cpp oracle,
# prepare (or reuse) the test models, run pytest. Caches live in ~/.cache/bankml/.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]'
if [ -x scripts/install_vulkan_cpu.sh ]; then scripts/install_vulkan_cpu.sh; fi
# headless Chromium for the web page's test (tests/server/test_web_page.py), Debian's packages
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver
fi
python3 -m bankml.oracle build
python3 -m bankml.testing.models
python3 -m pytest -q --durations=30 "$@"
