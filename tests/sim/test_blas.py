"""The simulator multiplies Tensor-engine tiles on one BLAS thread (a threaded BLAS made each small
product ~300x slower on busy cores) and gives the NumPy product's values; a launch holds the limit while
its programs run."""

from __future__ import annotations

import threading

import numpy as np
from threadpoolctl import threadpool_info

from nki_ops.sim import nki, nl, simulate
from nki_ops.sim.core import blas
from nki_ops.sim.frontends import current


def blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


class _Recording(np.ndarray):
    """An array whose ``@`` notes the BLAS thread counts in force when it runs."""
    seen: list[int] = []

    def __matmul__(self, other):
        _Recording.seen = blas_threads()
        return np.asarray(self) @ np.asarray(other)


def test_products_run_on_one_blas_thread_and_restore_the_pool():
    before = blas_threads()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((4, 2), np.float32)
    product = blas.matmul(a.view(_Recording), b)
    np.testing.assert_array_equal(product, a @ b)
    assert _Recording.seen and set(_Recording.seen) == {1}
    assert blas_threads() == before


def test_a_limit_in_force_holds_until_the_block_that_set_it_ends():
    before = blas_threads()
    entered, leave = threading.Event(), threading.Event()

    def product_in_another_thread():
        with blas.one_thread():  # under the limit in force: ends without restoring it
            entered.set()
            leave.wait()

    with blas.one_thread():
        assert set(blas_threads()) == {1}
        other = threading.Thread(target=product_in_another_thread)
        other.start()
        entered.wait()
        leave.set()
        other.join()
        assert set(blas_threads()) == {1}
        np.testing.assert_array_equal(blas.matmul(np.eye(3), np.ones((3, 2))), np.ones((3, 2)))
        assert set(blas_threads()) == {1}
    assert blas_threads() == before


def test_a_kernel_runs_on_one_blas_thread_and_the_launch_restores_the_pool():
    before, seen = blas_threads(), []

    @nki.jit
    def kernel(a):
        seen.append(blas_threads())
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.matmul(nl.load(a), nl.load(a), transpose_x=True))
        return out

    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(simulate(kernel, a), a.T @ a)
    assert seen and set(seen[0]) == {1}
    assert blas_threads() == before


def test_lnc2_programs_run_on_one_blas_thread():
    """The programs of an LNC2 launch run in threads of their own, whose limits threadpoolctl may ignore:
    they run under the launch's."""
    seen = []

    def kernel(a):
        seen.append(blas_threads())
        out = current.language.ndarray(a.shape, dtype=a.dtype, buffer=current.language.shared_hbm)
        if current.language.program_id(0) == 0:
            tile = current.language.ndarray(a.shape, dtype=a.dtype, buffer=current.language.sbuf)
            current.isa.dma_copy(dst=tile, src=a)
            current.isa.dma_copy(dst=out, src=tile)
        return out

    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(current.jit(kernel, platform_target="trn2")[2](a), a)
    assert len(seen) == 2 and all(set(threads) == {1} for threads in seen)
