"""Kernels launched from several threads at once each run in their own simulator state."""

from concurrent.futures import ThreadPoolExecutor

import torch

import nki_ops


def test_concurrent_nki_giou_calls_all_succeed_and_agree_with_the_reference():
    generator = torch.Generator().manual_seed(0)
    xy = torch.rand(4, 300, 2, generator=generator) * 50
    wh = torch.rand(4, 300, 2, generator=generator) * 20 + 1
    boxes = torch.cat([xy, xy + wh], dim=-1)
    pairs = [(boxes[i], boxes[(i + 1) % 4]) for i in range(4)]

    def call(pair):
        return nki_ops.giou(*pair, backend="nki")

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(call, pairs * 6))
    for (a, b), result in zip(pairs * 6, results):
        torch.testing.assert_close(result, nki_ops.giou(a, b, backend="torch"), rtol=1e-5, atol=1e-5)
