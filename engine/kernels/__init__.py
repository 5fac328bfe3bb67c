"""Fused kernels: one numpy reference and one CUDA version (CuPy RawKernel / ElementwiseKernel)
of the same math, with the same signature, side by side in one module per kernel family.

Ops call the family's public function; it runs the CUDA version when its arrays are CuPy arrays
and the numpy reference otherwise. The references are what the CUDA versions are tested against
(tests/test_fused_kernels*.py); on a machine without a GPU the CUDA launchers still run, through
the strict CuPy double in tests/cupy_double, whose kernel emulators compute with the references.
"""
