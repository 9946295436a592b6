"""Explicitly placed tensors of the current ``nki`` API (``nl.ndarray(..., address=(partition, byte))``),
checked as the legacy front end checks direct allocation: the range must lie in the target's partition,
and a tensor read after another tensor wrote overlapping addresses is an error naming both allocation
sites; reusing addresses after the first tensor's last use is fine."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim import CapacityError
from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation

X = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)  # 256 bytes per partition


def _line(marker: str) -> int:
    source = open(__file__).read().splitlines()
    return next(i for i, text in enumerate(source, 1) if text.rstrip().endswith(f"# {marker}"))


def both_live_on_overlapping_bytes(x):
    a = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 0))  # line A
    nisa.dma_copy(dst=a, src=x)
    b = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 128))  # line B
    nisa.memset(dst=b, value=1.0)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a)  # line READ
    return out


def test_a_tensor_read_after_an_overlapping_one_was_written_names_both_sites():
    with pytest.raises(CapacityError) as error:
        nki.jit(both_live_on_overlapping_bytes)(X)
    message = str(error.value)
    assert message.startswith(f"{__file__}:{_line('line READ')}: ")
    assert f"test_current_addresses.py:{_line('line A')}, bytes [0, 256) partitions [0, 128)" in message
    assert f"test_current_addresses.py:{_line('line B')}, bytes [128, 384) partitions [0, 128)" in message
    assert "overwrote its addresses" in message


def reuse_after_last_use(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 0))
    nisa.dma_copy(dst=a, src=x)
    doubled = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 256))
    nisa.tensor_scalar(dst=doubled, data=a, op0=nl.multiply, operand0=2.0)  # a's last use
    b = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 0))  # a's bytes again
    nisa.tensor_scalar(dst=b, data=doubled, op0=nl.add, operand0=1.0)
    nisa.dma_copy(dst=out, src=b)
    return out


def test_addresses_reused_after_the_first_tensors_last_use_are_accepted():
    np.testing.assert_array_equal(nki.jit(reuse_after_last_use)(X), X * 2 + 1)


def reuse_in_a_loop(x):
    # One tensor per iteration at the same address, each dead before the next one is written.
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in range(4):
        t = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf, address=(0, 1024))
        nisa.dma_copy(dst=t, src=x[:, i * 16:(i + 1) * 16])
        nisa.dma_copy(dst=out[:, i * 16:(i + 1) * 16], src=t)
    return out


def test_one_address_reused_by_every_iteration_of_a_loop_is_accepted():
    np.testing.assert_array_equal(nki.jit(reuse_in_a_loop)(X), X)


def disjoint_partitions(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    top = nl.ndarray((64, 64), nl.float32, buffer=nl.sbuf, address=(0, 0))
    bottom = nl.ndarray((64, 64), nl.float32, buffer=nl.sbuf, address=(64, 0))  # same bytes, other partitions
    nisa.dma_copy(dst=top, src=x[0:64, :])
    nisa.dma_copy(dst=bottom, src=x[64:128, :])
    nisa.dma_copy(dst=out[0:64, :], src=top)
    nisa.dma_copy(dst=out[64:128, :], src=bottom)
    return out


def test_same_bytes_on_disjoint_partitions_do_not_overlap():
    np.testing.assert_array_equal(nki.jit(disjoint_partitions)(X), X)


def psum_bank_shared(x):
    out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
    sb = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=x)
    first = nl.ndarray((128, 64), nl.float32, buffer=nl.psum, address=(0, 2 * 2048))  # line P1
    second = nl.ndarray((128, 64), nl.float32, buffer=nl.psum, address=(0, 2 * 2048))  # line P2
    nisa.tensor_copy(dst=first, src=sb)
    nisa.tensor_copy(dst=second, src=sb)
    res = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=first)  # line PREAD
    nisa.dma_copy(dst=out, src=res)
    return out


def test_two_live_psum_tensors_in_one_bank_are_reported_with_the_bank():
    with pytest.raises(CapacityError) as error:
        nki.jit(psum_bank_shared)(X)
    message = str(error.value)
    assert message.startswith(f"{__file__}:{_line('line PREAD')}: ")
    assert f":{_line('line P1')}, bank 2 bytes [0, 256) partitions [0, 128)" in message
    assert f":{_line('line P2')}, bank 2 bytes [0, 256) partitions [0, 128)" in message


@pytest.mark.parametrize("target, start, ok", [("trn1", 192 * 1024 - 256, True), ("trn1", 192 * 1024 - 255, False),
                                               ("trn3", 256 * 1024 - 256, True)])
def test_sbuf_addresses_must_lie_in_the_targets_partition(target, start, ok):
    def kernel(x):
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, start))  # line RANGE
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    if ok:
        np.testing.assert_array_equal(nki.jit(kernel, platform_target=target)(X), X)
        return
    with pytest.raises(CapacityError, match=rf"test_current_addresses\.py:{_line('line RANGE')}: nl\.ndarray: "
                                            rf"tensor '.*' of shape \[128, 64\] at address \(0, {start}\) needs "
                                            rf"bytes \[{start}, {start + 256}\) of each partition; SBUF partitions "
                                            rf"have 196608 bytes on trn1"):
        nki.jit(kernel, platform_target=target)(X)


def test_partition_ranges_beyond_128_are_refused():
    def kernel(x):
        t = nl.ndarray((64, 64), nl.float32, buffer=nl.sbuf, address=(96, 0))  # line PART
        nisa.dma_copy(dst=t, src=x[0:64, :])
        return x

    with pytest.raises(CapacityError, match=rf"addresses\.py:{_line('line PART')}: .*needs partitions \[96, 160\); "
                                            rf"there are 128"):
        nki.jit(kernel)(X)


def test_psum_addresses_beyond_its_16_kib_are_refused():
    def kernel(x):
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.psum, address=(0, 8 * 2048))
        nisa.memset(dst=t, value=0.0)
        return x

    with pytest.raises(CapacityError, match=r"bytes \[16384, 16640\) of each partition; PSUM partitions have 16384"):
        nki.jit(kernel)(X)
