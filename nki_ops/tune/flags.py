"""The one table of neuronx-cc flags a search space may sweep, and the NEURON_CC_FLAGS string they compose.

Values follow the neuronx-cc CLI reference (Neuron 2.32). Deprecated spellings (``matmul``, ``nemo``,
``transformer-inference``, ``--enable-experimental-O1``) are absent on purpose, so they are refused
with the current spelling suggested.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass

SWITCH = (True, False)  # a flag given alone (``--enable-saturate-infinity``) or left out


@dataclass(frozen=True)
class Flag:
    values: tuple
    help: str


FLAGS: dict[str, Flag] = {
    "target": Flag(("inf2", "trn1", "trn1n", "trn2"), "instance family the NEFF is built for"),
    "model-type": Flag(("generic", "transformer", "unet-inference", "cnn-training"), "model-specific optimisations"),
    "optlevel": Flag((1, 2, 3), "-O level: 1 compiles fastest, 3 optimises the whole model"),
    "auto-cast": Flag(("none", "matmult", "all"), "which FP32 operations the compiler casts down"),
    "auto-cast-type": Flag(("bf16", "fp16", "tf32", "fp8_e4m3"), "type auto-cast casts to"),
    "logical-nc-config": Flag((1, 2), "logical NeuronCore size (trn2 only)"),
    "native-int64": Flag(("default", "enabled", "disabled"), "keep int64 instead of downcasting (trn2 and later)"),
    "distribution-strategy": Flag(("llm-training",), "graph partitioning for LLM training"),
    "enable-mixed-precision-accumulation": Flag(SWITCH, "accumulate reductions in FP32"),
    "disable-mixed-precision-accumulation": Flag(SWITCH, "accumulate reductions in the cast type"),
    "enable-saturate-infinity": Flag(SWITCH, "turn +-inf into MAX/MIN before NaN-prone transposes (trn1)"),
    "enable-fast-context-switch": Flag(SWITCH, "defer weight loading for faster model swaps"),
    "enable-fast-loading-neuron-binaries": Flag(SWITCH, "write an uncompressed NEFF that loads faster"),
    "disable-dge": Flag(SWITCH, "turn off descriptor-generation-engine memory optimisation"),
}


class SpaceError(ValueError):
    """A search space that cannot be swept: the message says what was expected and what came."""


def _suggestion(word: str, choices) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def validate_flag(name: str, values: list) -> None:
    """Refuse an unknown flag or value, naming the closest valid spelling."""
    if name not in FLAGS:
        raise SpaceError(f"unknown neuronx-cc flag {name!r} in [neuron_cc_flags]{_suggestion(name, FLAGS)} "
                         f"(known flags: {', '.join(sorted(FLAGS))})")
    allowed = FLAGS[name].values
    for value in values:
        # bool is an int subclass: keep True from passing as optlevel 1 and 1 from passing as a switch
        if not any(value == a and type(value) is type(a) for a in allowed):
            raise SpaceError(f"invalid value {value!r} for neuronx-cc flag {name!r}{_suggestion(value, allowed)} "
                             f"(valid: {', '.join(repr(a) for a in allowed)})")


def compose_neuron_cc_flags(flags: dict) -> str:
    """The canonical NEURON_CC_FLAGS string: flags sorted by name, switches given alone when on."""
    parts = []
    for name in sorted(flags):
        value = flags[name]
        if value is True:
            parts.append(f"--{name}")
        elif value is not False:
            parts.append(f"--{name}={value}")
    return shlex.join(parts)
