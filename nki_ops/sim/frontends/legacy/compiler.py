"""``neuronxcc.nki.compiler``: direct allocation of SBUF and PSUM, and the kernel decorators.

``buffer=ncc.sbuf.mod_alloc(base_addr=..., num_free_tiles=(2,))`` places every logical tile of a
tensor (one per index of its leading block dimensions) at an address the kernel chooses; many
logical tiles may share one physical tile. The simulator evaluates the allocation function for
every logical tile, as the compiler does, checks each address against the ISA rules, and then
tracks which tile holds data at each address: reading a tile whose addresses another tile wrote
since is an error naming both allocation sites (on the device it reads the other tile's data).

The legacy compiler traces a loop body once, so an allocation inside ``affine_range`` /
``sequential_range`` (or ``range``) is one allocation whose address is computed once, however
the Python state it is computed from changes between the simulator's real iterations. An
allocation made again from the same place in the kernel (the same call stack, the same
``static_range`` iterations) therefore keeps the placement it got first.
"""

from __future__ import annotations

import contextlib
import math
import sys

import numpy as np

from ... import core
from ...core import liveness
from ...core.errors import SIM_DIR, CapacityError, KernelUsageError, refuse_unknown
from .kernel import Kernel

__all__ = ["sbuf", "psum", "skip_middle_end_transformations", "enable_stack_allocator", "force_auto_alloc",
           "no_reorder", "multi_buffer", "allocation_scope"]

PSUM_BANKS = 8


class _Placement(core.Placement):
    """``buffer=`` of a directly allocated tensor: ``func(idx=, pdim_size=, fdim_size=)`` gives
    each logical tile's address."""

    __slots__ = ("func", "api")

    def __init__(self, base: core.Buffer, func, api: str):
        super().__init__(base)
        self.func, self.api = func, api

    def __repr__(self) -> str:
        return f"{self.api}(...)"

    def allocate(self, run, tensor: core.Tensor, tile_bytes: int):
        if "force_auto_alloc" in run.frontend.get("directives", ()):
            return core.memory.auto_allocation(run, tensor, tile_bytes)
        blocks = tensor.shape[:tensor.pdim]
        pdim_size = tensor.shape[tensor.pdim]
        memo = run.frontend.setdefault("placements", {})
        key = (_trace_key(run), tensor.shape, tensor.pdim, tensor.dtype.str, self.api)
        places = memo.get(key)
        if places is None:
            places = [self._place(idx, pdim_size, tile_bytes, tensor) for idx in np.ndindex(*blocks)]
            memo[key] = places
        recs = [liveness.DirectAllocation(run, self.space, tile_bytes, tensor.name, tensor.site, place)
                for place in places]
        if not blocks:
            return recs[0]
        array = np.empty(len(recs), object)
        array[:] = recs
        return liveness.Blocks(array.reshape(blocks))

    def _place(self, idx, pdim_size: int, fdim_size: int, tensor) -> tuple[int, int, int, int]:
        location = self.func(idx=tuple(int(i) for i in idx), pdim_size=pdim_size, fdim_size=fdim_size)
        return (_psum_place if self.space == "psum" else _sbuf_place)(self.api, tensor, idx, location, pdim_size,
                                                                       fdim_size)


def _trace_key(run) -> tuple:
    """Where in the kernel this allocation is made: the user call stack and the iterations of the
    enclosing ``static_range`` loops (unrolled by the compiler, so each is a separate allocation)."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        if not frame.f_code.co_filename.startswith(SIM_DIR):
            frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(frames), tuple(run.frontend.get("unrolled", ()))


def _location(api: str, location, size: int) -> tuple[int, ...]:
    if not isinstance(location, (tuple, list)) or len(location) != size or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in location):
        what = "(start_partition, byte_addr)" if size == 2 else "(bank, start_partition, byte_addr)"
        raise KernelUsageError(f"{api}: the allocation function must return {what} as ints, got {location!r}")
    return tuple(int(v) for v in location)


def _check_partition(api: str, tensor, idx, start: int, pdim_size: int) -> None:
    # ISA rule: 65-128 partitions start at 0, 33-64 at 0 or 64, 1-32 at 0, 32, 64 or 96.
    allowed = (0,) if pdim_size > 64 else (0, 64) if pdim_size > 32 else (0, 32, 64, 96)
    if start not in allowed:
        raise CapacityError(f"{api}: tile {tuple(int(i) for i in idx)} of '{tensor.name}' has {pdim_size} partitions "
                            f"and starts at partition {start}; it must start at one of {list(allowed)}")


def _sbuf_place(api, tensor, idx, location, pdim_size, fdim_size):
    start, addr = _location(api, location, 2)
    _check_partition(api, tensor, idx, start, pdim_size)
    run = core.current_run(api)
    usable = run.config.sbuf_budget_bytes or run.config.sbuf_usable
    if addr < 0 or addr + fdim_size > usable:
        raise CapacityError(f"{api}: tile {tuple(int(i) for i in idx)} of '{tensor.name}' at byte_addr {addr} needs "
                            f"bytes [{addr}, {addr + fdim_size}) of each partition; SBUF allocations must lie in "
                            f"[0, {usable}) on {run.config.target} (the compiler reserves the rest)")
    return start, start + pdim_size, addr, addr + fdim_size


def _psum_place(api, tensor, idx, location, pdim_size, fdim_size):
    bank, start, addr = _location(api, location, 3)
    where = f"tile {tuple(int(i) for i in idx)} of '{tensor.name}'"
    if not 0 <= bank < PSUM_BANKS:
        raise CapacityError(f"{api}: {where} is placed in PSUM bank {bank}; banks are 0-{PSUM_BANKS - 1}")
    if start != 0 or addr != 0:
        raise CapacityError(f"{api}: {where} has start_partition {start} and byte_addr {addr}; a PSUM tile must "
                            f"start at partition 0 and byte 0 of its bank (one tile per bank)")
    if fdim_size > core.PSUM_BANK_BYTES:
        raise CapacityError(f"{api}: {where} needs {fdim_size} bytes per partition; a PSUM tile cannot cross "
                            f"its {core.PSUM_BANK_BYTES}-byte bank")
    offset = bank * core.PSUM_BANK_BYTES
    return 0, pdim_size, offset, offset + fdim_size


def _modulo(base: int, tiles: tuple, scale: int, idx: tuple) -> int:
    """``base + scale * (the linear index of idx modulo tiles)``: the documented modulo allocation.
    Only as many leading block indices as ``tiles`` has entries take part; no tiles means one."""
    tiles = tuple(tiles) or (1,) * len(idx)
    linear = 0
    for axis, (i, n) in enumerate(zip(idx, tiles)):
        linear += (i % n) * math.prod(tiles[axis + 1:])
    return base + linear * scale


def _tiles(api: str, name: str, value) -> tuple[int, ...]:
    value = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in value):
        raise KernelUsageError(f"{api}: {name} must be a tuple of positive ints, got {value!r}")
    return value


class _Space:
    """``ncc.sbuf`` / ``ncc.psum``: the allocators of one on-chip buffer."""

    def __init__(self, base: core.Buffer):
        self._base = base
        self._name = f"ncc.{base.space}"

    def auto_alloc(self) -> core.Buffer:
        """Compiler placement: the same as ``nl.sbuf`` / ``nl.psum``."""
        return self._base

    def alloc(self, func) -> _Placement:
        """Place each logical tile where ``func(idx, pdim_size, fdim_size)`` says."""
        if not callable(func):
            raise KernelUsageError(f"{self._name}.alloc needs an allocation function, got {type(func).__name__}")
        return _Placement(self._base, func, f"{self._name}.alloc")


class _Sbuf(_Space):
    def mod_alloc(self, *, base_addr, base_partition=0, num_par_tiles=(), num_free_tiles=()) -> _Placement:
        """Logical tile ``idx`` at partition ``base_partition + pdim_size * (idx mod num_par_tiles)`` and
        byte ``base_addr + fdim_size * (idx mod num_free_tiles)``."""
        api = "ncc.sbuf.mod_alloc"
        par, free = _tiles(api, "num_par_tiles", num_par_tiles), _tiles(api, "num_free_tiles", num_free_tiles)

        def place(idx, pdim_size, fdim_size):
            return (_modulo(base_partition, par, pdim_size, idx),
                    _modulo(base_addr, free, fdim_size, idx))
        return _Placement(self._base, place, api)


class _Psum(_Space):
    def mod_alloc(self, *, base_bank, base_addr=0, base_partition=0, num_bank_tiles=(), num_par_tiles=(),
                  num_free_tiles=()) -> _Placement:
        """Logical tile ``idx`` in bank ``base_bank + (idx mod num_bank_tiles)``, at the partition and
        byte offsets the same modulo rule gives (both must be 0 in a bank)."""
        api = "ncc.psum.mod_alloc"
        banks = _tiles(api, "num_bank_tiles", num_bank_tiles)
        par, free = _tiles(api, "num_par_tiles", num_par_tiles), _tiles(api, "num_free_tiles", num_free_tiles)

        def place(idx, pdim_size, fdim_size):
            return (_modulo(base_bank, banks, 1, idx),
                    _modulo(base_partition, par, pdim_size, idx),
                    _modulo(base_addr, free, fdim_size, idx))
        return _Placement(self._base, place, api)


sbuf = _Sbuf(core.sbuf)
psum = _Psum(core.psum)


# ------------------------------------------------------------------------------ kernel decorators

def _directive(name: str, doc: str):
    def decorator(func=None, **options):
        allowed = {"log_level"} if name == "enable_stack_allocator" else set()
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise KernelUsageError(f"nki.compiler.{name}() got unexpected keyword argument(s) {', '.join(unknown)}")
        if func is None:
            return lambda f: decorator(f)
        kernel = func if isinstance(func, Kernel) else Kernel(func, mode="trace")
        return kernel.replace(directives=kernel.directives | {name})
    decorator.__name__ = name
    decorator.__doc__ = doc
    return decorator


skip_middle_end_transformations = _directive(
    "skip_middle_end_transformations", "Skip the compiler's middle-end passes (no effect on simulated values).")
enable_stack_allocator = _directive(
    "enable_stack_allocator", "Allocate SBUF and PSUM with the stack allocator (no effect on simulated values).")
force_auto_alloc = _directive(
    "force_auto_alloc", "Ignore the kernel's direct allocations: every tensor is placed by the compiler.")


class _ScopeDirective(contextlib.AbstractContextManager):
    """A lexical-scope directive (``directives=`` of a loop, or ``with``): scheduling only."""

    def __init__(self, name: str, **params):
        self.name, self.params = name, params

    def __exit__(self, *exc):
        return None

    def __repr__(self) -> str:
        return f"nki.compiler.{self.name}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"


def no_reorder() -> _ScopeDirective:
    """Keep the instructions of the scope in program order (the simulator always does)."""
    return _ScopeDirective("no_reorder")


def multi_buffer(factor: int = 2) -> _ScopeDirective:
    """Let the compiler allocate ``factor`` buffers for the tensors of the scope (a scheduling hint)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, np.integer)) or factor < 1:
        raise KernelUsageError(f"nki.compiler.multi_buffer: factor must be a positive int, got {factor!r}")
    return _ScopeDirective("multi_buffer", factor=int(factor))


def allocation_scope() -> _ScopeDirective:
    """An allocation scope (a compiler allocation hint)."""
    return _ScopeDirective("allocation_scope")


__getattr__ = refuse_unknown("nki.compiler")
