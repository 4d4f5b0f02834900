"""The Q1_0 x q8_0 matvec on Vulkan: the kernel (matvec), its CPU spec (reference) and the
on-device oracle that admits a device (q1.device_check)."""
