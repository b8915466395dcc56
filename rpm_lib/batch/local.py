"""Running a batch's cells on this machine (:func:`run_locally`): one after the other in this process, or ``--jobs``
worker processes at once (``spawn``: the caller may hold torch and threads), each cell through
:func:`rpm_lib.batch.cell.run_one`; optionally through a private CUDA MPS daemon (:func:`through_cuda_mps`), and with
live progress lines while they train (:func:`watching`).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from rpm_lib.batch.cell import RunResult, describe_error, run_dir_of, run_one
from rpm_lib.batch.config import BatchConfig, RunSpec
from rpm_lib.cuda_mps import LOG_VARIABLE, PIPE_VARIABLE, private_mps_daemon
from rpm_lib.runs.live import LiveProgress
from rpm_lib.run_folder import ERROR, RunStatus


@contextlib.contextmanager
def watching(watcher: LiveProgress | None) -> Iterator[None]:
    """Live progress while the block runs: the watcher's thread starts on entry and takes a last look on exit."""
    if watcher is not None:
        watcher.start()
    try:
        yield
    finally:
        if watcher is not None:
            watcher.stop()



def run_locally(todo: Sequence[tuple[RunSpec, Path]], config: BatchConfig, out_dir: Path, jobs: int,
                device_for: Callable[[int], str | None], deadline: tuple[float, float] | None,
                watcher: LiveProgress | None, report: Callable[[int, RunResult], None],
                log: Callable[[str], None]) -> None:
    """Execute ``todo`` here: one after the other in this process (``jobs`` 1), else ``jobs`` worker processes at
    once; every result goes to ``report(i, result)``."""
    if jobs == 1 or len(todo) <= 1:
        # run_one sets the device for its kernels here; a notebook calling run_batch keeps its own
        with environment_restored("CUDA_VISIBLE_DEVICES"), watching(watcher):
            for i, (spec, run_dir) in enumerate(todo, 1):
                log(f"  [{i}/{len(todo)}] start  {spec.grid}/{spec.name} -> {run_dir}")
                report(i, run_one(spec, config, out_dir, device_for(i - 1), deadline=deadline))
        return
    # Parallel kernels on a small CPU machine oversubscribe cores with torch's default thread count:
    # each worker gives its kernels their share unless the caller set OMP_NUM_THREADS.
    threads = None if "OMP_NUM_THREADS" in os.environ else max(1, (os.cpu_count() or 1) // jobs)
    # spawn: the parent may have imported torch/threads (a notebook, the demo); fork would be unsafe.
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    with pool, watching(watcher):
        futures = {pool.submit(run_one, spec, config, out_dir, device_for(i), threads, deadline): spec
                   for i, (spec, _) in enumerate(todo)}
        for i, fut in enumerate(as_completed(futures), 1):
            spec = futures[fut]
            try:
                res = fut.result()
            except Exception as exc:  # noqa: BLE001 - a crashed worker is one failed run, not the batch
                res = RunResult(spec, run_dir_of(out_dir, spec).resolve(), RunStatus.FAILED, 0.0, describe_error(exc))
                (res.run_dir / ERROR).write_text(res.error or "")
            report(i, res)


@contextlib.contextmanager
def environment_restored(*names: str) -> Iterator[None]:
    """The environment variables ``names`` as they were before the block, whatever the block set."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def through_cuda_mps(enabled: bool, log: Callable[[str], None]) -> Iterator[None]:
    """With ``enabled``, the processes started in the block (worker processes and their notebook kernels inherit
    this environment) are clients of a private MPS daemon (``rpm_lib.cuda_mps``); afterwards the log says how many
    CUDA processes connected, and says so plainly when none did (then the runs shared the GPU by taking turns)."""
    if not enabled:
        yield
        return
    with private_mps_daemon() as daemon:
        try:
            with environment_restored(PIPE_VARIABLE, LOG_VARIABLE):
                os.environ.update(daemon.env)
                log(f"MPS: the runs share the GPU through a private daemon ({daemon.pipe_dir})")
                yield
        finally:
            clients, failure = daemon.clients(), daemon.server_failure()
            # the two warnings go to stderr even with --quiet: --cuda-mps did not do what it was asked for
            if failure:
                print(f"rpm-batch: warning: MPS: the daemon's server failed to start ({failure}): see the runs' "
                      "errors; run without --cuda-mps", file=sys.stderr)
            elif clients:
                log(f"MPS: the daemon logged {clients} client connection(s)")
            else:
                print("rpm-batch: warning: MPS: no process connected to the daemon (no run used CUDA, or this "
                      "machine refuses MPS): the runs took turns on the GPU as without --cuda-mps",
                      file=sys.stderr)
