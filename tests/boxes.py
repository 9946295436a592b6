"""Box sets for tests: random valid boxes and hand-built adversarial pairs."""

from __future__ import annotations

import torch


def random_valid_boxes(n: int, *, scale: float = 100.0, dtype=torch.float64, generator=None) -> torch.Tensor:
    """``[n, 4]`` xyxy boxes with positive width and height and continuous coordinates."""
    xy = torch.rand(n, 2, generator=generator, dtype=torch.float64) * scale
    wh = torch.rand(n, 2, generator=generator, dtype=torch.float64) * scale / 2 + scale / 100
    return torch.cat([xy, xy + wh], dim=1).to(dtype)


def adversarial_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """Paired boxes covering the corner cases: identical, disjoint, nested, edge-touching, zero-area, large."""
    pairs = [
        ([0, 0, 10, 10], [0, 0, 10, 10]),          # identical
        ([0, 0, 1, 1], [5, 5, 6, 6]),              # disjoint
        ([0, 0, 10, 10], [2, 3, 4, 5]),            # nested
        ([2, 3, 4, 5], [0, 0, 10, 10]),            # nested, other way round
        ([0, 0, 1, 1], [1, 0, 2, 1]),              # touching along an edge
        ([0, 0, 1, 1], [1, 1, 2, 2]),              # touching at a corner
        ([3, 3, 3, 3], [3, 3, 3, 3]),              # identical zero-area points
        ([0, 0, 0, 5], [0, 0, 0, 5]),              # identical zero-width lines
        ([0, 0, 0, 5], [1, 1, 4, 4]),              # zero-width against a box
        ([0, 0, 1e4, 1e4], [5e3, 5e3, 1e4, 1e4]),  # large coordinates
        ([9998, 9998, 1e4, 1e4], [0, 0, 1, 1]),    # far apart, large coordinates
        ([0, 0, 10, 10], [0, 5, 10, 15]),          # shared x-edges (ties of min/max)
    ]
    return (torch.tensor([a for a, _ in pairs], dtype=torch.float64),
            torch.tensor([b for _, b in pairs], dtype=torch.float64))
