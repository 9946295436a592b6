"""Building a custom-op library for the CPU emulation, the way ``custom_op.load`` does on a Neuron host.

1. Each compute source is compiled alone as C++14 against the emulated device headers
   (``cpp_ops/emulation/include``): a device API the GpSimd library lacks fails here, fast,
   and every function's stack frame is measured (``-fstack-usage``) against the device's
   stack (about 8 KiB, or ``-DSTACK_SIZE=<bytes>`` up to 400 KB).
2. The shape sources are built with the real PyTorch through ``torch.utils.cpp_extension``
   plus the emulated ``torchneuron/register.h``; loading them registers each shape function
   as the op ``<namespace>::<op>``, and the op list is read back from the library (through the lookups a
   generated source compiles from ``neuron_emulation/shape_registry.h``, which needs no torch header).
3. A generated entry file declares every compute function from its op's schema (so a
   mismatched name or signature fails to link, as it fails to build for the device) and
   wraps it in the emulation's multicore driver; it is built with the compute sources,
   again through ``cpp_extension`` with the emulated headers first on the include path.
4. Shape library, compute library and ``metadata.json`` (which records each library's SHA-256)
   are packed with ``ar`` into ``lib<name>.so``, the same container ``custom_op.load`` writes on
   a Neuron host. ``unpack`` checks those hashes and extracts into a folder only this user can
   write to, so neither a corrupted archive nor another local user's files get loaded.

``build.py`` skips a library when the hash of its sources, nearby headers, the emulation
headers, flags, torch version and host CPU matches the one its last successful build recorded.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

CPP_OPS_ROOT = Path(__file__).resolve().parents[2] / "cpp_ops"
DEVICE_INCLUDE = CPP_OPS_ROOT / "emulation" / "include"
HOST_INCLUDE = CPP_OPS_ROOT / "emulation" / "host_include"
FORMAT = "nki-ops-gpsimd-emulation/2"
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".inc")
# -march=native: the emulation runs on this host only (the CPU's features are part of the build hash);
# -ffp-contract=off: no fused multiply-adds, so results round like the torch references;
# -g1: line tables (no effect on the code), so a kernel that faults is reported with its source line.
COMPUTE_CFLAGS = ["-std=c++14", "-O3", "-march=native", "-ffp-contract=off", "-g1", "-fvisibility=hidden",
                  "-fvisibility-inlines-hidden", "-DNEURON_EMULATION=1"]
SHAPE_CFLAGS = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"]

# C++ parameter type of a compute function for each schema argument type it may take.
PARAMETER_TYPES = {"Tensor": "const torch::Tensor&", "float": "double", "int": "int64_t",
                   "Scalar": "const torch::Scalar&"}
ARGUMENT_READERS = {"Tensor": "tensor", "float": "real", "int": "integer", "Scalar": "scalar"}


class BuildError(RuntimeError):
    """A custom-op library failed to build; the message holds the compiler's errors (file:line) and command."""


@dataclass(frozen=True)
class OpInfo:
    namespace: str
    op: str
    compute: str
    schema: str


@dataclass(frozen=True)
class Metadata:
    format: str
    name: str
    multicore: bool
    ops: tuple[OpInfo, ...]
    shape_library: str
    compute_library: str
    torch_version: str
    sha256: dict[str, str]  # of the shape and compute libraries, by file name


    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Metadata":
        raw = json.loads(text)
        if raw.get("format") != FORMAT:
            raise ValueError(f"not an nki-ops CPU-emulation library of this version (format {raw.get('format')!r}, "
                             f"expected {FORMAT!r}): rebuild it")
        raw["ops"] = tuple(OpInfo(**op) for op in raw["ops"])
        return cls(**raw)


def archive_path(build_directory: str | os.PathLike, name: str) -> Path:
    return Path(build_directory) / f"lib{name}.so"


def linked_libraries(work_dir: Path, name: str) -> tuple[Path, Path]:
    """The shape and compute libraries ``build`` links in ``work_dir`` (ninja relinks one that is missing)."""
    return work_dir / "shape" / f"lib{name}shapefcn.so", work_dir / "compute" / f"lib{name}customop.so"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_hash(name, compute_srcs, shape_srcs, extra_cflags, extra_include_paths, multicore) -> str:
    """What a build depends on: sources, headers next to them and in include paths, the emulation, flags, torch."""
    digest = hashlib.sha256()
    digest.update(host_cpu().encode())
    digest.update(json.dumps([FORMAT, name, list(map(str, compute_srcs)), list(map(str, shape_srcs)),
                              list(extra_cflags), list(map(str, extra_include_paths)), multicore,
                              torch.__version__, COMPUTE_CFLAGS, SHAPE_CFLAGS]).encode())
    folders = {Path(s).resolve().parent for s in [*compute_srcs, *shape_srcs]} | {Path(p) for p in extra_include_paths}
    headers = sorted(p for folder in folders if folder.is_dir()
                     for p in folder.rglob("*") if p.suffix in HEADER_SUFFIXES)
    emulation = sorted(p for p in (CPP_OPS_ROOT / "emulation").rglob("*") if p.is_file())
    for path in [*map(Path, compute_srcs), *map(Path, shape_srcs), *headers, *emulation, Path(__file__)]:
        digest.update(str(path).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def host_cpu() -> str:
    """The host CPU's model and feature flags, on which -march=native code depends."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted) or platform.processor() or platform.machine()


def compiler_errors(output: str) -> list[str]:
    """The ``file:line:col: error: ...`` lines of a compiler's output."""
    return [line for line in output.splitlines() if re.match(r"^[^\s:][^:]*:\d+(:\d+)?: (fatal )?error", line)
            or "undefined reference to" in line]


def _raise_build_error(what: str, output: str, command: str) -> None:
    errors = compiler_errors(output)
    summary = "\n".join(errors) if errors else output.strip()
    raise BuildError(f"{what} failed to build:\n{summary}\n\nfailing command:\n{command}\n\n"
                     f"full compiler output:\n{output.strip()}")


DEFAULT_STACK_BYTES = 8 * 1024
MAX_STACK_BYTES = 400 * 1024


def stack_limit(extra_cflags) -> int:
    """The device stack a kernel gets: about 8 KiB, or ``-DSTACK_SIZE=<bytes>`` (slower memory, at most 400 KB)."""
    for flag in extra_cflags:
        match = re.fullmatch(r"-DSTACK_SIZE=(\d+)", flag)
        if match:
            if int(match.group(1)) > MAX_STACK_BYTES:
                raise BuildError(f"{flag}: the GpSimd stack can be at most {MAX_STACK_BYTES} bytes")
            return int(match.group(1))
    return DEFAULT_STACK_BYTES


def oversized_frames(stack_usage: str, limit: int) -> list[str]:
    """``-fstack-usage`` lines (``file:line:col:function<TAB>bytes<TAB>kind``) whose frame exceeds ``limit``."""
    found = []
    for line in stack_usage.splitlines():
        location, size, _kind = line.rsplit("\t", 2)
        file, line_number, _column, function = location.split(":", 3)
        if int(size) > limit and not file.startswith(str(CPP_OPS_ROOT / "emulation")):
            found.append(f"{file}:{line_number}: {function} uses a {size}-byte stack frame")
    return found


def precheck(compute_srcs, extra_cflags, extra_include_paths, verbose: bool) -> None:
    """Compile each compute source alone against the device headers and measure its stack frames."""
    compiler = os.environ.get("CXX", "c++")
    limit = stack_limit(extra_cflags)
    with tempfile.TemporaryDirectory() as scratch:
        for i, source in enumerate(compute_srcs):
            obj = Path(scratch) / f"{i}.o"
            command = [compiler, *COMPUTE_CFLAGS, "-fstack-usage", f"-I{DEVICE_INCLUDE}",
                       *(f"-I{p}" for p in extra_include_paths), *extra_cflags, "-c", str(source), "-o", str(obj)]
            if verbose:
                print(shlex.join(command), flush=True)
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                _raise_build_error(f"compute source {source}", result.stdout + result.stderr, shlex.join(command))
            too_big = oversized_frames(obj.with_suffix(".su").read_text(), limit)
            if too_big:
                raise BuildError(
                    "\n".join(too_big) + f"\nThe GpSimd stack holds about {limit} bytes; overflowing it is a GPSIMD "
                    "error on the device. Keep large buffers in TCM (tcm_malloc), or pass "
                    f"extra_cflags=['-DSTACK_SIZE=<bytes>'] (at most {MAX_STACK_BYTES}; slower memory). "
                    "(Frames are measured with this host's compiler: the device's differ somewhat.)")


def _cpp_extension_build(name: str, sources, build_dir: Path, *, cflags, include_paths, ldflags=(),
                         verbose: bool) -> Path:
    """Build (and load) a plain shared library with torch.utils.cpp_extension; ninja skips unchanged objects."""
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        path = cpp_extension.load(name=name, sources=[str(s) for s in sources], extra_cflags=list(cflags),
                                  extra_ldflags=list(ldflags), extra_include_paths=[str(p) for p in include_paths],
                                  build_directory=str(build_dir), verbose=verbose, is_python_module=False)
    except RuntimeError as error:
        output = str(error)
        failed = re.search(r"FAILED: .*\n(.*)\n", output)
        _raise_build_error(name, output, failed.group(1) if failed else f"ninja -v (in {build_dir})")
    return Path(path)


def read_ops(shape_library: Path) -> tuple[OpInfo, ...]:
    """The ops a loaded shape library registered, with the schemas torch derived from the shape functions."""
    lib = ctypes.CDLL(str(shape_library))
    for fn in ("neuron_emulation_op_namespace", "neuron_emulation_op_name", "neuron_emulation_compute_name"):
        getattr(lib, fn).restype = ctypes.c_char_p
    ops = []
    for i in range(lib.neuron_emulation_num_ops()):
        namespace = lib.neuron_emulation_op_namespace(i).decode()
        op = lib.neuron_emulation_op_name(i).decode()
        schema = torch._C._get_schema(f"{namespace}::{op}", "")
        ops.append(OpInfo(namespace, op, lib.neuron_emulation_compute_name(i).decode(), str(schema)))
    if not ops:
        raise BuildError(f"{shape_library.name} registers no op: the shape sources need a NEURON_LIBRARY(ns, m) block "
                         "with m.def(\"op\", &shape_function, \"compute_function\")")
    return tuple(ops)


def entry_source(ops: tuple[OpInfo, ...]) -> str:
    """The generated C++ that declares each compute function from its schema and exports a driver entry point
    per op (the fast mode calls it in-process) and ``neuron_emulation_serve``, the checked mode's worker loop,
    which takes ops by their index in ``ops``."""
    lines = ["// Generated by nki_ops.cpp: one entry point per op, running its compute function on the emulated cores,",
             "// and the worker loop that runs them in checked mode.",
             "#include <neuron_emulation/driver.hpp>", ""]
    for index, info in enumerate(ops):
        schema = torch._C.parse_schema(info.schema)
        if len(schema.returns) != 1 or str(schema.returns[0].type) != "Tensor":
            raise BuildError(f"{info.namespace}::{info.op}: a compute function returns exactly one Tensor, "
                             f"but the shape function returns {[str(r.type) for r in schema.returns]}")
        types = []
        for argument in schema.arguments:
            kind = str(argument.type)
            if kind not in PARAMETER_TYPES:
                raise BuildError(f"{info.namespace}::{info.op}: argument {argument.name!r} has type {kind}; a GpSimd "
                                 f"compute function takes only {', '.join(PARAMETER_TYPES)}")
            types.append(kind)
        params = ", ".join(PARAMETER_TYPES[t] for t in types)
        call_args = ", ".join(f"args.{ARGUMENT_READERS[t]}({i})" for i, t in enumerate(types))
        lines += [f"torch::Tensor {info.compute}({params});",
                  "namespace {",
                  f"torch::Tensor neuron_emulation_compute_{index}(const neuron_emulation::Arguments& args) {{",
                  f"  return {info.compute}({call_args});",
                  "}",
                  "}  // namespace",
                  f"NEURON_EMULATION_EXPORT int neuron_emulation_call_{info.op}(",
                  "    const neuron_emulation::CallDesc* call, char* error, size_t error_size) {",
                  f"  return neuron_emulation::run(call, error, error_size, neuron_emulation_compute_{index});",
                  "}", ""]
    table = ", ".join(f"neuron_emulation_compute_{index}" for index in range(len(ops)))
    lines += ["NEURON_EMULATION_EXPORT int neuron_emulation_serve(int channel, int arena) {",
              f"  static const neuron_emulation::ComputeFunction ops[] = {{{table}}};",
              f"  return neuron_emulation::serve(channel, arena, ops, {len(ops)});",
              "}", ""]
    return "\n".join(lines)


def build(name: str, compute_srcs, shape_srcs, *, extra_cflags=(), extra_include_paths=(), work_dir: Path,
          multicore: bool, verbose: bool = False) -> tuple[Path, Path, Metadata]:
    """Build both libraries into ``work_dir``; returns (shape library, compute library, metadata)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"a custom-op library name must be a C identifier, got {name!r}")
    if name == "builtin":
        raise ValueError("a custom-op library may not be named 'builtin'")
    for source in [*compute_srcs, *shape_srcs]:
        if not Path(source).is_file():
            raise FileNotFoundError(f"custom-op source not found: {source}")
    compute_srcs = [Path(s).resolve() for s in compute_srcs]
    shape_srcs = [Path(s).resolve() for s in shape_srcs]
    extra_include_paths = [Path(p).resolve() for p in extra_include_paths]

    precheck(compute_srcs, extra_cflags, extra_include_paths, verbose)

    work_dir.mkdir(parents=True, exist_ok=True)
    exports = work_dir / "shape_exports.cpp"
    _write_if_changed(exports, "#define NEURON_EMULATION_SHAPE_LIBRARY_EXPORTS\n"
                               "#include <neuron_emulation/shape_registry.h>\n")
    shape_path, compute_path = linked_libraries(work_dir, name)
    shape_library = _cpp_extension_build(shape_path.stem, [*shape_srcs, exports], shape_path.parent,
                                         cflags=SHAPE_CFLAGS, include_paths=[HOST_INCLUDE, *extra_include_paths],
                                         verbose=verbose)
    ops = read_ops(shape_library)

    entry = work_dir / "entry_points.cpp"
    _write_if_changed(entry, entry_source(ops))
    compute_library = _cpp_extension_build(
        compute_path.stem, [*compute_srcs, entry], compute_path.parent,
        cflags=[*COMPUTE_CFLAGS, *extra_cflags], include_paths=[DEVICE_INCLUDE, *extra_include_paths],
        ldflags=["-Wl,--no-undefined"], verbose=verbose)
    metadata = Metadata(FORMAT, name, multicore, ops, shape_library.name, compute_library.name, torch.__version__,
                        {library.name: file_sha256(library) for library in (shape_library, compute_library)})
    return shape_library, compute_library, metadata


def pack(archive: Path, shape_library: Path, compute_library: Path, metadata: Metadata) -> None:
    """Write ``lib<name>.so``: an ``ar`` archive of both libraries and metadata.json, as on a Neuron host."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=archive.parent) as staging:
        staging = Path(staging)
        for library in (shape_library, compute_library):
            (staging / library.name).write_bytes(library.read_bytes())
        (staging / "metadata.json").write_text(metadata.to_json())
        partial = staging / archive.name
        subprocess.run(["ar", "rcD", str(partial), shape_library.name, compute_library.name, "metadata.json"],
                       cwd=staging, check=True, capture_output=True)
        os.replace(partial, archive)


AR_MAGIC = b"!<arch>\n"


def read_archive(data: bytes, source: Path) -> dict[str, bytes]:
    """The members of a GNU ``ar`` archive (what ``pack`` writes) by name, without its symbol table."""
    if not data.startswith(AR_MAGIC):
        raise ValueError(f"{source} is not a custom-op library archive (it does not start with {AR_MAGIC!r})")
    members: dict[str, bytes] = {}
    long_names = b""
    position = len(AR_MAGIC)
    while position < len(data):
        header = data[position:position + 60]
        size_field = header[48:58].strip()
        if len(header) < 60 or header[58:60] != b"`\n" or not size_field.isdigit():
            raise ValueError(f"{source} is truncated or corrupted: no ar member header at byte {position}; rebuild it")
        size = int(size_field)
        body = data[position + 60:position + 60 + size]
        if len(body) != size:
            raise ValueError(f"{source} is truncated: a member of {size} bytes at byte {position} has only "
                             f"{len(body)}; rebuild it")
        position += 60 + size + size % 2
        name = header[:16].rstrip(b" ")
        if name == b"//":
            long_names = body
        elif name.startswith(b"/") and name[1:].isdigit():
            offset = int(name[1:])
            members[long_names[offset:long_names.find(b"/\n", offset)].decode(errors="replace")] = body
        elif name not in (b"/", b"/SYM64/"):
            members[name.removesuffix(b"/").decode(errors="replace")] = body
    return members


def extraction_root() -> Path:
    """Where archives are extracted: a folder of this user's in the temporary directory (``TMPDIR`` moves it)."""
    return Path(tempfile.gettempdir()) / f"nki-ops-custom-ops-{os.geteuid()}"


def private_folder(path: Path) -> Path:
    """``path``, created with mode 0700 if missing, after checking that no other user can have put files in it."""
    refusing = f"refusing to load custom-op libraries through {path}"
    parent = os.stat(path.parent)
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        raise PermissionError(f"{refusing}: its parent folder is writable by every user and not sticky (mode "
                              f"{parent.st_mode & 0o7777:04o}), so anyone could replace it; "
                              f"set TMPDIR to a private folder")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a folder"
        raise PermissionError(f"{refusing}: it is {kind}, not a folder this user created; remove it")
    if info.st_uid != os.geteuid():
        raise PermissionError(f"{refusing}: it belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}), "
                              "so its owner could plant libraries that would run as you. Remove it (as its owner or "
                              "root), or set TMPDIR to a private folder")
    if info.st_mode & 0o022:
        raise PermissionError(f"{refusing}: its mode is {info.st_mode & 0o777:04o}, so other users can write to it "
                              "and may have planted libraries in it; remove it (it is recreated private, mode 0700)")
    if info.st_mode & 0o077:  # ours, and only readable by others (as earlier versions made it): make it private
        os.chmod(path, 0o700)
    return path


def _holds(folder: Path, files: dict[str, bytes]) -> bool:
    """True when ``folder`` is a private folder of this user's holding exactly these bytes in regular files of its."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        return False
    for name, content in files.items():
        try:
            info = os.lstat(folder / name)
        except FileNotFoundError:
            return False
        if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size != len(content)
                or file_sha256(folder / name) != hashlib.sha256(content).hexdigest()):
            return False
    return True


def unpack(archive: Path) -> tuple[Path, Metadata]:
    """Check ``lib<name>.so`` against the hashes it records, and extract its libraries into a private folder
    named by its content hash (reused while it holds the same bytes); returns (folder, metadata)."""
    if not archive.is_file():
        raise FileNotFoundError(f"custom-op library not found: {archive}")
    data = archive.read_bytes()
    members = read_archive(data, archive)
    if "metadata.json" not in members:
        raise ValueError(f"{archive} is not a custom-op library archive: it has no metadata.json")
    metadata = Metadata.from_json(members["metadata.json"].decode(errors="replace"))
    libraries = {}
    for name in (metadata.shape_library, metadata.compute_library):
        if name not in members or Path(name).name != name or name in (".", ".."):
            raise ValueError(f"{archive} is corrupted: its metadata names the library {name!r}, which it does not hold")
        if hashlib.sha256(members[name]).hexdigest() != metadata.sha256.get(name):
            raise ValueError(f"{archive} is corrupted: {name} does not match the SHA-256 recorded when it was packed "
                             "(truncated or modified since); rebuild it (python build.py --clean for this project's "
                             "operators)")
        libraries[name] = members[name]
    root = private_folder(extraction_root())
    folder = root / hashlib.sha256(data).hexdigest()[:32]
    if not _holds(folder, libraries):
        # Our own folder with other bytes (an interrupted or damaged extraction): replace it.
        shutil.rmtree(folder, ignore_errors=True)
        # Extract beside the final folder and rename it into place, so a concurrent process never sees half of it.
        staging = Path(tempfile.mkdtemp(dir=root))
        for name, content in libraries.items():
            (staging / name).write_bytes(content)
        try:
            staging.rename(folder)
        except OSError:  # another process extracted the same archive first
            shutil.rmtree(staging)
        if not _holds(folder, libraries):
            raise ValueError(f"extracting {archive} into {folder} did not give the archive's bytes; remove {folder}")
    return folder, metadata


def _write_if_changed(path: Path, text: str) -> None:
    """Rewrite a generated file only when its text changes, so ninja does not rebuild it needlessly."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
