"""A small Vulkan runner (PyPI `vulkan`, cffi): devices, buffers, one dispatch per Q1_0 matvec.

    dev = open_device(0)                        # or select_device() in backends/spirv/q1/device_check.py
    mv = Q1Matvec(dev).upload(w_raw, rows, k)   # raw Q1_0 rows (rows * k/128 * 18 bytes)
    y = mv.run(act_raw)                         # raw q8_0 row (k/32 * 34 bytes) -> np.float32[rows]

Memory is host-visible (device-local too where the device has such a type), so upload/run are
plain memcpy; a discrete GPU without host-visible device memory reads the weights over the bus.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from bankml.backends.spirv.q1 import matvec as q1_matvec
from bankml.errors import BankmlError


class VulkanUnavailable(BankmlError):
    """No Vulkan loader, driver or device: bankml stays on the CPU."""


class DeviceRefused(BankmlError):
    """A Vulkan device that bankml will not use (too old, or it failed the on-device oracle)."""


def _vk():
    try:
        import vulkan
    except ImportError as e:
        raise VulkanUnavailable(f"Vulkan: Python package `vulkan` missing ({e}); run "
                                "scripts/install_vulkan_cpu.sh or `pip install vulkan`") from None
    except OSError as e:
        raise VulkanUnavailable(f"Vulkan: no loader (libvulkan.so.1): {e}; run "
                                "scripts/install_vulkan_cpu.sh") from None
    return vulkan


@functools.cache
def _instance():
    vk = _vk()
    app = vk.VkApplicationInfo(pApplicationName="bankml", applicationVersion=0, pEngineName="bankml",
                               engineVersion=0, apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
    try:
        return vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
    except Exception as e:  # VkErrorIncompatibleDriver, VkErrorInitializationFailed, ...
        raise VulkanUnavailable(f"Vulkan: no driver ({type(e).__name__}); install a Vulkan ICD "
                                "(scripts/install_vulkan_cpu.sh for lavapipe) or set BANKML_GPU=off") from None


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    api: tuple[int, int, int]
    rte32: bool              # shaderRoundingModeRTEFloat32
    denorm_preserve32: bool  # shaderDenormPreserveFloat32

    def __str__(self) -> str:
        return (f"[{self.index}] {self.name} (Vulkan {'.'.join(map(str, self.api))}, "
                f"f32 RTE {'yes' if self.rte32 else 'no'}, "
                f"f32 DenormPreserve {'yes' if self.denorm_preserve32 else 'no'})")


def _physical() -> list:
    vk, inst = _vk(), _instance()
    try:
        pds = vk.vkEnumeratePhysicalDevices(inst)
    except Exception as e:
        raise VulkanUnavailable(f"Vulkan: cannot enumerate devices ({type(e).__name__})") from None
    if not pds:
        raise VulkanUnavailable("Vulkan: the loader found no device; install a driver "
                                "(scripts/install_vulkan_cpu.sh) or set BANKML_GPU=off")
    return list(pds)


def devices() -> list[DeviceInfo]:
    """Every Vulkan device the loader sees, with the float controls bankml cares about."""
    vk = _vk()
    out = []
    for i, pd in enumerate(_physical()):
        p = vk.vkGetPhysicalDeviceProperties(pd)
        fc = vk.VkPhysicalDeviceFloatControlsProperties()
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=fc))
        v = p.apiVersion
        out.append(DeviceInfo(i, vk.ffi.string(p.deviceName).decode() if not isinstance(p.deviceName, str)
                              else p.deviceName, (v >> 22, (v >> 12) & 0x3FF, v & 0xFFF),
                              bool(fc.shaderRoundingModeRTEFloat32), bool(fc.shaderDenormPreserveFloat32)))
    return out


class Device:
    """A logical device with one compute queue, a command pool and a fence."""

    def __init__(self, index: int):
        vk = self.vk = _vk()
        pds = _physical()
        if not 0 <= index < len(pds):
            raise VulkanUnavailable(f"Vulkan: no device {index} (have {len(pds)}); see BANKML_GPU")
        self.info = devices()[index]
        if self.info.api < (1, 2, 0):
            raise DeviceRefused(f"Vulkan device {self.info}: needs Vulkan 1.2 (SPIR-V 1.5)")
        self.pd = pds[index]
        fams = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.pd)
        qf = next((i for i, f in enumerate(fams) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), None)
        if qf is None:
            raise DeviceRefused(f"Vulkan device {self.info}: no compute queue")
        qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=qf, queueCount=1, pQueuePriorities=[1.0])
        # the portable kernels' exact sums need 64-bit integers: enabled where offered
        self.int64 = bool(vk.vkGetPhysicalDeviceFeatures(self.pd).shaderInt64)
        self.dev = vk.vkCreateDevice(self.pd, vk.VkDeviceCreateInfo(
            queueCreateInfoCount=1, pQueueCreateInfos=[qinfo],
            pEnabledFeatures=vk.VkPhysicalDeviceFeatures(shaderInt64=self.int64)), None)
        self.queue = vk.vkGetDeviceQueue(self.dev, qf, 0)
        self.pool = vk.vkCreateCommandPool(self.dev, vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=qf), None)
        self.fence = vk.vkCreateFence(self.dev, vk.VkFenceCreateInfo(), None)
        self.mem_props = vk.vkGetPhysicalDeviceMemoryProperties(self.pd)

    def __repr__(self) -> str:
        return f"Device({self.info})"

    def buffer(self, nbytes: int) -> "Buffer":
        return Buffer(self, nbytes)

    def _memory_type(self, bits: int) -> int:
        vk = self.vk
        want = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        types = [i for i in range(self.mem_props.memoryTypeCount) if bits >> i & 1
                 and self.mem_props.memoryTypes[i].propertyFlags & want == want]
        local = [i for i in types if self.mem_props.memoryTypes[i].propertyFlags
                 & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT]
        if not types:
            raise DeviceRefused(f"Vulkan device {self.info}: no host-visible coherent memory")
        return (local or types)[0]

    def submit(self, record) -> None:
        """Record one command buffer with record(cmd), submit it and wait."""
        vk = self.vk
        cmd = vk.vkAllocateCommandBuffers(self.dev, vk.VkCommandBufferAllocateInfo(
            commandPool=self.pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        record(cmd)
        vk.vkEndCommandBuffer(cmd)
        vk.vkResetFences(self.dev, 1, [self.fence])
        vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])],
                         self.fence)
        vk.vkWaitForFences(self.dev, 1, [self.fence], vk.VK_TRUE, 0xFFFFFFFFFFFFFFFF)
        vk.vkFreeCommandBuffers(self.dev, self.pool, 1, [cmd])


class Buffer:
    """A storage buffer in host-visible memory, persistently mapped."""

    def __init__(self, d: Device, nbytes: int):
        vk, self.d = d.vk, d
        self.size = max(4, -(-nbytes // 4) * 4)
        self.buf = vk.vkCreateBuffer(d.dev, vk.VkBufferCreateInfo(
            size=self.size, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(d.dev, self.buf)
        self.mem = vk.vkAllocateMemory(d.dev, vk.VkMemoryAllocateInfo(
            allocationSize=req.size, memoryTypeIndex=d._memory_type(req.memoryTypeBits)), None)
        vk.vkBindBufferMemory(d.dev, self.buf, self.mem, 0)
        self.mapped = vk.vkMapMemory(d.dev, self.mem, 0, self.size, 0)

    def write(self, data: bytes) -> None:
        if len(data) > self.size:
            raise BankmlError(f"Vulkan buffer of {self.size} bytes given {len(data)}")
        self.d.vk.ffi.memmove(self.mapped, data, len(data))

    def read(self, dtype, count: int) -> np.ndarray:
        return np.frombuffer(self.mapped, dtype, count).copy()

    def free(self) -> None:
        vk, dev = self.d.vk, self.d.dev
        vk.vkUnmapMemory(dev, self.mem)
        vk.vkDestroyBuffer(dev, self.buf, None)
        vk.vkFreeMemory(dev, self.mem, None)


class Q1Matvec:
    """y[r] = ggml_vec_dot_q1_0_q8_0(w row r, act) for every row, in one dispatch."""

    def __init__(self, d: Device, variant: str = "exact"):
        self.d = d
        self.words = q1_matvec.emit(d.info.rte32, d.info.denorm_preserve32, variant)
        self.pipeline = Pipeline(d, self.words, n_buffers=3, push_words=2)
        self.rows = self.k = 0
        self.bufs: list[Buffer] = []

    def close(self) -> None:
        """Free the buffers and the pipeline now (else they live as long as the device)."""
        for b in self.bufs:
            b.free()
        self.bufs = []
        self.pipeline.close()

    def upload(self, w_raw: bytes, rows: int, k: int) -> "Q1Matvec":
        """Raw Q1_0 weight rows (rows x k, k % 128 == 0), as stored in the GGUF."""
        if k % 128 or len(w_raw) != rows * (k // 128) * q1_matvec.Q1_BYTES:
            raise BankmlError(f"Q1_0 matvec: {len(w_raw)} bytes are not {rows} rows of {k} (k % 128 == 0)")
        self.rows, self.k = rows, k
        self.w = self.d.buffer(len(w_raw))
        self.w.write(bytes(w_raw))
        self.a = self.d.buffer(k // 32 * q1_matvec.Q8_BYTES)
        self.y = self.d.buffer(4 * rows)
        for b in self.bufs:
            b.free()
        self.bufs = [self.w, self.a, self.y]
        self.pipeline.bind(self.bufs)
        return self

    def run(self, act_raw: bytes) -> np.ndarray:
        """One q8_0 activation row (k/32 blocks of 34 bytes) -> np.float32[rows]."""
        need = self.k // 32 * q1_matvec.Q8_BYTES
        if not self.rows or len(act_raw) != need:
            raise BankmlError(f"Q1_0 matvec: activation of {len(act_raw)} bytes, want {need} (upload first)")
        self.a.write(bytes(act_raw))
        self.pipeline.dispatch([self.rows, self.k // 128], -(-self.rows // q1_matvec.ROWS_PER_GROUP))
        return self.y.read(np.float32, self.rows)


@functools.cache
def open_device(index: int) -> Device:
    """The device at this index, opened once per process."""
    return Device(index)


class Pipeline:
    """One compute module of `n_buffers` storage buffers (bindings 0..n-1) and `push_words` u32
    push constants: its pipeline and descriptor set; bind() points the bindings at buffers,
    dispatch() runs it once."""

    def __init__(self, d: Device, words, n_buffers: int, push_words: int):
        vk, self.d = d.vk, d
        self.n, self.push_words = n_buffers, push_words
        code = np.array(words, "<u4").tobytes()
        self.module = vk.vkCreateShaderModule(d.dev, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None)
        binds = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                 descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                 for i in range(n_buffers)]
        self.dsl = vk.vkCreateDescriptorSetLayout(d.dev, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=n_buffers, pBindings=binds), None)
        pcr = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=4 * push_words)
        self.layout = vk.vkCreatePipelineLayout(d.dev, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[self.dsl], pushConstantRangeCount=1, pPushConstantRanges=[pcr]), None)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.module,
                                                   pName="main")
        self.pipeline = vk.vkCreateComputePipelines(d.dev, vk.VK_NULL_HANDLE, 1, [
            vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)], None)[0]
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=n_buffers)
        self.dpool = vk.vkCreateDescriptorPool(d.dev, vk.VkDescriptorPoolCreateInfo(
            maxSets=1, poolSizeCount=1, pPoolSizes=[size]), None)
        self.dset = vk.vkAllocateDescriptorSets(d.dev, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self.dpool, descriptorSetCount=1, pSetLayouts=[self.dsl]))[0]

    def bind(self, bufs: list[Buffer]) -> None:
        """Binding i reads and writes bufs[i]."""
        vk = self.d.vk
        infos = [vk.VkDescriptorBufferInfo(buffer=b.buf, offset=0, range=b.size) for b in bufs]
        writes = [vk.VkWriteDescriptorSet(dstSet=self.dset, dstBinding=i, descriptorCount=1,
                                          descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                          pBufferInfo=[infos[i]]) for i in range(self.n)]
        vk.vkUpdateDescriptorSets(self.d.dev, self.n, writes, 0, None)

    def dispatch(self, push: list[int], groups: int | tuple[int, int]) -> None:
        """One dispatch of groups workgroups in x, or (x, y), with these push constants; returns
        when the device is done."""
        vk = self.d.vk
        consts = vk.ffi.new(f"uint32_t[{max(1, self.push_words)}]", [p & 0xFFFFFFFF for p in push])
        gx, gy = groups if isinstance(groups, tuple) else (groups, 1)

        def record(cmd):
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.pipeline)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.layout, 0, 1,
                                       [self.dset], 0, None)
            vk.vkCmdPushConstants(cmd, self.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, 4 * self.push_words, consts)
            vk.vkCmdDispatch(cmd, gx, gy, 1)
        self.d.submit(record)

    def close(self) -> None:
        vk, dev = self.d.vk, self.d.dev
        vk.vkDestroyDescriptorPool(dev, self.dpool, None)
        vk.vkDestroyPipeline(dev, self.pipeline, None)
        vk.vkDestroyPipelineLayout(dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.dsl, None)
        vk.vkDestroyShaderModule(dev, self.module, None)


class Program(Pipeline):
    """Any compute module of `n_buffers` storage buffers (bindings 0..n-1) and `push_words` u32
    push constants: each run uploads its inputs, dispatches once and reads back what it asks for.

        p = Program(dev, words, n_buffers=4, push_words=3)
        out = p.run([w, codes, info, 4 * rows], [rows, nsub, row_bytes], groups, {3: (np.float32, rows)})

    An int in `buffers` is a buffer of that many bytes the kernel writes (output or scratch).
    Buffers are made and freed per run (the portable kernels' tests; Q1Matvec keeps its weights).
    """

    def run(self, buffers: list, push: list[int], groups: int | tuple[int, int], read: dict[int, tuple]
            ) -> dict[int, np.ndarray]:
        """groups: workgroups in x, or (x, y)."""
        if len(buffers) != self.n or len(push) != self.push_words:
            raise BankmlError(f"Vulkan program of {self.n} buffers and {self.push_words} push words "
                              f"given {len(buffers)} and {len(push)}")
        bufs = []
        try:
            for b in buffers:
                buf = self.d.buffer(b if isinstance(b, int) else len(b))
                bufs.append(buf)
                if not isinstance(b, int):
                    buf.write(bytes(b))
            self.bind(bufs)
            self.dispatch(push, groups)
            return {i: bufs[i].read(dt, count) for i, (dt, count) in read.items()}
        finally:
            for b in bufs:
                b.free()
