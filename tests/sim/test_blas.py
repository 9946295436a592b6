"""The simulator multiplies Tensor-engine tiles on one BLAS thread (a threaded BLAS made each small
product ~300x slower on busy cores) and gives the NumPy product's values."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info

from nki_ops.sim.core import blas


class _Recording(np.ndarray):
    """An array whose ``@`` notes the BLAS thread counts in force when it runs."""
    seen: list[int] = []

    def __matmul__(self, other):
        _Recording.seen = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
        return np.asarray(self) @ np.asarray(other)


def test_products_run_on_one_blas_thread_and_restore_the_pool():
    before = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((4, 2), np.float32)
    product = blas.matmul(a.view(_Recording), b)
    np.testing.assert_array_equal(product, a @ b)
    assert _Recording.seen and set(_Recording.seen) == {1}
    assert [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"] == before
