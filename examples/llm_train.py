"""Train a small Llama-style decoder whose every transformer op is an nki-ops op.

Per block: ``nki_ops.rms_norm``, ``nki_ops.rope`` on q and k (rotate-half, as Hugging Face Llama),
``nki_ops.attention`` with grouped-query heads and a causal mask, ``nki_ops.swiglu`` in the MLP; the head
is ``nki_ops.fused_linear_cross_entropy``, which never holds the ``[tokens, vocab]`` logits. The data is
a character-level tokenisation of a short text, so the run needs no download.

    python examples/llm_train.py --backend nki      # the NKI kernels (simulated here, on the device on trn)
    python examples/llm_train.py --backend torch    # the torch references: the same loss curve

On a Neuron host, ``--backend nki`` runs the kernels through ``nki.jit`` on the XLA device.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

import nki_ops

TEXT = (
    "The Neuron Kernel Interface lets you write kernels for Trainium and Inferentia in Python. "
    "Tiles of at most one hundred and twenty eight partitions live in SBUF and PSUM, and the engines "
    "compute on them while DMA queues move data from HBM. "
)


def tokenise(text: str = TEXT) -> tuple[torch.Tensor, int]:
    """The text as character ids, and the vocabulary size."""
    alphabet = sorted(set(text))
    return torch.tensor([alphabet.index(c) for c in text]), len(alphabet)


def rope_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[seq, head_dim]`` of the rotate-half convention (each frequency twice)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, backend: str):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.backend = heads, kv_heads, dim // heads, backend
        self.attn_norm = nn.Parameter(torch.ones(dim))
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(dim))
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        h = nki_ops.rms_norm(x, self.attn_norm, 1e-6, backend=self.backend)
        q = self.q(h).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(batch, seq, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = nki_ops.rope(q, k, cos, sin, backend=self.backend)
        mixed = nki_ops.attention(q, k, v, causal=True, backend=self.backend)
        x = x + self.out(mixed.transpose(1, 2).reshape(batch, seq, dim))
        gate, up = self.gate_up(nki_ops.rms_norm(x, self.mlp_norm, 1e-6, backend=self.backend)).chunk(2, dim=-1)
        return x + self.down(nki_ops.swiglu(gate, up, backend=self.backend))


class Decoder(nn.Module):
    """Token embedding, ``layers`` blocks, a final RMSNorm and an untied output projection."""

    def __init__(self, vocab: int, dim: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                 hidden: int = 64, seq: int = 32, backend: str = "torch"):
        super().__init__()
        self.backend = backend
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, hidden, backend) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(dim))
        self.head = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(seq, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos[:seq], self.sin[:seq])
        hidden = nki_ops.rms_norm(x, self.norm, 1e-6, backend=self.backend).reshape(-1, x.shape[-1])
        return nki_ops.fused_linear_cross_entropy(hidden, self.head.weight, targets.reshape(-1),
                                                  backend=self.backend)


def batches(tokens: torch.Tensor, batch: int, seq: int, steps: int, seed: int):
    """``steps`` random batches of ``seq``-token windows and their next-token targets."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, tokens.numel() - seq - 1, (batch,), generator=g)
        window = torch.stack([tokens[s:s + seq + 1] for s in starts.tolist()])
        yield window[:, :-1], window[:, 1:]


def train(backend: str = "torch", steps: int = 20, batch: int = 4, seq: int = 32, lr: float = 1e-2,
          seed: int = 0, compile: bool = False, log=print) -> list[float]:
    """Train for ``steps`` Adam steps on ``backend``; returns the loss of every step."""
    tokens, vocab = tokenise()
    torch.manual_seed(seed)
    model = Decoder(vocab, seq=seq, backend=backend)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    step_loss = torch.compile(model.loss, fullgraph=True) if compile else model.loss
    losses = []
    for step, (inputs, targets) in enumerate(batches(tokens, batch, seq, steps, seed)):
        optimiser.zero_grad()
        loss = step_loss(inputs, targets)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
        log(f"step {step:3d}  loss {losses[-1]:.4f}  (uniform guess: {math.log(vocab):.4f})")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="nki", choices=["nki", "torch", "auto"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) the training loss")
    args = parser.parse_args()
    train(args.backend, args.steps, compile=args.compile)


if __name__ == "__main__":
    main()
