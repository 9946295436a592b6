"""Attention's tiling parameter, tuned per target on the cost model (``nki_ops.ops._tuned``).

The forward kernel's tiling choice is ``kv_block``, the keys per block of the online softmax (at most one
512-column PSUM bank of scores): narrower blocks mean more, shorter instructions and more rescaling of
the accumulator, and with a causal mask fewer masked scores. The studies cost each value at the
benchmark's causal workload, B=1, H=8, S=2,048, D=64 fp32, checking its values at B=1, H=2, S=300,
D=40 (causal, and sliding-window) against the float64 reference. The backward kernel walks keys in
tiles of 128 partitions, fixed by its layout, so it has no such choice. Rerun with
``python -m nki_ops.ops.retune attention``.
"""

from __future__ import annotations

import torch

from .._tuned import Tuned
from .nki_kernel import KV_BLOCK, flash_attention_kernel
from .reference import attention_reference

SPACE = {"kv_block": [KV_BLOCK, 384, 256, 128]}
STUDY = ("tune_kernel grid over kv_block, the forward at B=1 H=8 S=2048 D=64 fp32 causal, checked at "
         "B=1 H=2 S=300 D=40; studies attention-forward-trn1/-trn2/-trn3 (python -m nki_ops.ops.retune attention)")

TUNED = {
    "forward": Tuned("flash_attention_kernel", {"kv_block": KV_BLOCK}, SPACE,
                     {"trn1": {"kv_block": 512}, "trn2": {"kv_block": 512}, "trn3": {"kv_block": 512}}, STUDY),
}


def _transposed(x):
    return x.transpose(2, 3).contiguous()


def _qkv(seq, heads, dim, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, seq, dim, generator=g) for _ in range(3)]


def build_forward(kv_block):
    q, k, v = _qkv(2048, 8, 64, seed=0)
    return flash_attention_kernel, (_transposed(q), _transposed(k), v, None, 0.125, True, 0, 0.0, kv_block)


def check_forward(kv_block):
    q, k, v = _qkv(300, 2, 40, seed=1)
    scale = 40 ** -0.5
    for causal, window in ((True, 0), (False, 200)):
        out, _ = flash_attention_kernel(_transposed(q), _transposed(k), v, None, scale, causal, window, 0.0, kv_block)
        expected = attention_reference(q.double(), k.double(), v.double(), causal=causal,
                                       sliding_window=window or None, scale=scale).float()
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


BUILD = {"forward": (build_forward, check_forward)}
