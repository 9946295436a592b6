"""Moving whole tensors between HBM and SBUF in current-API test kernels, and choosing their target."""

from __future__ import annotations

from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa


def load(src):
    tile = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    return tile


def store(tile):
    out = nl.ndarray(tile.shape, dtype=tile.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out


def on(target: str, kernel):
    """``kernel`` compiled for ``target`` (``nki.jit(platform_target=...)``)."""
    return nki.jit(kernel, platform_target=target)
