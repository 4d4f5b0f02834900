"""The portable profile's kernels (docs/PORTABLE.md): bit for bit the numpy definition in
bankml/profiles/portable/. Importing this package registers them (profile "portable")."""
from bankml.backends.llvm.portable import attention, coded, matmul, ops, per_block, recurrent, rows  # noqa: F401
