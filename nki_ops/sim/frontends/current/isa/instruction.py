"""The current API's instruction registry: every ``nisa`` instruction is declared with ``@instruction``,
which returns the API pages' ``NkiInstruction`` handle, records ``name=`` for ``with_schedule`` and turns
a call that does not bind into the kernel's error at its line."""

from __future__ import annotations

import functools

from ....core.errors import KernelUsageError
from ....core.run import current_run

INSTRUCTIONS: dict[str, object] = {}  # name -> the instruction, in declaration order


class NkiInstruction:
    """The API page's opaque handle to a traced instruction, which every instruction returns. The
    simulator runs instructions in program order, so every dependency ``depends_on`` adds already
    holds (the cost model's schedule does not add these edges)."""

    def __init__(self, name: str | None = None):
        self.name = name

    def __repr__(self) -> str:
        return f"NkiInstruction({self.name!r})"

    def depends_on(self, *producers: NkiInstruction) -> NkiInstruction:
        for producer in producers:
            if not isinstance(producer, NkiInstruction):
                raise KernelUsageError(f"NkiInstruction.depends_on takes instructions, got {type(producer).__name__}")
        return self


def instruction(fn):
    """Declare ``fn`` an instruction: it returns its ``NkiInstruction`` handle where it returns nothing else,
    and ``name=`` goes into the launch's issued names."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except TypeError as error:
            if error.__traceback__.tb_next is not None:  # raised inside the instruction
                raise
            # The call did not bind (an unknown or missing argument): the kernel's error, at its line.
            raise KernelUsageError(f"nisa.{error}") from None
        if result is not None:
            return result
        name = kwargs.get("name")
        if name is not None:
            issued = current_run(fn.__name__).frontend.get("issued names")
            if issued is not None:
                issued.add(name)
        return NkiInstruction(name)
    if fn.__name__ in INSTRUCTIONS:
        raise ValueError(f"instruction {fn.__name__} is declared twice")
    INSTRUCTIONS[fn.__name__] = call
    return call
