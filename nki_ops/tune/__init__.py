"""Sweep neuronx-cc flags, XLA/Neuron environment and training-script parameters over real runs.

Training scripts only need :func:`trial_params` and :func:`report`; the sweep itself
(``nki-ops tune run|report|best``) lives in :mod:`nki_ops.tune.study` and needs the ``tune`` extra.
"""

from .protocol import report, trial_params

__all__ = ["trial_params", "report"]
