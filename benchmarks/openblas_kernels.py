"""The OpenBLAS kernels our worker computed with, for a PyTorch peer to get the same.

Where OpenBLAS takes the CPU for a Prescott (a model it does not know), the
worker binary sets OPENBLAS_CORETYPE to the CPU's kernels and starts again
(kernels/openblas_core.h), and logs "CPU matrix products: OpenBLAS's NAME
kernels (OPENBLAS_CORETYPE)". Debian's PyTorch computes on the same
OpenBLAS, which would keep its Prescott kernels: a benchmark gives its
PyTorch processes the variable our worker used, as a user who knew would.
"""
import re

_LINE = re.compile(r"CPU matrix products: OpenBLAS's (\w+) kernels( \(OPENBLAS_CORETYPE\))?")


def coretype_from_log(text):
    """The OPENBLAS_CORETYPE a worker's log says it computed with; None where
    it kept OpenBLAS's own choice, or no worker logged its kernels."""
    found = _LINE.search(text)
    return found.group(1) if found and found.group(2) else None
