"""One way to define an op: ``define_op`` declares everything the rest of the project needs to know.

    @define_op("rms_norm", torch=rms_norm_reference, nki=rms_norm_nki, demo=_demo_inputs,
               differentiable=True, benchmark="rms_norm")
    def rms_norm(x, weight, eps=1e-6, *, backend="auto"):
        ...check the inputs, then: return resolve("rms_norm", backend, x.device, (x, weight))(x, weight, eps)

The decorated function is the public op (``nki_ops.rms_norm``); ``define_op`` registers its backends with
the registry (``_backends``) and records an ``OpDefinition`` in ``OPS``, from which the demo's check of every
backend, ``nki-ops bench``, ``nki_ops.availability`` and the backend-conformance tests find the ops. An op's
folder holds the rest: ``reference.py`` (torch), ``nki_kernel.py`` (the NKI kernels), ``nki_op.py`` or
``cpp_op.py`` (the kernels as torch.library ops with ``register_fake`` and ``register_autograd``).

Adding an op touches only: a folder under ``nki_ops/ops/`` whose ``__init__.py`` has the ``define_op`` and
lists the public names in ``__all__`` (``nki_ops`` imports every such folder and exports those names), its
kernel file(s), a test file ``tests/ops/test_<folder>.py`` (with a ``conformance_case`` Hypothesis strategy
for the conformance suite, or ``conformance_cases = {op: strategy}`` when the folder defines several ops),
and a line in the README's op table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .._backends import register
from ..cpp import backend as cpp_backend
from ._nki_backend import register_nki


@dataclass(frozen=True)
class OpDefinition:
    name: str
    function: Callable  # the public function, nki_ops.<name>
    # Small inputs for the demo's check of every backend against the torch reference: a callable
    # returning the positional arguments, or None to leave the op out of the demo.
    demo: Callable[[], tuple] | None
    differentiable: bool  # the demo compares the inputs' gradients too
    benchmark: str | None  # benchmarks/<benchmark>.py, run by ``nki-ops bench <name>``


OPS: dict[str, OpDefinition] = {}


def define_op(name: str, *, torch: Callable, nki: Callable | None = None, cpp: Callable | None = None,
              cpp_operator: str | None = None, cpp_input_reason: Callable | None = None,
              demo: Callable[[], tuple] | None = None, differentiable: bool = False,
              benchmark: str | None = None) -> Callable[[Callable], Callable]:
    """Declare op ``name``: its torch reference, its NKI and C++ implementations (each taking the public
    function's arguments after its checks), and how the demo and ``nki-ops bench`` exercise it.

    ``cpp_operator`` names the operator in ``cpp_ops/`` the C++ implementation loads (its availability
    follows that operator's build); ``cpp_input_reason(*inputs)`` says why it does not take some inputs.
    """
    def decorate(function: Callable) -> Callable:
        if name in OPS:
            raise ValueError(f"op {name!r} is defined twice")
        register(name, "torch", torch)
        if nki is not None:
            register_nki(name, nki)
        if cpp is not None:
            register(name, "cpp", cpp, cpp_backend.unavailable_reason(cpp_operator or name), cpp_backend.label,
                     input_reason=cpp_input_reason)
        OPS[name] = OpDefinition(name, function, demo, differentiable, benchmark)
        return function
    return decorate
