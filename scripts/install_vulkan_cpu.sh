#!/bin/sh
# Vulkan on the CPU for bankml's SPIR-V backend: Mesa's lavapipe, the Vulkan loader, SPIRV-Tools
# (spirv-val, spirv-dis) and the PyPI `vulkan` binding. Installs only what is missing.
# Debian/Ubuntu (apt-get); run as root or with sudo available. Usage: scripts/install_vulkan_cpu.sh [python]
set -eu
PY="${1:-python3}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

need=""
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || need="$need mesa-vulkan-drivers"
ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' || need="$need libvulkan1"
command -v spirv-val >/dev/null 2>&1 && command -v spirv-dis >/dev/null 2>&1 || need="$need spirv-tools"
if [ -n "$need" ]; then
    echo "install_vulkan_cpu: apt-get install$need"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need
fi
"$PY" -c "import vulkan" 2>/dev/null || "$PY" -m pip install -q vulkan

"$PY" - <<'PYEOF'
from bankml.backends.spirv import runtime
for d in runtime.devices():
    print("install_vulkan_cpu: device", d)
PYEOF
