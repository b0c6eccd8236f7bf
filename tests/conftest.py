"""Test settings shared by every package (paths live in tests/paths.py, a plain module, because
every folder's conftest.py is a module named `conftest`): the BLAS this process multiplies with.

Ranks on Linux multiply with the host's OpenBLAS (cluster/blas.py): the single-process references
computed in this process use it too, one thread everywhere, since OpenBLAS's sums depend on its
thread count and logits are compared within 1e-4."""

import os

from cluster import blas

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
blas.use_in_this_process()
