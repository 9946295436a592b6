"""The ViT training loop of the published inf2 optimisation study, as a tunable workload.

Random data, a small Vision Transformer, Adam, cross-entropy; it reports training samples per second with
``nki_ops.tune.report``. Every setting the study tuned by hand is a ``[params]`` entry (read with
``trial_params``), so ``nki-ops tune`` can sweep it:

    nki-ops tune run --study vit --space examples/vit_space.toml -- torchrun --nproc_per_node=2 examples/vit_train.py

With torch-xla installed (a Neuron host, or ``PJRT_DEVICE=CPU`` anywhere) it trains on the XLA device through
MpDeviceLoader, whose loader settings come from the params; without it, it trains on the CPU in eager mode.
The defaults are sized for a CPU: the study used a ViT-Base on 224x224 images.

Attention is ``nki_ops.attention``: ``--attention torch`` (the default) runs its torch reference,
``--attention nki`` its NKI kernels (on the Neuron device, or simulated on the CPU). The losses of the
steps are printed at the end, so the two can be compared.
"""

import argparse
import os
import time

import torch
from torch import nn

import nki_ops
from nki_ops.tune import report, trial_params

DEFAULTS = {
    "batch_size": 16, "num_workers": 0, "steps": 12, "warmup_steps": 2, "autocast": False,
    "image_size": 32, "patch_size": 8, "dim": 64, "depth": 2, "heads": 4, "classes": 10,
    # MpDeviceLoader (torch-xla only)
    "batches_per_execution": 1, "loader_prefetch_size": 16, "device_prefetch_size": 8,
    "host_to_device_transfer_threads": 1,
}
LOADER_SETTINGS = ("batches_per_execution", "loader_prefetch_size", "device_prefetch_size",
                   "host_to_device_transfer_threads")


class RandomImages(torch.utils.data.Dataset):
    def __init__(self, length, image_size, classes):
        self.length, self.image_size, self.classes = length, image_size, classes

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return torch.randn(3, self.image_size, self.image_size), torch.tensor(index % self.classes)


class Block(nn.Module):
    """A pre-norm transformer encoder block whose attention is ``nki_ops.attention`` on ``backend``."""

    def __init__(self, dim, heads, backend):
        super().__init__()
        self.heads, self.backend = heads, backend
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        batch, tokens, dim = x.shape
        # [B, S, 3 * dim] -> three [B, heads, S, dim / heads]
        q, k, v = self.qkv(self.norm1(x)).reshape(batch, tokens, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        mixed = nki_ops.attention(q, k, v, backend=self.backend)
        x = x + self.proj(mixed.transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self, image_size, patch_size, dim, depth, heads, classes, attention="torch"):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, attention) for _ in range(depth)))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, classes))

    def forward(self, images):
        tokens = self.patches(images).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(tokens), -1, -1), tokens], dim=1) + self.position
        return self.head(self.blocks(tokens)[:, 0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", choices=("torch", "nki"), default="torch",
                        help="backend of nki_ops.attention (default: torch)")
    args = parser.parse_args()
    p = trial_params(DEFAULTS)
    try:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.parallel_loader as pl
    except ImportError:
        torch_xla = None
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)  # every rank starts from the same weights
    model = TinyViT(p["image_size"], p["patch_size"], p["dim"], p["depth"], p["heads"], p["classes"], args.attention)
    loader = torch.utils.data.DataLoader(RandomImages(p["batch_size"] * p["steps"], p["image_size"], p["classes"]),
                                         batch_size=p["batch_size"], num_workers=p["num_workers"])
    if torch_xla is not None:
        if world_size > 1:
            import torch_xla.distributed.xla_backend  # noqa: F401  registers the 'xla' process group

            torch.distributed.init_process_group("xla")
        device = xm.xla_device()
        loader = pl.MpDeviceLoader(loader, device, **{k: p[k] for k in LOADER_SETTINGS})
        step_optimizer = xm.optimizer_step
    else:
        device = torch.device("cpu")
        def step_optimizer(optimizer):
            optimizer.step()
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters())
    loss_function = nn.CrossEntropyLoss()
    timed_samples, start, losses = 0, None, []
    for step, (images, labels) in enumerate(loader, start=1):
        if step == p["warmup_steps"] + 1:
            start = time.perf_counter()  # the first steps compile (XLA) or warm caches
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=p["autocast"]):
            loss = loss_function(model(images), labels)
        loss.backward()
        step_optimizer(optimizer)
        losses.append(loss.detach())
        if start is not None:
            timed_samples += len(images)
    if torch_xla is not None:
        xm.wait_device_ops()
    if start is None:
        raise SystemExit(f"steps ({p['steps']}) must exceed warmup_steps ({p['warmup_steps']})")
    if int(os.environ.get("RANK", "0")) == 0:
        print("losses: " + " ".join(f"{float(loss):.6f}" for loss in losses))
    report(samples_per_sec=timed_samples * world_size / (time.perf_counter() - start))


if __name__ == "__main__":
    main()
