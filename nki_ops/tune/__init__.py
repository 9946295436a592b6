"""Sweep neuronx-cc flags, XLA/Neuron environment and training-script parameters over real runs, and NKI
kernel parameters on the simulator's cost model.

Training scripts only need :func:`trial_params` and :func:`report`; the sweep itself
(``nki-ops tune run|report|best``) lives in :mod:`nki_ops.tune.study` and needs the ``tune`` extra, as does
:func:`tune_kernel` (``nki-ops tune kernel``, :mod:`nki_ops.tune.kernel`), imported on first use.
"""

from .protocol import report, trial_params

__all__ = ["trial_params", "report", "tune_kernel"]


def __getattr__(name):
    if name == "tune_kernel":  # Optuna only when a kernel is tuned, not in every training script
        from .kernel import tune_kernel
        return tune_kernel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
