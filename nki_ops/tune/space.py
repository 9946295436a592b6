"""The search space: a TOML file with ``[neuron_cc_flags]``, ``[env]`` and ``[params]`` tables.

Every key lists the values to try; **the first value of every list is the default configuration**,
which always runs first so that each result reads as a speedup against it. A scalar means one fixed value.
Combinations that are invalid or change nothing are pruned before any trial runs, and listed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .flags import SpaceError, compose_neuron_cc_flags, validate_flag

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

TABLES = ("neuron_cc_flags", "env", "params")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what a shell can export


def env_value(value) -> str:
    """How a TOML value reaches the environment: booleans as 1/0, everything else as text."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _on(config: dict, axis: str) -> bool:
    value = config.get(axis)
    return value not in (None, False, 0, "0", "", "false", "False")


def _invalid_reason(config: dict) -> str | None:
    """Combinations the compiler or torch-xla refuse, or that contradict themselves."""
    if _on(config, "env.XLA_USE_BF16") and _on(config, "env.XLA_DOWNCAST_BF16"):
        return "XLA_USE_BF16 together with XLA_DOWNCAST_BF16 (choose one bf16 mode)"
    if (config.get("neuron_cc_flags.enable-mixed-precision-accumulation") is True
            and config.get("neuron_cc_flags.disable-mixed-precision-accumulation") is True):
        return "enable- and disable-mixed-precision-accumulation contradict each other"
    target = config.get("neuron_cc_flags.target")
    if target is not None and target != "trn2":
        for trn2_only in ("logical-nc-config", "native-int64"):
            if f"neuron_cc_flags.{trn2_only}" in config:
                return f"--{trn2_only} needs --target=trn2 (got --target={target})"
    return None


def _without_no_effect(config: dict) -> dict:
    """Drop settings that change nothing, so equivalent configurations collapse into one run."""
    config = dict(config)
    if config.get("neuron_cc_flags.auto-cast", "none") == "none":
        # auto-cast-type only applies when auto-cast is on (the compiler default is none since Neuron 2.27)
        config.pop("neuron_cc_flags.auto-cast-type", None)
    if config.get("neuron_cc_flags.target") == "trn2":
        config.pop("neuron_cc_flags.enable-saturate-infinity", None)  # accepted but ignored on trn2
    return config


def describe(config: dict) -> str:
    return " ".join(f"{axis.split('.', 1)[1]}={value}" for axis, value in config.items()) or "(empty)"


@dataclass
class Space:
    axes: dict[str, list]  # "table.name" -> values, first is the default
    points: list[dict] = field(default_factory=list)  # valid, distinct configurations; points[0] is the default
    pruned: list[tuple[dict, str]] = field(default_factory=list)

    @property
    def baseline(self) -> dict:
        return self.points[0]

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.axes, sort_keys=True).encode()).hexdigest()[:16]

    def key(self, config: dict) -> str:
        return json.dumps(config, sort_keys=True)

    def canonical(self, config: dict) -> tuple[dict | None, str | None]:
        """(configuration that runs, None) or (None, why it cannot run)."""
        reason = _invalid_reason(config)
        return (None, reason) if reason else (_without_no_effect(config), None)


def trial_settings(config: dict) -> tuple[dict[str, str], dict]:
    """Environment overrides (NEURON_CC_FLAGS and [env]) and script params of one configuration."""
    flags = {a.split(".", 1)[1]: v for a, v in config.items() if a.startswith("neuron_cc_flags.")}
    env = {a.split(".", 1)[1]: env_value(v) for a, v in config.items() if a.startswith("env.")}
    if flags:
        env["NEURON_CC_FLAGS"] = compose_neuron_cc_flags(flags)
    params = {a.split(".", 1)[1]: v for a, v in config.items() if a.startswith("params.")}
    return env, params


def parse_space(document: dict, source: str = "space") -> Space:
    unknown = set(document) - set(TABLES)
    if unknown:
        raise SpaceError(f"{source}: unknown table(s) {sorted(unknown)}; expected {list(TABLES)}")
    axes: dict[str, list] = {}
    for table in TABLES:
        entries = document.get(table, {})
        if not isinstance(entries, dict):
            raise SpaceError(f"{source}: [{table}] must be a table of name = [values], got {entries!r}")
        for name, values in entries.items():
            values = values if isinstance(values, list) else [values]
            if not values:
                raise SpaceError(f"{source}: {table}.{name} lists no values")
            if any(isinstance(v, (dict, list)) for v in values):
                raise SpaceError(f"{source}: {table}.{name} values must be strings, numbers or booleans, "
                                 f"got {values!r}")
            if len(set(map(repr, values))) != len(values):
                raise SpaceError(f"{source}: {table}.{name} lists a value twice: {values!r}")
            if table == "neuron_cc_flags":
                validate_flag(name, values)
            if table == "env":
                if not ENV_NAME.fullmatch(name):
                    raise SpaceError(f"{source}: [env] name {name!r} is not an environment variable name "
                                     f"(letters, digits and _, not starting with a digit)")
                if any("\0" in env_value(v) for v in values):
                    raise SpaceError(f"{source}: env.{name} has a value with a NUL character, which no "
                                     f"environment variable can hold: {values!r}")
            axes[f"{table}.{name}"] = values
    space = Space(axes)
    _, reason = space.canonical({axis: values[0] for axis, values in axes.items()})
    if reason:
        raise SpaceError(f"{source}: the default configuration (first value of every list) is invalid: {reason}")
    seen: dict[str, int] = {}
    for combination in itertools.product(*axes.values()):
        config = dict(zip(axes, combination))
        runnable, reason = space.canonical(config)
        if runnable is None:
            space.pruned.append((config, f"invalid: {reason}"))
            continue
        key = space.key(runnable)
        if key in seen:
            space.pruned.append((config, f"no effect: runs the same as point {seen[key]} "
                                         f"({describe(space.points[seen[key]])})"))
            continue
        seen[key] = len(space.points)
        space.points.append(runnable)
    return space  # itertools.product yields the default first, so points[0] is the default


def read_space_file(path: Path) -> dict:
    """A search space file's TOML document, or the SpaceError saying why it cannot be read."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpaceError(f"search space file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise SpaceError(f"cannot read search space file {str(path)!r}: {reason}") from None
    except tomllib.TOMLDecodeError as error:
        raise SpaceError(f"{path}: not valid TOML: {error}") from None


def load_space(path: str | Path) -> Space:
    path = Path(path)
    return parse_space(read_space_file(path), str(path))
