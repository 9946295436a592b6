"""Products of the Tensor engine's small tiles on one BLAS thread.

A simulated matmul is at most 128 x 128 x 4096; at that size a multithreaded BLAS only loses, and on a
machine whose cores are busy its spinning workers made each product about 300 times slower (9 ms instead
of 26 us for 128 x 64 x 128 on two shared cores). One thread also keeps a product's values independent of
the pool's size: OpenBLAS's fp32 products on two threads round differently from one thread's (5-18% of
the elements of 128-row products on this machine differ in their last bits). A launch holds the limit
while its programs run (``one_thread``), as setting and restoring it cost 6-9 us a product, as much as a
1 x 128 x 512 product. NumPy code around the simulator keeps its threads.

The limit is process-wide, and threadpoolctl lets one thread change a pthreads OpenBLAS pool: the first
that set it, while it lives (the others' settings are ignored). So the thread that set the limit restores
it; a launch from another thread meanwhile runs under it, and on the pool's threads once it is lifted (as
does a launch from a thread threadpoolctl ignores): its products may then round differently. A launch's
programs (LNC2 runs them in threads of their own) run under their launching thread's limit.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

_lock = threading.Lock()
_pools = None  # the process's BLAS libraries, found once (5-9 ms)
_limiter = None  # the limit in force, restored by the ``one_thread`` that set it


@contextlib.contextmanager
def one_thread():
    """Limit the BLAS thread pools to one thread until this block ends, unless a limit is in force."""
    global _pools, _limiter
    with _lock:
        mine = _limiter is None
        if mine:
            if _pools is None:
                from threadpoolctl import ThreadpoolController
                _pools = ThreadpoolController().select(user_api="blas")
            _limiter = _pools.limit(limits=1)
    try:
        yield
    finally:
        if mine:
            with _lock:
                _limiter.restore_original_limits()
                _limiter = None


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` on one BLAS thread."""
    if _limiter is not None:  # a launch's
        return a @ b
    with one_thread():
        return a @ b
