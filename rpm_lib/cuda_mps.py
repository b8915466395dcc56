"""CUDA's Multi-Process Service (MPS) for several training runs sharing one GPU.

Without MPS the processes on one GPU take turns: the GPU runs one process's kernels at a time. Two SCL runs whose
steps are bound by their hosts' kernel launches fill each other's idle gaps that way (docs/reproduction-gpu.md, "One
run against two at once"), but their kernels never run side by side, and a small kernel leaves most of the GPU's
multiprocessors idle while it runs. Under MPS the processes' kernels go through one server and may run at the same
time on different multiprocessors.

:func:`mps_daemon` starts a private control daemon, with its own pipe and log folders so that it never meets a
daemon the machine already runs, gives the environment its clients need, and stops it when the block ends. A CUDA
program whose environment names that pipe folder connects when it initialises CUDA; NVIDIA documents that a
program that finds no daemon there runs as usual, without MPS. So whether the runs really shared the server is read
from the daemon's log afterwards (:meth:`MpsDaemon.clients`), not assumed.

MPS changes none of the card's settings (compute mode, clocks, MIG layout): it is a user-space service that ends with
the block.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: NVIDIA's control program, shipped with the driver's utilities.
CONTROL = "nvidia-cuda-mps-control"
#: Where driver utilities live on machines whose PATH lacks them (containers mount the driver there).
DRIVER_FOLDERS = ("/usr/local/nvidia/bin", "/usr/bin")
#: The environment variables a client needs to find the daemon (and the daemon to place its files).
PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VARIABLE = "CUDA_MPS_LOG_DIRECTORY"
#: Seconds to wait for the daemon to answer after starting it, and for a command to it.
START_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 30.0

_CLIENT_LINE = re.compile(r"\bNEW CLIENT\b", re.IGNORECASE)
_SERVER_FAILED = re.compile(r"server failed to start|MPS is only supported", re.IGNORECASE)


class MpsUnavailable(RuntimeError):
    """The MPS daemon cannot be started here; the message is one line saying why."""


def find_control() -> str:
    """The path of ``nvidia-cuda-mps-control``: on PATH, else in :data:`DRIVER_FOLDERS`.

    Raises:
        MpsUnavailable: it is nowhere (no NVIDIA driver utilities on this machine).
    """
    found = shutil.which(CONTROL)
    if found:
        return found
    for folder in DRIVER_FOLDERS:
        candidate = Path(folder) / CONTROL
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise MpsUnavailable(f"{CONTROL} is not on PATH nor in {', '.join(DRIVER_FOLDERS)}: MPS needs NVIDIA's driver "
                         "utilities on a machine with an NVIDIA GPU; run without MPS")


@dataclass(frozen=True)
class MpsDaemon:
    """A running private MPS control daemon.

    Attributes:
        control: the control program's path.
        pipe_dir: its pipe folder (``CUDA_MPS_PIPE_DIRECTORY``).
        log_dir: its log folder (``CUDA_MPS_LOG_DIRECTORY``): ``control.log`` and the servers' ``server.log``.
    """

    control: str
    pipe_dir: Path
    log_dir: Path

    @property
    def env(self) -> dict[str, str]:
        """The variables that make a CUDA process started with them a client of this daemon."""
        return {PIPE_VARIABLE: str(self.pipe_dir), LOG_VARIABLE: str(self.log_dir)}

    def command(self, text: str, timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """Send one command (``get_server_list``, ``quit``, ...) to the daemon; its reply in ``stdout``."""
        return subprocess.run([self.control], input=text + "\n", capture_output=True, text=True,
                              env={**os.environ, **self.env}, timeout=timeout, check=False)

    def clients(self) -> int:
        """How many client connections the daemon has logged so far (``NEW CLIENT`` lines of ``control.log``)."""
        log = self.log_dir / "control.log"
        if not log.is_file():
            return 0
        return sum(1 for line in log.read_text(errors="replace").splitlines() if _CLIENT_LINE.search(line))

    def server_failure(self) -> str | None:
        """The first line of a server log that says the MPS server failed to start, or None."""
        for log in sorted(self.log_dir.rglob("server.log")):
            for line in log.read_text(errors="replace").splitlines():
                if _SERVER_FAILED.search(line):
                    return line.strip()
        return None


@contextlib.contextmanager
def mps_daemon(folder: str | os.PathLike[str], control: str | None = None) -> Iterator[MpsDaemon]:
    """Run a private MPS control daemon for the block; stop it (``quit``) when the block ends, however it ends.

    Args:
        folder: an empty or new folder for the daemon's ``pipe/`` and ``log/`` (a path short enough for a Unix
            socket: under ~100 characters).
        control: the control program (default: :func:`find_control`).

    Yields:
        The :class:`MpsDaemon`; give its ``env`` to the processes that should share the GPU through it.

    Raises:
        MpsUnavailable: no control program, or it did not start or answer (one line, with its own last message).
    """
    control = control or find_control()
    folder = Path(folder).resolve()
    daemon = MpsDaemon(control, folder / "pipe", folder / "log")
    if len(str(daemon.pipe_dir)) > 90:
        raise MpsUnavailable(f"{daemon.pipe_dir}: too long a path for the daemon's Unix socket; use a shorter folder "
                             "(or a shorter TMPDIR)")
    daemon.pipe_dir.mkdir(parents=True, exist_ok=True)
    daemon.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        started = subprocess.run([control, "-d"], capture_output=True, text=True, env={**os.environ, **daemon.env},
                                 timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MpsUnavailable(f"{control} -d: {error}") from None
    if started.returncode != 0:
        said = (started.stderr.strip() or started.stdout.strip() or "no message").splitlines()[-1]
        raise MpsUnavailable(f"{control} -d exited with status {started.returncode}: {said}")
    try:
        _wait_until_answering(daemon)
        yield daemon
    finally:
        _stop(daemon)


@contextlib.contextmanager
def private_mps_daemon() -> Iterator[MpsDaemon]:
    """:func:`mps_daemon` in a new temporary folder (under ``/tmp`` when it can be written: the socket's path must
    stay short), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="rpm-mps-", dir="/tmp" if os.access("/tmp", os.W_OK) else None))
    try:
        with mps_daemon(folder) as daemon:
            yield daemon
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _wait_until_answering(daemon: MpsDaemon) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if daemon.command("get_server_list", timeout=5.0).returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            raise MpsUnavailable(f"the MPS control daemon started in {daemon.pipe_dir} does not answer after "
                                 f"{START_TIMEOUT_S:g} s (its log: {daemon.log_dir / 'control.log'})")
        time.sleep(0.2)


def _stop(daemon: MpsDaemon) -> None:
    """``quit`` the daemon (it stops its servers first); a daemon that is already gone is fine."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        daemon.command("quit")
