"""Signals that ask a training run to stop at its next step boundary, with a resumable state, instead of killing it.

A signal handler here only writes the run's stop-request file (``time_budget.STOP_FILE``); the time-budget
callback sees it after the step in progress, writes ``last.ckpt`` and ends the run as *unfinished* (``rpm-train``
exits with 75), exactly as when the time budget runs out.

Which signals:

* inside a SLURM job (``SLURM_JOB_ID``): SIGUSR2 (``--signal=USR2@N`` before the time limit) and SIGTERM
  (preemption, the limit), in any process that calls ``train``, a notebook kernel included;
* in ``rpm-train`` (``interactive=True``): SIGTERM (``kill``, a process manager, a container stopping) and SIGINT
  (Ctrl-C). A second SIGINT stops at once (:class:`Interrupted`), keeping the last epoch's checkpoint.

A SLURM task keeps these signals blocked while its notebook kernel runs (:func:`held_from_the_kernel`): SLURM
signals every process of the job, and its SIGUSR2 may come up to a minute early, so it reached kernels still
starting, before any handler, and killed them ("Kernel died before replying to kernel_info"). The kernel inherits
the blocked signals; :func:`stop_on_signals` unblocks them while ``train`` runs, and any that arrived meanwhile
become stop requests then.

Lightning 2.6 installs its own SIGTERM handler when ``Trainer.fit`` starts: it calls the handler it finds, then
ends the process with ``SIGTERMException`` after the batch in progress, a ``SystemExit`` with status 0, the status
of a finished run. :class:`rpm_lib.training.callbacks.KeepStopSignals` puts this module's handlers back once training
starts; Lightning restores them itself when ``fit`` returns.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

#: The handlers of the innermost active :func:`stop_on_signals` (signal -> handler); read through :func:`active_handlers`
#: by :class:`rpm_lib.training.callbacks.KeepStopSignals`.
_active: dict[int, Any] = {}
#: What SLURM sends a job: SIGUSR2 before its time limit (``--signal=USR2@N``), SIGTERM on preemption or at it.
SLURM_STOP_SIGNALS: frozenset[int] = frozenset({signal.SIGUSR2, signal.SIGTERM})


class Interrupted(Exception):
    """A second Ctrl-C stopped ``rpm-train`` at once; the run resumes from its last saved checkpoint."""


def _signals(interactive: bool) -> set[int]:
    chosen: set[int] = set()
    if "SLURM_JOB_ID" in os.environ:
        chosen |= SLURM_STOP_SIGNALS
    if interactive:
        chosen |= {signal.SIGTERM, signal.SIGINT}
    return chosen


@contextlib.contextmanager
def stop_on_signals(stop_file: Path, interactive: bool = False, program: str = "rpm-train") -> Iterator[None]:
    """While inside: the signals listed in the module docstring write ``stop_file`` instead of ending the process.

    Only in the main thread (Python runs signal handlers there); the previous handlers come back on exit.

    Args:
        stop_file: the run's stop-request file.
        interactive: also SIGTERM and SIGINT outside SLURM (``rpm-train``; not a notebook, whose kernel uses SIGINT
            for its own interrupt button).
        program: named in the line printed when a signal arrives.
    """
    # A signal the process was started to ignore (nohup, a background job of a script) stays ignored.
    chosen = {sig for sig in _signals(interactive) if signal.getsignal(sig) is not signal.SIG_IGN}
    if not chosen or threading.current_thread() is not threading.main_thread():
        yield
        return
    requested: list[int] = []
    owner = os.getpid()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:
            # A forked DataLoader worker inherits this handler, and a terminal's Ctrl-C (or SLURM) signals it too:
            # it ignores the signal and keeps serving batches; the run's own process stops the run.
            return
        if signum == signal.SIGINT and signal.SIGINT in requested:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise Interrupted(f"{program}: stopped at once by a second Ctrl-C")
        requested.append(signum)
        stop_file.parent.mkdir(parents=True, exist_ok=True)
        stop_file.touch()
        again = " (Ctrl-C again stops at once, losing the epoch in progress)" if signum == signal.SIGINT else ""
        print(f"{program}: {signal.Signals(signum).name} received: stopping at the next step with a resumable "
              f"state{again}", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, request_stop) for sig in chosen}
    # Started with them blocked (a SLURM task's kernel): those that arrived meanwhile are delivered now, as requests.
    held = signal.pthread_sigmask(signal.SIG_UNBLOCK, chosen) & chosen
    outer = dict(_active)
    _active.clear()
    _active.update({sig: request_stop for sig in chosen})
    try:
        yield
    finally:
        _active.clear()
        _active.update(outer)
        if held:  # blocked again before the old handlers return: one arriving now waits instead of killing
            signal.pthread_sigmask(signal.SIG_BLOCK, held)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def held_from_the_kernel() -> Iterator[list[str]]:
    """Inside a SLURM job, block :data:`SLURM_STOP_SIGNALS` in this thread while inside: a notebook kernel started
    meanwhile inherits them blocked, so one arriving before ``train`` takes them cannot kill it (module docstring).

    Those that reach this process meanwhile are taken on exit, not delivered: the run's own process has acted on
    them (SLURM signals it too), and a stop request written after the run would stop the next one at once. Their
    names are put in the yielded list, for a log line. Outside SLURM, or off the main thread, nothing changes.
    """
    taken: list[str] = []
    if "SLURM_JOB_ID" not in os.environ or threading.current_thread() is not threading.main_thread():
        yield taken
        return
    held = SLURM_STOP_SIGNALS - signal.pthread_sigmask(signal.SIG_BLOCK, SLURM_STOP_SIGNALS)
    try:
        yield taken
    finally:
        while held and (info := signal.sigtimedwait(held, 0)) is not None:
            taken.append(signal.Signals(info.si_signo).name)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def active_handlers() -> dict[int, Any]:
    """The handlers of the innermost active :func:`stop_on_signals` (signal -> handler); empty outside one."""
    return dict(_active)
