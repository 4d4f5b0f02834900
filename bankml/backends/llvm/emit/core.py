"""Types, intrinsics and small emit helpers shared by the llvm kernels.

Types are made once here (numba's cgutils style). FMA is always explicit (`fma`), never a
fast-math flag, so fmul + fadd round twice as ggml's unfused steps do.
"""
from __future__ import annotations

from contextlib import contextmanager

from llvmlite import ir

from bankml.ir.dims import DIM_SLOTS, Dim

i1, i8, i16, i32, i64 = (ir.IntType(b) for b in (1, 8, 16, 32, 64))
f16, f32, f64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
void = ir.VoidType()
i8p = i8.as_pointer()
v8f32 = ir.VectorType(f32, 8)
KERNEL_ARG = len(DIM_SLOTS)        # dims[KERNEL_ARG]: the call's kernel argument (kernel_arg), after the sizes


def new_function(m: ir.Module, name: str, ftype: ir.FunctionType) -> tuple[ir.Function, ir.IRBuilder]:
    fn = ir.Function(m, ftype, name=name)
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def intrinsic(m: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """Declare (once) an LLVM intrinsic or libm function as a plain function; llvmlite's
    declare_intrinsic does not take vector types."""
    if name in m.globals:
        return m.globals[name]
    return ir.Function(m, ir.FunctionType(ret, args), name=name)


def fma(b: ir.IRBuilder, x, y, z):
    """x*y+z rounded once, lane by lane: llvm.fma.f32 / .f64 / .v{n}f32 / .v{n}f64."""
    t = x.type
    el = "f64" if (t.element if isinstance(t, ir.VectorType) else t) == f64 else "f32"
    name = f"llvm.fma.v{t.count}{el}" if isinstance(t, ir.VectorType) else f"llvm.fma.{el}"
    return b.call(intrinsic(b.module, name, t, [t, t, t]), [x, y, z])


def opaque(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x through an empty inline asm: the same value, which LLVM cannot see is a constant (a loop
    up to it is not unrolled in full, where that only costs compile time)."""
    return b.call(ir.InlineAsm(ir.FunctionType(x.type, [x.type]), "", "=r,0"), [x])


def typed(b: ir.IRBuilder, p, t: ir.Type):
    return b.bitcast(p, t.as_pointer())


class Var:
    """A mutable local: an alloca in the entry block (O3's mem2reg turns it into SSA values)."""

    def __init__(self, b: ir.IRBuilder, value, name: str):
        with b.goto_entry_block():
            self.ptr = b.alloca(value.type, name=name)
        self.b = b
        b.store(value, self.ptr)

    def get(self):
        return self.b.load(self.ptr)

    def set(self, v) -> None:
        self.b.store(v, self.ptr)


@contextmanager
def for_range(b: ir.IRBuilder, start, stop, step=1, name: str = "i"):
    """for (i = start; i < stop; i += step) — yields i (i64) inside the body."""
    start = start if isinstance(start, ir.Value) else i64(start)
    stop = stop if isinstance(stop, ir.Value) else i64(stop)
    pre = b.block
    cond = b.append_basic_block(f"{name}.cond")
    body = b.append_basic_block(f"{name}.body")
    end = b.append_basic_block(f"{name}.end")
    b.branch(cond)
    b.position_at_end(cond)
    phi = b.phi(i64, name=name)
    phi.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", phi, stop), body, end)
    b.position_at_end(body)
    yield phi
    nxt = b.add(phi, i64(step), name=f"{name}.next")
    phi.add_incoming(nxt, b.block)
    b.branch(cond)
    b.position_at_end(end)


def ceil_div(b: ir.IRBuilder, x, y, name: str = "") -> ir.Value:
    """ceil(x / y) of positive i64 values."""
    return b.sdiv(b.add(x, b.sub(y, i64(1))), y, name=name)


def smin(b: ir.IRBuilder, x, y) -> ir.Value:
    """The smaller of two i64 values."""
    return b.select(b.icmp_signed("<", x, y), x, y)


def thread_range(b: ir.IRBuilder, n_items, ith, nth):
    """[lo, hi) of n_items for thread ith of nth: contiguous, ceil-sized chunks."""
    n_items = n_items if isinstance(n_items, ir.Value) else i64(n_items)
    per = ceil_div(b, n_items, nth)
    lo = b.mul(per, ith)
    hi = b.add(lo, per)
    return smin(b, lo, n_items), smin(b, hi, n_items)


def dim(b: ir.IRBuilder, dims, d) -> ir.Value:
    """A size as i64: a number as a constant, a Dim read from this call's dims vector."""
    if isinstance(d, Dim):
        return b.load(b.gep(dims, [i64(d.slot)]), name=d.name)
    return d if isinstance(d, ir.Value) else i64(d)


def size(b: ir.IRBuilder, dims, shape) -> ir.Value:
    """The product of a shape's sizes as i64 (a constant when none is symbolic)."""
    const, out = 1, None
    for d in shape:
        if isinstance(d, Dim):
            v = dim(b, dims, d)
            out = v if out is None else b.mul(out, v)
        else:
            const *= d
    if out is None:
        return i64(const)
    return out if const == 1 else b.mul(out, i64(const))


def prefetch(b: ir.IRBuilder, p: ir.Value, locality: int) -> None:
    """Prefetch the cache line at p (i8*) for reading (llvm.prefetch: locality 0-3, data)."""
    fn = intrinsic(b.module, "llvm.prefetch.p0i8", void, [i8p, i32, i32, i32])
    b.call(fn, [p, i32(0), i32(locality), i32(1)])


def prefetch_lines(b: ir.IRBuilder, base: ir.Value, start: ir.Value, nbytes: int, locality: int) -> None:
    """Prefetch the cache lines of base[start : start + nbytes] (base i8*), one per 64 bytes."""
    for o in range(0, nbytes, 64):
        prefetch(b, b.gep(base, [b.add(start, i64(o))]), locality)


def kernel_arg(b: ir.IRBuilder, dims) -> ir.Value:
    """This call's kernel argument (registry.kernel_arg: a size the kernel takes at run time, so
    that kernels that differ only in it are one IR text, compiled once)."""
    return b.load(b.gep(dims, [i64(KERNEL_ARG)]), name="kernel_arg")


def llama_threads(b: ir.IRBuilder, dims) -> ir.Value:
    return b.load(b.gep(dims, [i64(DIM_SLOTS.index("llama_threads"))]), name="llama_threads")
