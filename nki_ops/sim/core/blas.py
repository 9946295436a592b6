"""Products of the Tensor engine's small tiles on one BLAS thread.

A simulated matmul is at most 128 x 128 x 4096; at that size a multithreaded BLAS only loses, and on a
machine whose cores are busy its spinning workers made each product about 300 times slower (9 ms instead
of 26 us for 128 x 64 x 128 on two shared cores). The limit holds only while the product runs, so NumPy
code around the simulator keeps its threads.
"""

from __future__ import annotations

import threading

import numpy as np

_lock = threading.Lock()
_blas = None


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` with the BLAS thread pools limited to one thread."""
    global _blas
    with _lock:  # the limit is process-wide: two kernel threads must not restore each other's setting
        if _blas is None:
            from threadpoolctl import ThreadpoolController
            _blas = ThreadpoolController().select(user_api="blas")
        with _blas.limit(limits=1):
            return a @ b
