"""The compiled-training check the differentiable ops' tests share."""

from __future__ import annotations

import torch


def check_compiled_training(loss_of, parameters, optimizer, steps: int = 5, loss_atol: float = 1e-7) -> None:
    """``loss_of(backend)`` compiled with ``fullgraph=True`` on the nki backend: its loss and gradients of
    ``parameters`` match the torch backend's, and ``steps`` optimizer steps lower the loss."""
    compiled = torch.compile(lambda: loss_of("nki"), fullgraph=True)
    loss = compiled()
    grads = torch.autograd.grad(loss, parameters)
    expected_loss = loss_of("torch")
    expected_grads = torch.autograd.grad(expected_loss, parameters)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=loss_atol)
    for got, expected in zip(grads, expected_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)

    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = compiled()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
