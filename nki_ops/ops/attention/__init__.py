"""Scaled dot-product attention (grouped-query, causal, sliding window, softcap, variable lengths):
public API and backend registration."""

from __future__ import annotations

import torch

from ..._backends import resolve
from ..._checks import check_number, check_same_device, check_tensor
from .._define import define_op
from .nki_op import attention_nki
from .reference import attention_reference

__all__ = ["attention"]

MAX_HEAD_DIM = 128


def _demo_inputs():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(shape, generator=g) for shape in ((2, 4, 150, 32), (2, 2, 150, 32), (2, 2, 150, 32)))


@define_op("attention", torch=attention_reference, nki=attention_nki, demo=_demo_inputs, differentiable=True,
           benchmark="attention")
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              sliding_window: int | None = None, softcap: float | None = None, scale: float | None = None,
              seq_lens: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """``softmax(mask(softcap(scale * q @ k.T))) @ v`` per head -> ``[B, Hq, S, D]`` in q's dtype.

    ``q[B, Hq, S, D]``, ``k`` and ``v[B, Hkv, S_kv, D]`` with ``Hq % Hkv == 0`` (grouped-query: query head
    ``h`` reads key/value head ``h // (Hq // Hkv)``) and D up to 128. Query ``i`` sees key ``j`` when
    ``j <= i`` under ``causal`` (top-left aligned, as ``scaled_dot_product_attention``), when
    ``|i - j| < sliding_window``, and when ``j < seq_lens[b]``; rows ``i >= seq_lens[b]`` and rows that
    see no key give zeros. ``softcap`` turns the scores into ``softcap * tanh(scores / softcap)``;
    ``scale`` defaults to ``D ** -0.5``. Differentiable in q, k and v.
    """
    _check_inputs(q, k, v, causal, sliding_window, softcap, scale, seq_lens)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    softcap = None if softcap is None else float(softcap)
    impl = resolve("attention", backend, q.device, (q, k, v))
    return impl(q, k, v, causal, sliding_window, softcap, scale, seq_lens)


def _check_inputs(q, k, v, causal, sliding_window, softcap, scale, seq_lens) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor [B, H, S, D], got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape [B, Hkv, S_kv, D], got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"k and v must be [{q.shape[0]}, Hkv, S_kv, {q.shape[3]}] (q's batch and head size), "
                         f"got {tuple(k.shape)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"the query heads must be a multiple of the key/value heads, got Hq={q.shape[1]} and "
                         f"Hkv={k.shape[1]}")
    if not 1 <= q.shape[3] <= MAX_HEAD_DIM:
        raise ValueError(f"the head size D must be 1 to {MAX_HEAD_DIM}, got {q.shape[3]}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    check_same_device(q=q, k=k, v=v)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                       or sliding_window < 1):
        raise ValueError(f"sliding_window must be None or an int >= 1, got {sliding_window!r}")
    if softcap is not None:
        check_number("softcap", softcap, low=0.0)
        if softcap == 0:
            raise ValueError("softcap must be None or a number > 0, got 0")
    if scale is not None:
        check_number("scale", scale, low=0.0)
        if scale == 0:
            raise ValueError("scale must be None or a number > 0, got 0")
    if seq_lens is not None:
        _check_seq_lens(seq_lens, q, k)


def _check_seq_lens(seq_lens, q, k) -> None:
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() != 1 or seq_lens.shape[0] != q.shape[0] \
            or seq_lens.is_floating_point() or seq_lens.dtype == torch.bool:
        raise ValueError(f"seq_lens must be a 1-D integer tensor with one length per batch row ({q.shape[0]}), got "
                         f"{getattr(seq_lens, 'dtype', type(seq_lens).__name__)} of shape "
                         f"{tuple(getattr(seq_lens, 'shape', ()))}")
    check_same_device(q=q, seq_lens=seq_lens)
    # The values are data: checked in eager mode; a compiled graph does not stop to read them.
    if not torch.compiler.is_compiling() and seq_lens.numel() and \
            (int(seq_lens.min()) < 0 or int(seq_lens.max()) > k.shape[2]):
        raise ValueError(f"seq_lens must be in [0, S_kv={k.shape[2]}], got {seq_lens.tolist()}")
