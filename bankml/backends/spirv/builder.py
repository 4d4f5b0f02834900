"""A small SPIR-V module builder: ids, types, constants, decorations, instructions as word lists.

No GLSL compiler: bankml writes the words itself, so every float instruction is one it chose.
Every OpFAdd/OpFSub/OpFMul made through `Function` is decorated NoContraction (a driver may not
fuse it into an FMA). Control flow is structured (OpLoopMerge/OpSelectionMerge) through context
managers; loop-carried values live in Function variables.

    m = Module()
    f = m.function("main")
    i = f.load(m.u32, var)
    m.words()            # list[int], ready for vkCreateShaderModule or spirv-val
"""
from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import tempfile

from bankml.errors import BankmlError

MAGIC = 0x07230203
VERSION_1_5 = 0x00010500

# opcodes (SPIR-V 1.5 unified grammar; checked against spirv-as)
OP = dict(Name=5, MemberName=6, Extension=10, MemoryModel=14, EntryPoint=15, ExecutionMode=16,
          Capability=17, TypeVoid=19, TypeBool=20, TypeInt=21, TypeFloat=22, TypeVector=23,
          TypeArray=28, TypeRuntimeArray=29, TypeStruct=30, TypePointer=32, TypeFunction=33,
          Constant=43, Function=54, FunctionEnd=56, Variable=59, Load=61, Store=62, AccessChain=65,
          Decorate=71, MemberDecorate=72, CompositeExtract=81, ConvertSToF=111, Bitcast=124,
          SNegate=126, IAdd=128, FAdd=129, ISub=130, FSub=131, IMul=132, FMul=133,
          LogicalAnd=167, Select=169, IEqual=170, INotEqual=171, UGreaterThanEqual=174,
          ULessThan=176, ShiftRightLogical=194, ShiftLeftLogical=196, BitwiseOr=197,
          BitwiseXor=198, BitwiseAnd=199, BitFieldSExtract=202, BitFieldUExtract=203,
          ControlBarrier=224, LoopMerge=246, SelectionMerge=247, Label=248, Branch=249,
          BranchConditional=250, Return=253,
          # used by the portable kernels (portable_*.py)
          ConvertFToS=110, UConvert=113, UDiv=134, UMod=137, ShiftRightArithmetic=195, LogicalOr=166,
          LogicalNot=168, UGreaterThan=172, SGreaterThan=173, SLessThan=177, ULessThanEqual=178,
          FOrdLessThan=184, FOrdGreaterThan=186)
# enums
CAP_SHADER, CAP_INT64, CAP_DENORM_PRESERVE, CAP_RTE = 1, 11, 4464, 4467
EXEC_GLCOMPUTE, MODE_LOCAL_SIZE, MODE_DENORM_PRESERVE, MODE_RTE = 5, 17, 4459, 4462
SC_INPUT, SC_WORKGROUP, SC_FUNCTION, SC_PUSH_CONSTANT, SC_STORAGE_BUFFER = 1, 4, 7, 9, 12
DEC_BLOCK, DEC_ARRAY_STRIDE, DEC_BUILTIN, DEC_NON_WRITABLE = 2, 6, 11, 24
DEC_BINDING, DEC_DESCRIPTOR_SET, DEC_OFFSET, DEC_NO_CONTRACTION = 33, 34, 35, 42
BUILTIN_LOCAL_ID, BUILTIN_GLOBAL_ID = 27, 28
SCOPE_WORKGROUP, SEM_ACQ_REL_WORKGROUP = 2, 0x8 | 0x100


def string_words(s: str) -> list[int]:
    """A literal string: UTF-8, NUL-terminated, padded to whole little-endian words."""
    b = s.encode() + b"\0"
    b += b"\0" * (-len(b) % 4)
    return list(struct.unpack(f"<{len(b) // 4}I", b))


def inst(op: str, *operands: int) -> list[int]:
    return [(len(operands) + 1) << 16 | OP[op], *operands]


class Module:
    """One SPIR-V module, built section by section in the order the spec requires."""

    def __init__(self):
        self.bound = 1
        self.caps: list[int] = []
        self.exts: list[str] = []
        self.entry: list[int] = []
        self.modes: list[list[int]] = []
        self.debug: list[list[int]] = []
        self.annotations: list[list[int]] = []
        self.globals: list[list[int]] = []       # types, constants, global variables
        self.functions: list[list[int]] = []
        self.interface: list[int] = []
        self._types: dict[tuple, int] = {}
        self._consts: dict[tuple, int] = {}
        self.void = self.type("TypeVoid")
        self.bool = self.type("TypeBool")
        self.u32 = self.type("TypeInt", 32, 0)
        self.i32 = self.type("TypeInt", 32, 1)
        self.f32 = self.type("TypeFloat", 32)

    def id(self, name: str | None = None) -> int:
        i, self.bound = self.bound, self.bound + 1
        if name:
            self.debug.append(inst("Name", i, *string_words(name)))
        return i

    def type(self, op: str, *operands: int) -> int:
        """A type, made once per (op, operands)."""
        key = (op, operands)
        if key not in self._types:
            t = self._types[key] = self.id()
            self.globals.append(inst(op, t, *operands))
        return self._types[key]

    def pointer(self, storage: int, t: int) -> int:
        return self.type("TypePointer", storage, t)

    def struct(self, name: str, members: list[int], block: bool = True) -> int:
        """A struct (not shared with other structs) with std430 offsets for 4-byte members."""
        t = self.id(name)
        self.globals.append(inst("TypeStruct", t, *members))
        for k in range(len(members)):
            self.annotations.append(inst("MemberDecorate", t, k, DEC_OFFSET, 4 * k))
        if block:
            self.decorate(t, DEC_BLOCK)
        return t

    def const(self, t: int, value: int | float) -> int:
        """A 32-bit scalar constant; floats are stored by their f32 bits."""
        bits = struct.unpack("<I", struct.pack("<f", value))[0] if t == self.f32 else value & 0xFFFFFFFF
        key = (t, bits)
        if key not in self._consts:
            c = self._consts[key] = self.id()
            self.globals.append(inst("Constant", t, c, bits))
        return self._consts[key]

    def variable(self, storage: int, t: int, name: str) -> int:
        """A global variable; it joins the entry point's interface (SPIR-V >= 1.4 lists them all)."""
        v = self.id(name)
        self.globals.append(inst("Variable", self.pointer(storage, t), v, storage))
        self.interface.append(v)
        return v

    def decorate(self, target: int, *operands: int) -> None:
        self.annotations.append(inst("Decorate", target, *operands))

    def words(self) -> list[int]:
        out = [MAGIC, VERSION_1_5, 0, self.bound, 0]
        for c in self.caps:
            out += inst("Capability", c)
        for e in self.exts:
            out += inst("Extension", *string_words(e))
        out += inst("MemoryModel", 0, 1)  # Logical GLSL450
        out += self.entry
        for section in (self.modes, self.debug, self.annotations, self.globals, self.functions):
            for ws in section:
                out += ws
        return out

    def function(self, name: str, local_size: tuple[int, int, int]) -> "Function":
        """The compute entry point `name`; finish it with Function.end()."""
        return Function(self, name, local_size)


class Function:
    """The body of one compute entry point, written block by block."""

    def __init__(self, m: Module, name: str, local_size: tuple[int, int, int]):
        self.m = m
        self.fid = m.id(name)
        self.name = name
        m.modes.append(inst("ExecutionMode", self.fid, MODE_LOCAL_SIZE, *local_size))
        self.head = [inst("Function", m.void, self.fid, 0, m.type("TypeFunction", m.void)),
                     inst("Label", m.id())]
        self.vars: list[list[int]] = []   # Function variables: must open the first block
        self.body: list[list[int]] = []

    # ---- values
    def op(self, op: str, t: int, *args: int, name: str | None = None) -> int:
        r = self.m.id(name)
        self.body.append(inst(op, t, r, *args))
        if op in ("FAdd", "FSub", "FMul"):
            self.m.decorate(r, DEC_NO_CONTRACTION)
        return r

    def fadd(self, a, b, name=None):
        return self.op("FAdd", self.m.f32, a, b, name=name)

    def fsub(self, a, b, name=None):
        return self.op("FSub", self.m.f32, a, b, name=name)

    def fmul(self, a, b, name=None):
        return self.op("FMul", self.m.f32, a, b, name=name)

    def u(self, op: str, *args, name=None) -> int:
        """An integer op on u32 values (IAdd, BitwiseAnd, ShiftRightLogical, ...)."""
        return self.op(op, self.m.u32, *args, name=name)

    def cmp(self, op: str, a, b, name=None) -> int:
        return self.op(op, self.m.bool, a, b, name=name)

    def select(self, t, c, a, b, name=None) -> int:
        return self.op("Select", t, c, a, b, name=name)

    def bitcast(self, t, a, name=None) -> int:
        return self.op("Bitcast", t, a, name=name)

    def load(self, t: int, ptr: int, name=None) -> int:
        return self.op("Load", t, ptr, name=name)

    def store(self, ptr: int, value: int) -> None:
        self.body.append(inst("Store", ptr, value))

    def chain(self, storage: int, t: int, base: int, *idx: int) -> int:
        return self.op("AccessChain", self.m.pointer(storage, t), base, *idx)

    def local(self, t: int, name: str, init: int | None = None) -> int:
        """A Function variable (declared in the first block), optionally stored now."""
        v = self.m.id(name)
        self.vars.append(inst("Variable", self.m.pointer(SC_FUNCTION, t), v, SC_FUNCTION))
        if init is not None:
            self.store(v, init)
        return v

    def barrier(self) -> None:
        s = self.m.const(self.m.u32, SCOPE_WORKGROUP)
        self.body.append(inst("ControlBarrier", s, s, self.m.const(self.m.u32, SEM_ACQ_REL_WORKGROUP)))

    # ---- structured control flow
    def _label(self, name: str) -> int:
        return self.m.id(name)

    def _begin(self, label: int) -> None:
        self.body.append(inst("Label", label))

    @contextlib.contextmanager
    def loop(self, n: int, name: str):
        """for (i = 0; i < n; i++) { body }; yields i (a u32 value, loaded in the body)."""
        m = self.m
        ivar = self.local(m.u32, f"{name}.i", m.const(m.u32, 0))
        header, check, body, cont, merge = (self._label(f"{name}.{s}")
                                            for s in ("header", "check", "body", "continue", "merge"))
        self.body.append(inst("Branch", header))
        self._begin(header)
        self.body.append(inst("LoopMerge", merge, cont, 0))
        self.body.append(inst("Branch", check))
        self._begin(check)
        i = self.load(m.u32, ivar, name=f"{name}.i")
        self.body.append(inst("BranchConditional", self.cmp("ULessThan", i, n), body, merge))
        self._begin(body)
        yield i
        self.body.append(inst("Branch", cont))
        self._begin(cont)
        self.store(ivar, self.u("IAdd", self.load(m.u32, ivar), m.const(m.u32, 1)))
        self.body.append(inst("Branch", header))
        self._begin(merge)

    @contextlib.contextmanager
    def if_then(self, cond: int, name: str):
        then, merge = self._label(f"{name}.then"), self._label(f"{name}.merge")
        self.body.append(inst("SelectionMerge", merge, 0))
        self.body.append(inst("BranchConditional", cond, then, merge))
        self._begin(then)
        yield
        self.body.append(inst("Branch", merge))
        self._begin(merge)

    def end(self, modes: tuple[list[int], ...] = ()) -> None:
        """Close the function and register it as the GLCompute entry point."""
        m = self.m
        self.body.append(inst("Return"))
        words: list[int] = []
        for ws in self.head[:2] + self.vars + self.body:
            words += ws
        m.functions.append(words + inst("FunctionEnd"))
        m.entry = inst("EntryPoint", EXEC_GLCOMPUTE, self.fid, *string_words(self.name), *m.interface)


# ---- SPIRV-Tools (spirv-val, spirv-dis)
class SpirvToolsMissing(BankmlError):
    """spirv-val/spirv-dis are not installed."""


def _tool(name: str, words: list[int], *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.spv")
        with open(path, "wb") as fh:
            fh.write(struct.pack(f"<{len(words)}I", *words))
        try:
            return subprocess.run([name, *args, path], capture_output=True, text=True)
        except FileNotFoundError:
            raise SpirvToolsMissing(f"{name} not found: install spirv-tools "
                                    "(scripts/install_vulkan_cpu.sh)") from None


def validate(words: list[int], target_env: str = "vulkan1.2") -> None:
    """Run spirv-val; raise BankmlError with its message if the module is invalid."""
    p = _tool("spirv-val", words, "--target-env", target_env)
    if p.returncode != 0:
        raise BankmlError(f"spirv-val rejects the module (a bankml bug): {(p.stderr or p.stdout).strip()}")


def disassemble(words: list[int]) -> str:
    """The module as spirv-dis text (for `bankml ir --spirv` and BANKML_DEBUG=4)."""
    p = _tool("spirv-dis", words, "--no-color")
    if p.returncode != 0:
        raise BankmlError(f"spirv-dis failed: {p.stderr.strip()}")
    return p.stdout
