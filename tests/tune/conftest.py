"""Fixtures of the tuner tests: the stand-in workload, space files, and a real PostgreSQL server."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

WORKLOAD = Path(__file__).parent / "scripts" / "workload.py"


@pytest.fixture
def workload_command():
    return [sys.executable, str(WORKLOAD)]


@pytest.fixture
def write_space(tmp_path):
    def write(text: str) -> Path:
        path = tmp_path / "space.toml"
        path.write_text(text)
        return path
    return write


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default study storage is .nki-ops/ in the working directory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgresql_url():
    """A throwaway PostgreSQL server (initdb + pg_ctl in a temp dir), as user postgres when run as root."""
    bindirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bindirs:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql (make test installs them)")
    bindir = bindirs[-1]
    as_user: list[str] = []
    root = tempfile.mkdtemp(prefix="nki-ops-pg-")
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root and runuser is missing, so PostgreSQL cannot run as an unprivileged user")
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = os.path.join(root, "data"), _free_port()
    def run(*args):
        return subprocess.run(as_user + list(args), check=True, capture_output=True, text=True)

    try:
        run(f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        run(f"{bindir}/pg_ctl", "-D", data, "-l", os.path.join(root, "log"), "-w", "start", "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off")
    except subprocess.CalledProcessError as error:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL: {error.stderr or error.stdout}")
    yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    run(f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop")
    shutil.rmtree(root, ignore_errors=True)
