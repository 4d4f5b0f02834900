"""The portable profile's kernels as SPIR-V: the arithmetic pieces (emit), the kernels (kernels)
and their on-device check against the numpy spec (check)."""
