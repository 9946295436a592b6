"""Kernel tiling parameters tuned per target on the simulator's cost model, and the study that chose them.

An op whose kernel takes tiling parameters records them in its ``tuning.py`` as a :class:`Tuned`: the
kernel's defaults, the values searched, the parameters the study found fastest on each target, and how
to rerun the study (``python -m nki_ops.ops.retune OP``, which runs :func:`nki_ops.tune.tune_kernel` on
the op's ``build``/``check`` for every target and prints what to record). Every searched value gives the
same results up to fp32 rounding; only the estimated device time differs.
"""

from __future__ import annotations

from dataclasses import dataclass

TARGETS = ("trn1", "trn2", "trn3")


@dataclass(frozen=True)
class Tuned:
    kernel: str  # the kernel function's name
    defaults: dict  # the kernel's own default parameters
    space: dict  # each parameter's searched values, the default first
    per_target: dict  # target -> the parameters the study chose
    study: str  # how they were chosen: workload, search, study names

    def params(self, target: str | None = None) -> dict:
        """The parameters for ``target``; by default the simulator's configured target when the kernels
        run in the simulator, else the kernel's own defaults (a device run does not say its target here)."""
        if target is None:
            from ._nki_backend import is_simulated

            if not is_simulated():
                return dict(self.defaults)
            from ..sim.core.config import current_config

            target = current_config().target
        return dict(self.per_target.get("trn1" if target == "inf2" else target, self.defaults))
