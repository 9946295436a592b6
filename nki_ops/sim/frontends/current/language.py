"""``nki.language`` (``nl``) of the current API (NKI 0.6): tensors, buffers, dtypes, loops, and the
convenience wrappers reintroduced in 0.3 (``nl.load``, ``nl.store``, ``nl.matmul``, element-wise
operations, reductions), each lowered to the same core instructions as ``nisa``.

The element-wise functions double as operator constants for ISA calls (``op=nl.add``).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import os

import numpy as np

from ...core import alu, memory
from ...core import dtypes as _dt
from ...core import language as _language
from ...core import random as prng
from ...core.errors import KernelUsageError, UnsupportedError, refuse_unknown
from ...core.replay import step
from ...core.run import active_config, current_run
from . import dtypes  # noqa: F401  (nl.dtypes)
from .dtypes import (  # noqa: F401  (re-exported names)
    DType,
    bfloat16,
    bool_,
    float4_e2m1fn_x4,
    float8_e4m3,
    float8_e4m3fn,
    float8_e4m3fn_x4,
    float8_e5m2,
    float8_e5m2_x4,
    float8_e8m0fnu,
    float16,
    float32,
    int8,
    int16,
    int32,
    tfloat32,
    uint8,
    uint16,
    uint32,
)
from .isa.random import dropped, seed_vector_engine
from .tensor import NkiTensor, allocate

bool = bool_  # noqa: A001  (nl.bool is the documented spelling too)
dtype = np.dtype
tensor = NkiTensor

# ------------------------------------------------------------------------------------ buffers
sbuf, psum, shared_hbm, private_hbm = memory.sbuf, memory.psum, memory.shared_hbm, memory.private_hbm
hbm = memory.Buffer("hbm", "hbm")


class _MemoryRegionType(type):
    def __instancecheck__(cls, value) -> builtins.bool:
        return isinstance(value, memory.Buffer)


class MemoryRegion(metaclass=_MemoryRegionType):
    """The type of the buffers (``isinstance(t.buffer, nl.MemoryRegion)``), members as the API page
    lists them."""

    sbuf, psum, private_hbm, shared_hbm = sbuf, psum, private_hbm, shared_hbm


class _TileSize(memory.TileSize):
    """The 0.4.0 additions: SBUF sizes in bytes and fp32 elements, and the usable PSUM banks."""

    @property
    def sbuf_size_bytes(self) -> int:
        """Total SBUF bytes, all partitions."""
        return memory.PMAX * active_config().sbuf_capacity

    @property
    def sbuf_fmax_bytes(self) -> int:
        return active_config().sbuf_usable

    @property
    def sbuf_fmax(self) -> int:
        return active_config().sbuf_usable // 4

    @property
    def psum_num_banks(self) -> int:
        """8, or 7 when dma_transpose is lowered to a PE transpose (trn2+), which keeps bank 7."""
        pe = os.environ.get("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "").lower() == "true"
        return 7 if pe and active_config().nc_version >= 3 else 8


tile_size = _TileSize()


class fp32:
    min = np.float32(np.frombuffer(np.uint32(0xFF7FFFFF).tobytes(), np.float32)[0])


class NKIObject:
    """Base class of the classes kernels pass around (configs). As the NKI language guide ("Class
    Support") documents, every such class compiles like a data class, with or without ``@dataclass``:
    unless the class provides its own, it gets ``__init__(self, field=default, ...)`` (positional or
    by name; a field without a default defaults to None) that then calls ``__post_init__``. Its
    fields are the annotated names and the plain class-level values (``section_idx = None``), in
    that order, base classes' first. The generated ``__init__`` is installed before ``@dataclass``
    runs, which then keeps it (a dataclass never replaces an ``__init__`` the class has)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__ and not _user_init(cls):
            cls.__init__ = _generated_init

    def __init__(self, **kwargs):
        _generated_init(self, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def _user_init(cls) -> bool:
    """Whether a base class between ``cls`` and NKIObject defines its own ``__init__``."""
    return any("__init__" in klass.__dict__ and klass.__dict__["__init__"] is not _generated_init
               for klass in cls.__mro__[1:] if klass is not NKIObject and issubclass(klass, NKIObject))


def _fields(cls) -> dict:
    """The documented data-class fields of an NKIObject class, each with its default as a factory."""
    fields: dict = {}
    for klass in reversed(cls.__mro__):
        if klass is NKIObject or not issubclass(klass, NKIObject):
            continue
        names = list(klass.__dict__.get("__annotations__", {}))
        names += [name for name, value in klass.__dict__.items()
                  if name not in names and not name.startswith("__") and not callable(value)
                  and not isinstance(value, (property, staticmethod, classmethod))]
        for name in names:
            fields[name] = _default(klass.__dict__.get(name))
    return fields


def _default(value):
    """A field's default as a factory: a ``dataclasses.field(default_factory=...)`` makes a fresh one."""
    if isinstance(value, dataclasses.Field):
        if value.default_factory is not dataclasses.MISSING:
            return value.default_factory
        value = None if value.default is dataclasses.MISSING else value.default
    return lambda: value


def _generated_init(self, *args, **kwargs):
    fields = _fields(type(self))
    if len(args) > len(fields):
        raise TypeError(f"{type(self).__name__}() takes {len(fields)} field(s), got {len(args)} positional "
                        f"arguments")
    given = dict(zip(fields, args))
    for name, value in kwargs.items():
        if name not in fields or name in given:
            raise TypeError(f"{type(self).__name__}() got an unexpected or repeated argument {name!r}")
        given[name] = value
    for name, default in fields.items():
        # object.__setattr__: frozen dataclasses are built the same way.
        object.__setattr__(self, name, given[name] if name in given else default())
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


def _region(buffer, api: str) -> memory.Buffer:
    if not isinstance(buffer, memory.Buffer):
        raise KernelUsageError(f"{api} takes a buffer (nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, "
                               f"nl.private_hbm; a tensor's .buffer), got {type(buffer).__name__}")
    return buffer


def is_hbm(buffer) -> builtins.bool:
    return not _region(buffer, "nl.is_hbm").on_chip


def is_sbuf(buffer) -> builtins.bool:
    return _region(buffer, "nl.is_sbuf") is sbuf


def is_psum(buffer) -> builtins.bool:
    return _region(buffer, "nl.is_psum") is psum


def is_on_chip(buffer) -> builtins.bool:
    return _region(buffer, "nl.is_on_chip").on_chip


# ----------------------------------------------------------------------------------- creation

def _buffer(buffer):
    if not isinstance(buffer, memory.Buffer):
        raise KernelUsageError(f"buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or nl.shared_hbm (an "
                               f"object, not a string), got {buffer!r}")
    return buffer


def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """An uninitialised tensor: NaN (floats) or 4 (integers) until written."""
    if address is not None:
        _check_address(address, buffer)
    return allocate(shape, dtype, _buffer(buffer), name, "nl.ndarray", address=address)


def _check_address(address, buffer) -> None:
    if not buffer.on_chip:
        raise KernelUsageError(f"address= places on-chip tensors only, not tensors in {buffer!r}")
    if not (isinstance(address, (tuple, list)) and len(address) == 2):
        raise KernelUsageError(f"address must be (partition_offset, free_offset), got {address!r}")
    if buffer is psum and address[1] % memory.PSUM_BANK_BYTES:
        raise KernelUsageError(f"PSUM tensors must start at a bank boundary ({memory.PSUM_BANK_BYTES} bytes), "
                               f"got free offset {address[1]}")


def _filled(api, shape, dtype, buffer, name, value):
    return allocate(shape, dtype, _buffer(buffer), name, api, fill=value)


def zeros(shape, dtype, buffer=sbuf, name=""):
    return _filled("nl.zeros", shape, dtype, buffer, name, 0)


def ones(shape, dtype, buffer=sbuf, name=""):
    return _filled("nl.ones", shape, dtype, buffer, name, 1)


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    return _filled("nl.full", shape, dtype, buffer, name, fill_value)


def empty_like(x, dtype=None, buffer=None, name=""):
    return ndarray(x.shape, dtype or x.dtype, buffer=buffer or x.buffer, name=name)


def zeros_like(x, dtype=None, buffer=None, name=""):
    return zeros(x.shape, dtype or x.dtype, buffer=buffer or x.buffer, name=name)


def ones_like(x, dtype=None, buffer=None, name=""):
    return ones(x.shape, dtype or x.dtype, buffer=buffer or x.buffer, name=name)


def full_like(x, fill_value, dtype=None, buffer=None, name=""):
    return full(x.shape, fill_value, dtype or x.dtype, buffer=buffer or x.buffer, name=name)


@step
def shared_constant(constant, dtype=None):
    """A host constant placed in HBM: an array, or the path of a ``.npy`` file holding one."""
    values = np.load(constant) if isinstance(constant, (str, os.PathLike)) else np.asarray(constant)
    t = allocate(values.shape, dtype or values.dtype, shared_hbm, "", "nl.shared_constant", fill=0)
    t.data[...] = _dt.cast(values, t.dtype)
    return t


@step
def shared_identity_matrix(n, dtype=uint8, dst=None):
    """An ``n x n`` identity in SBUF (or written into ``dst``)."""
    values = np.eye(n)
    if dst is None:
        dst = allocate((n, n), dtype, sbuf, "", "nl.shared_identity_matrix", fill=0)
    memory.write(dst, values, "nl.shared_identity_matrix")
    return dst


# ----------------------------------------------------------------------------------- indexing

def ds(start, size):
    """``nl.ds(start, size)`` is the slice ``start:start + size``."""
    return slice(start, start + size)


# ------------------------------------------------------------------------------ loops and LNC

def _range(start, stop=None, step=1, **_hints):
    return builtins.range(start) if stop is None else builtins.range(start, stop, step)


# Documented as deprecated aliases of Python's range: loops are unrolled at specialization.
affine_range = sequential_range = static_range = range = _range  # noqa: A001


def dynamic_range(start, stop=None, step=1):
    """A device loop; bounds may be registers (read now: the kernel runs eagerly)."""
    from .isa import register_value
    if stop is None:
        start, stop = 0, start
    return builtins.range(register_value(start), register_value(stop), step)


def fori_loop(lower, upper, body_fun, step=1):
    """``for i in range(lower, upper, step): body_fun(i)`` with register or int bounds."""
    from .isa import VirtualRegister, register_value
    if not isinstance(step, int) or step <= 0:
        raise KernelUsageError(f"nl.fori_loop step must be a compile-time positive int, got {step!r}")
    dynamic = isinstance(lower, VirtualRegister) or isinstance(upper, VirtualRegister)
    for i in builtins.range(register_value(lower), register_value(upper), step):
        body_fun(VirtualRegister(i) if dynamic else i)


def while_loop(init, body_fun):
    """``r = init; while r != 0: r = body_fun(r)`` with a register condition."""
    from .isa import VirtualRegister, register_value
    if not isinstance(init, VirtualRegister):
        raise KernelUsageError(f"nl.while_loop needs a register as its condition, got {type(init).__name__}")
    reg = init
    while register_value(reg) != 0:
        reg = body_fun(VirtualRegister(register_value(reg)))
        if not isinstance(reg, VirtualRegister):
            raise KernelUsageError(f"nl.while_loop body must return the next condition register, got "
                                   f"{type(reg).__name__}")


def program_id(axis: int = 0) -> int:
    return _language.program_id(_RULES, axis)


def num_programs(axes=0) -> int:
    return _language.num_programs(_RULES, axes)


def program_ndim() -> int:
    return _language.program_ndim(_RULES)


def device_print(print_prefix, tensor=None):
    """Print a tensor's values (stdout in simulation)."""
    _language.device_print(print_prefix, tensor)


@contextlib.contextmanager
def no_reorder():
    """Instructions run in program order here anyway."""
    yield


# ------------------------------------------------------------------------- result placement

def _new_tile(values: np.ndarray, dtype, api: str, buffer=sbuf, mask=None) -> NkiTensor:
    """A result in a new tensor (``Rules.place``; ``mask`` is the legacy API's, always None here)."""
    values = memory.column(values) if values.ndim == 1 else values
    out = allocate(values.shape, dtype, buffer, "", api, fill=None)
    memory.write(out, values, api)
    return out


_RULES = _language.Rules(
    place=_new_tile, as_dtype=dtypes.as_dtype,
    partition_hint="reduce along free axes or use nisa.tensor_partition_reduce",
    checks_operands=True, int_mean_dtype=None, all_dtype=None, reduced_2d=True, promoting_where=False,
    copies_psum=False, lnc=True)


# ------------------------------------------------------------------------------ element-wise

def _make_unary(name, fn):
    def op(x, dtype=None):
        return _language.lowered_unary(_RULES, name, op, x, dtype)
    return _language.named(op, name, f"Element-wise {name} into a new SBUF tensor (also the activation constant "
                                    f"nl.{name}).", (name, fn))


def _make_binary(name, fn):
    def op(x, y, dtype=None):
        return _language.lowered_binary(_RULES, name, op, x, y, dtype)
    return _language.named(op, name, f"Element-wise {name} into a new SBUF tensor (also the ALU operator constant "
                                    f"nl.{name}).", (name, fn))


_language.define(globals(), _make_unary, alu.ACTIVATION)
_language.define(globals(), _make_binary, alu.BINARY, alu.COMPARE, alu.BITWISE, alu.MAGNITUDE)


def _refused(name: str, reason: str):
    """An operator the current compiler rejects (the NKI release notes' known issues; the ISA operator
    table has no divide or modulo): as a function and as any instruction's ``op``."""
    message = f"nl.{name} does not compile for Trainium: {reason}"

    def op(*_args, **_kwargs):
        raise KernelUsageError(message)
    op.refused = message
    return _language.named(op, name, None, (name, None))


divide = _refused("divide", "division is not a hardware instruction; multiply by nl.reciprocal(y)")
mod = _refused("mod", "modulo is not a hardware instruction")
fmod = _refused("fmod", "modulo is not a hardware instruction")


def _activation_only(name):
    """Operator constants with no wrapper here (use them in nisa calls)."""
    def op(*_args, **_kwargs):
        raise UnsupportedError(f"nl.{name}", "use it as an op= constant of an nki.isa instruction")
    return _language.named(op, name, None, (name, None))


def copy(x, dtype=None):
    """A copy of ``x`` (Vector engine, bit-exact for equal dtypes) in a new SBUF tensor."""
    return _language.copy(_RULES, x, dtype)


bypass, average, prelu = (_activation_only(n) for n in ("bypass", "average", "prelu"))


def logical_not(x, dtype=None):
    """1 where ``x`` is 0, else 0, in ``x``'s dtype unless ``dtype`` is given (its page; the device XORs
    with 1, so only 0/1 inputs are meant)."""
    return _language.logical_not(_RULES, x, dtype)


def invert(x, dtype=None):
    return _language.invert(_RULES, x, dtype)


def where(condition, x, y, dtype=None):
    """``x`` where ``condition`` is non-zero, else ``y``."""
    return _language.where(_RULES, condition, x, y, dtype)


# ------------------------------------------------------------------------------- reductions

def _reduction(name):
    """An ``nl`` reduction; its result has ``x``'s dtype unless ``dtype`` is given, as each page says
    (``mean``/``var`` compute in float32 first); nl.var's page ignores ``keepdims`` ("result always has
    keepdims=True shape")."""
    def spell(reduce):
        def op(x, axis, dtype=None, keepdims=False):
            return reduce(x, axis, dtype, keepdims)
        return op
    return _language.reduction(_RULES, name, spell)


sum, max, min, prod, mean, var, all = map(_reduction, ("sum", "max", "min", "prod", "mean", "var", "all"))  # noqa: A001


def softmax(x, axis=-1, dtype=None):
    return _language.softmax(_RULES, x, axis, dtype)


def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None):
    """``x / sqrt(sum(x^2 over axis) / n + epsilon) * w`` (fp32 arithmetic) into a new SBUF tensor."""
    return _language.rms_norm(_RULES, x, w, axis, n, epsilon, dtype, compute_dtype)


# ------------------------------------------------------------------------------------ memory

def load(src, dtype=None):
    """Copy an HBM region into a new SBUF tensor (DMA)."""
    return _language.load(_RULES, src, dtype)


def store(dst, value):
    """Copy an SBUF tensor into an HBM region (DMA); PSUM must be copied to SBUF first."""
    _language.store(_RULES, dst, value)


def matmul(x, y, transpose_x=False):
    """``x.T @ y`` into a new fp32 PSUM tensor (``transpose_x=True`` is required, as on the device)."""
    return _language.matmul(_RULES, x, y, transpose_x)


def transpose(x, dtype=None):
    """Partition <-> free transpose into a new PSUM tensor (Tensor engine)."""
    return _language.transpose(_RULES, x, dtype)


def load_transpose2d(src, dtype=None):
    """A 2-D HBM region transposed (DMA transpose) into a new SBUF tensor."""
    return _language.load_transpose2d(_RULES, src, dtype)


def expand_dims(x, axis):
    """A view of ``x`` with a size-1 axis inserted at ``axis`` of the expanded shape."""
    return _language.expand_dims(_RULES, x, axis)


def gather_flattened(data, indices, axis=0, dtype=None):
    """Per partition, ``data``'s flattened free axes at ``indices`` (uint32), in a new SBUF tensor of
    ``indices``' shape."""
    return _language.gather_flattened(_RULES, "nl.gather_flattened", data, indices, dtype, axis)


@step
def broadcast_to(x, shape, dtype=None):
    if len(shape) != x.ndim:
        raise KernelUsageError(f"nl.broadcast_to needs a shape of the same rank as x ({x.ndim}), got {list(shape)}")
    return _new_tile(memory.broadcast_values(memory.read(x, "nl.broadcast_to", "x"), shape), dtype or x.dtype,
                     "nl.broadcast_to")


# ------------------------------------------------------------------------------ random numbers
# They lower to the Vector engine's generators as nisa.rand2 / set_rng_seed / dropout do (isa/random.py,
# core/random.py).

def rand(shape, dtype, buffer=sbuf, name=""):
    """A new tensor of uniform values in [0, 1), cast to ``dtype``."""
    api = "nl.rand"
    out = allocate(shape, dtype, _buffer(buffer), name, api, fill=None)
    memory.write(out, prng.uniform(current_run(api), "vector", tuple(out.shape)), api)
    return out


def random_seed(seed):
    """Seed ``rand``/``dropout`` from a [1, 1] SBUF/PSUM tensor holding a 32-bit value."""
    seed_vector_engine(seed, "nl.random_seed")


def dropout(x, rate, dtype=None):
    """A new SBUF tensor: ``x`` with each element zeroed with probability ``rate`` (kept values unscaled)."""
    api = "nl.dropout"
    return _new_tile(dropped(x, rate, api), dtype or x.dtype, api)


_language.operator_constants(globals())
__getattr__ = refuse_unknown("nki.language")
