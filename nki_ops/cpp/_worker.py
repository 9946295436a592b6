"""Checked mode's worker process: where the emulated ops of one compute library run, so that a kernel
that faults (a null pointer, a runaway recursion, a write into a TCM guard page, an abort) ends the
worker instead of Python. The fault comes back as a ``CustomOpError`` naming the op, the core, the
signal and, when the line tables allow, the source line; the next call starts a new worker.

The worker is a small Python process that loads the compute library and runs its generated
``neuron_emulation_serve`` loop (``cpp_ops/emulation/include/neuron_emulation/driver.hpp``). Each call
copies the inputs into a shared-memory arena, sends the op's index over a socket, and copies the output
back when the reply comes; what the kernel prints is forwarded to ``sys.stdout`` and ``sys.stderr``.
"""

from __future__ import annotations

import atexit
import codecs
import ctypes
import mmap
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from ._build import CPP_OPS_ROOT

# The worker: Python without site packages, loading the library and handing it the socket and the arena.
HELPER = ("import ctypes, sys; "
          "sys.exit(ctypes.CDLL(sys.argv[1]).neuron_emulation_serve(int(sys.argv[2]), int(sys.argv[3])))")
TORCH_LIBRARIES = Path(torch.__file__).parent / "lib"  # the compute library links libc10
ALIGNMENT = 64
MIN_ARENA_BYTES = 1 << 20
FAULT_FRAMES = 16
REQUEST = struct.Struct("<iiQQQQ")  # neuron_emulation::Request
REPLY = struct.Struct("<i")
BASE = struct.Struct("<Q")


# The layouts of neuron_emulation's TensorDesc, ArgumentDesc and CallDesc, with each pointer replaced by
# an offset into the arena (the worker maps the arena at its own address and relocates them).
class WireTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("sizes", ctypes.c_uint64), ("name", ctypes.c_uint64)]


class WireArgument(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("tensor", WireTensor), ("real", ctypes.c_double),
                ("integer", ctypes.c_int64)]


class WireCall(ctypes.Structure):
    _fields_ = [("op", ctypes.c_uint64), ("num_args", ctypes.c_int32), ("args", ctypes.c_uint64),
                ("out", WireTensor), ("multicore", ctypes.c_int32), ("core_count", ctypes.c_int32),
                ("checks", ctypes.c_int32), ("tcm_pool_bytes", ctypes.c_int64)]


class FaultRecord(ctypes.Structure):  # neuron_emulation::FaultRecord
    _fields_ = [("signal", ctypes.c_int32), ("core", ctypes.c_int32), ("kind", ctypes.c_int32),
                ("access", ctypes.c_int32), ("address", ctypes.c_uint64), ("block_bytes", ctypes.c_int64),
                ("block_offset", ctypes.c_int64), ("frame_count", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("frames", ctypes.c_uint64 * FAULT_FRAMES)]


TCM_OVERRUN, TCM_UNDERRUN, STACK_OVERFLOW = 1, 2, 3
ACCESS = {0: "an access", 1: "a read", 2: "a write"}


def _align(offset: int, alignment: int = ALIGNMENT) -> int:
    return (offset + alignment - 1) // alignment * alignment


def _signal_text(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    return f"{name} ({signal.strsignal(number)})"


def describe_fault(op: str, core_label: str | None, record: FaultRecord, returncode: int) -> str:
    """The first line of a fault's report: op, core, signal and what the address says about it."""
    number = record.signal or (-returncode if returncode < 0 else 0)
    if number == 0:
        return (f"{op}: the checked-mode worker process running it exited with status {returncode} "
                "(exit() or _exit() in the kernel?)")
    if not record.signal:  # no handler ran: the worker was killed from outside
        return (f"{op}: the checked-mode worker process running it was killed by {_signal_text(number)} "
                "(out of memory, or killed by another process)")
    where = f"{op} ({core_label})" if core_label else f"{op} (outside the kernel)"
    access = ACCESS.get(record.access, "an access")
    name = _signal_text(number)
    if record.kind == TCM_OVERRUN:
        return (f"{where}: TCM block overrun: {access} past the end of a {record.block_bytes}-byte TCM block, at "
                f"byte {record.block_offset} of it ({name} in the guard page after the block)")
    if record.kind == TCM_UNDERRUN:
        return (f"{where}: TCM block underrun: {access} before the start of a {record.block_bytes}-byte TCM block, "
                f"at byte {record.block_offset} of it ({name} in the guard page before the block)")
    if record.kind == STACK_OVERFLOW:
        return f"{where}: stack overflow, a runaway or too deep recursion ({name} at address {record.address:#x})"
    if number in (signal.SIGSEGV, signal.SIGBUS):
        target = "a null pointer dereference" if record.address < 4096 else "memory the kernel does not own"
        return f"{where}: {name}: {access} at address {record.address:#x}, {target}"
    if number == signal.SIGABRT:
        return (f"{where}: {name}: the kernel aborted (abort(), a failed assert, an uncaught exception, or heap "
                "corruption found by the C library)")
    return f"{where}: {name}"


def source_line(library: Path, base: int, record: FaultRecord) -> str | None:
    """``file:line in function`` of the innermost frame of the fault in the op's own sources, via addr2line."""
    addr2line = shutil.which("addr2line")
    if addr2line is None or base == 0:
        return None
    size = library.stat().st_size
    for index in range(min(record.frame_count, FAULT_FRAMES)):
        offset = record.frames[index] - base
        if not 0 < offset < size:
            continue
        # frames[0] is the faulting instruction; the others are return addresses, just past their call.
        address = offset if index == 0 else offset - 1
        result = subprocess.run([addr2line, "-e", str(library), "-f", "-C", "-i", f"{address:#x}"],
                                check=False, capture_output=True, text=True, timeout=30)
        lines = result.stdout.splitlines()
        # Pairs of function and file:line, innermost inlined call first.
        for function, location in zip(lines[::2], lines[1::2]):
            file = location.split(" (discriminator")[0].rsplit(":", 1)[0]
            if file == "??" or file.startswith(("/usr/", str(CPP_OPS_ROOT / "emulation"))):
                continue
            return f"{location.split(' (discriminator')[0]} in {function}"
    return None


class Worker:
    """The worker process of one compute library, started at its first checked call and after a fault."""

    def __init__(self, library: Path, dtype_codes: dict):
        self.library = library
        self.dtype_codes = dtype_codes
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._process: subprocess.Popen | None = None
        self._arena_file = None
        self._arena: mmap.mmap | None = None
        self._anchor = None  # a ctypes view that gives the arena's address
        _WORKERS.append(self)

    def _forget_inherited(self) -> None:
        """In a forked child: the parent's worker and arena are the parent's; this process starts its own."""
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._process = self._arena_file = self._arena = self._anchor = None
        self._socket = self._selector = None
        self._outputs = {}

    def _arena_address(self, needed: int) -> int:
        if self._arena is None or len(self._arena) < needed:
            size = max(MIN_ARENA_BYTES, _align(needed, 1 << 20), 2 * len(self._arena) if self._arena else 0)
            if self._arena_file is None:
                if hasattr(os, "memfd_create"):
                    self._arena_file = os.memfd_create("nki-ops-worker-arena")
                else:
                    with tempfile.TemporaryFile() as backing:  # already unlinked: only the descriptors hold it
                        self._arena_file = os.dup(backing.fileno())
            os.ftruncate(self._arena_file, size)
            self._anchor = None
            if self._arena is not None:
                self._arena.close()
            self._arena = mmap.mmap(self._arena_file, size)
            self._anchor = ctypes.c_char.from_buffer(self._arena)
        return ctypes.addressof(self._anchor)

    def _start(self) -> None:
        self._arena_address(MIN_ARENA_BYTES)
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(TORCH_LIBRARIES), env.get("LD_LIBRARY_PATH")]))
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", HELPER, str(self.library), str(theirs.fileno()), str(self._arena_file)],
            pass_fds=(theirs.fileno(), self._arena_file), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env)
        theirs.close()
        self._socket = ours
        self._selector = selectors.DefaultSelector()
        self._selector.register(ours, selectors.EVENT_READ)
        self._outputs = {}  # the worker's stdout and stderr pipes: (decoder, name of the sys stream they go to)
        for pipe, stream in ((self._process.stdout, "stdout"), (self._process.stderr, "stderr")):
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe, selectors.EVENT_READ)
            self._outputs[pipe] = (codecs.getincrementaldecoder("utf-8")(errors="replace"), stream)
        self._stderr_tail = ""
        started = self._receive(BASE.size)
        if started is None:
            self._stop()
            raise RuntimeError(f"the checked-mode worker for {self.library} did not start:\n{self._stderr_tail}")
        self._base = BASE.unpack(started)[0]

    def _forward(self, pipe) -> bool:
        """Pass what the worker printed on to this process's stream; False when there was nothing to read."""
        try:
            data = os.read(pipe.fileno(), 65536)
        except BlockingIOError:
            return False
        decoder, name = self._outputs[pipe]
        text = decoder.decode(data, final=not data)
        if name == "stderr":
            self._stderr_tail = (self._stderr_tail + text)[-4000:]
        stream = getattr(sys, name)
        if text and stream is not None:
            stream.write(text)
            stream.flush()
        return bool(data)

    def _receive(self, size: int) -> bytes | None:
        """``size`` bytes from the worker, forwarding its output meanwhile; None when it ended first."""
        received = b""
        while len(received) < size:
            for key, _ in self._selector.select():
                if key.fileobj is self._socket:
                    chunk = self._socket.recv(size - len(received))
                    if not chunk:
                        return None
                    received += chunk
                elif not self._forward(key.fileobj):  # end of file: the worker is ending
                    self._selector.unregister(key.fileobj)
        # The worker flushes its output before it replies: pass on what select() did not report yet.
        for pipe in self._outputs:
            while self._forward(pipe):
                pass
        return received

    def _stop(self) -> int:
        """End the worker (it ends by itself when its socket closes) and return its exit status."""
        process, self._process = self._process, None
        self._socket.close()
        try:
            returncode = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
        for pipe in self._outputs:  # what it printed before it ended
            os.set_blocking(pipe.fileno(), True)
            while self._forward(pipe):
                pass
            pipe.close()
        self._selector.close()
        return returncode

    def call(self, op_index: int, op: str, arguments: list, out: torch.Tensor, *, multicore: bool, core_count: int,
             tcm_pool_bytes: int, error_bytes: int) -> str | None:
        """Run one call in the worker; returns the error text of a broken rule, or None. A fault raises
        ``WorkerFault`` with its report."""
        if self._owner != os.getpid():
            self._forget_inherited()
        with self._lock:
            try:
                return self._call(op_index, op, arguments, out, multicore, core_count, tcm_pool_bytes, error_bytes)
            except BaseException:
                # Interrupted (Ctrl-C) or failed mid-call: the worker may still be running the kernel.
                if self._process is not None:
                    self._process.kill()
                    self._stop()
                raise

    def _call(self, op_index, op, arguments, out, multicore, core_count, tcm_pool_bytes, error_bytes):
        tensors = [(value, name) for kind, value, name in arguments if kind == 0] + [(out, "the output")]
        # Layout: fault record, call, arguments, then per tensor its sizes, name and data, the op name, the error.
        call_offset = _align(ctypes.sizeof(FaultRecord))
        args_offset = _align(call_offset + ctypes.sizeof(WireCall), 8)
        offset = args_offset + ctypes.sizeof(WireArgument) * max(1, len(arguments))
        placed = []
        for t, name in tensors:
            sizes_offset = _align(offset, 8)
            name_offset = sizes_offset + 8 * max(1, t.dim())
            encoded = name.encode()
            data_offset = _align(name_offset + len(encoded) + 1)
            offset = data_offset + t.numel() * t.element_size()
            placed.append((t, sizes_offset, name_offset, encoded, data_offset))
        op_offset = offset
        error_offset = _align(op_offset + len(op) + 1)
        needed = error_offset + error_bytes

        if self._process is not None and self._process.poll() is not None:
            self._stop()  # ended while idle (killed from outside): start another
        if self._process is None:
            self._start()
        base = self._arena_address(needed)
        ctypes.memset(base, 0, ctypes.sizeof(FaultRecord))
        descs = []  # of the tensor arguments in order, then of the output
        for index, (t, sizes_offset, name_offset, encoded, data_offset) in enumerate(placed):
            (ctypes.c_int64 * max(1, t.dim())).from_address(base + sizes_offset)[:t.dim()] = list(t.shape)
            ctypes.memmove(base + name_offset, encoded + b"\0", len(encoded) + 1)
            if index < len(placed) - 1 and t.numel():
                ctypes.memmove(base + data_offset, t.data_ptr(), t.numel() * t.element_size())
            descs.append(WireTensor(data_offset, self.dtype_codes[t.dtype], t.dim(), sizes_offset, name_offset))
        ctypes.memmove(base + op_offset, op.encode() + b"\0", len(op) + 1)
        wire_args = (WireArgument * max(1, len(arguments))).from_address(base + args_offset)
        tensor_descs = iter(descs)
        for wire, (kind, value, _) in zip(wire_args, arguments):
            wire.kind = kind
            if kind == 0:
                wire.tensor = next(tensor_descs)
            elif kind == 1:
                wire.real = value
            else:
                wire.integer = value
        wire_call = WireCall.from_address(base + call_offset)
        wire_call.op, wire_call.num_args, wire_call.args = op_offset, len(arguments), args_offset
        wire_call.out = descs[-1]
        wire_call.multicore, wire_call.core_count, wire_call.checks = int(multicore), core_count, 1
        wire_call.tcm_pool_bytes = tcm_pool_bytes
        del wire_args, wire_call

        try:
            self._socket.sendall(REQUEST.pack(op_index, 0, len(self._arena), call_offset, error_offset, error_bytes))
            reply = self._receive(REPLY.size)
        except (BrokenPipeError, ConnectionResetError):
            reply = None
        if reply is None:
            record = FaultRecord.from_buffer_copy(self._arena)
            returncode = self._stop()
            core = record.core
            label = None if core < 0 else f"core {core} of {core_count}" if multicore else "single core"
            message = describe_fault(op, label, record, returncode)
            line = source_line(self.library, self._base, record) if record.signal else None
            raise WorkerFault(message + (f"\n  at {line}" if line else ""))
        if REPLY.unpack(reply)[0] != 0:
            return ctypes.string_at(base + error_offset).decode(errors="replace")
        if out.numel():
            ctypes.memmove(out.data_ptr(), base + placed[-1][4], out.numel() * out.element_size())
        return None


class WorkerFault(RuntimeError):
    """A kernel ended its worker process; the message is the report."""


_WORKERS: list[Worker] = []


@atexit.register
def _stop_workers() -> None:
    for worker in _WORKERS:
        if worker._process is not None and worker._owner == os.getpid():
            worker._stop()
