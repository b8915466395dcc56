"""One cell of a batch: :func:`run_one` executes one grid point in its run folder (:func:`run_dir_of`) and says how
it ended (:class:`RunResult`); the local and the SLURM executor both run cells through it.

Every run gets the folder ``<out>/<grid>/<axis>-<label>__<axis>-<label>...`` (labels made file-safe:
``train-A_Color__setup-MLCL_AUG``) holding ``run.json`` (its name, grid, labels, parameters) and the executed
notebook(s). Every notebook (template and ``then``) gets two more parameters: ``run_dir`` = the run folder
(``03_train`` trains into it, so ``metrics.json`` lands there; ``04``/``05`` read the run from it) and
``output_dir`` = ``<run folder>/<notebook stem>`` for its figures and tables; a kernel that writes to its standard
error writes into ``<notebook stem>.kernel.log`` beside its executed notebook. A run whose folder has
``metrics.json`` is finished and skipped (the ``then`` notebooks are re-run only when their executed copy is missing
or recorded an exception). A failing run leaves its executed notebook and ``error.txt``.

Under a time budget (a deadline), the run gets ``time_budget`` = the time left (less :data:`BATCH_MARGIN_S`) and
``resume=true``; a run still going :data:`BACKSTOP_S` after the deadline is asked to stop at its next step (its
``stop.request``).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpm_lib.batch.config import OUTPUT_DIR_PARAMETER, RUN_DIR_PARAMETER, BatchConfig, RunSpec
from rpm_lib.json_files import write_object
from rpm_lib.notebook_execution import execute_notebook, kernel_log_of
from rpm_lib.run_folder import (ERROR, METRICS, RUN_RECORD, STOP_FILE, RunStatus, is_finished, request_stop,
                               stopped_by_budget)

#: Seconds of a batch's time budget kept back from each run's own: its kernel's start and the batch's tables
#: (at most a tenth of the budget, for short budgets).
BATCH_MARGIN_S = 20.0
#: A run is not started when less than this (at most a tenth of the budget) is left for it.
MIN_RUN_SECONDS = 15.0
#: A run still going this long after the batch's time budget ended (at most a tenth of the budget) is asked to stop
#: at its next step boundary, through its stop-request file, and asked again every :data:`BACKSTOP_REPEAT_S`.
#: A run predicts its own stop, but not work it has not measured yet (the first validation of a slice, the start of
#: a stage); without this, such work could carry a batch past a rented machine's or a job's hard limit, where
#: everything since the last epoch's checkpoint would be lost with the process.
BACKSTOP_S = 15.0
BACKSTOP_REPEAT_S = 2.0
#: Lines of a failed notebook's kernel log quoted in the run's ``error.txt``.
KERNEL_LOG_TAIL_LINES = 20
#: Space held in the run folder while a cell runs and freed for its ``error.txt`` when it fails (bytes): on a full
#: disk the failure must still say why.
ERROR_RESERVE_BYTES = 256 << 10
#: The file that holds :data:`ERROR_RESERVE_BYTES` (removed when the cell ends, however it ends but a kill).
ERROR_RESERVE = ".error.reserve"
#: How a full disk shows in a traceback, with the file when it names one.
_NO_SPACE = re.compile(r"(?:\[Errno 28\] )?No space left on device(?:: '([^']*)')?")


def _kernel_log_tail(log: Path) -> str:
    """The last lines of a kernel log (:func:`kernel_log_of`) for ``error.txt``, or "" when there is none."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    if not text.strip():
        return ""  # nothing written (execute_notebook removes such a log), or only blank lines
    tail = text.rstrip().splitlines()[-KERNEL_LOG_TAIL_LINES:]
    return f"\nthe kernel's standard error ({log}), last {len(tail)} lines:\n" + "\n".join(tail) + "\n"


@dataclass
class RunResult:
    """Outcome of one run: ``status`` is done, skipped (already finished), failed, planned, submitted (SLURM) or
    unfinished (a time budget ended it, or left no time to start it; run the batch again to continue)."""

    spec: RunSpec
    run_dir: Path
    status: RunStatus
    seconds: float = 0.0
    error: str | None = None
    notebooks: list[str] = field(default_factory=list)


def notebook_failed(path: Path) -> bool:
    """True when an executed notebook is missing or papermill recorded an exception in it."""
    if not path.is_file():
        return True
    try:
        meta = json.loads(path.read_text()).get("metadata", {}).get("papermill", {})
    except json.JSONDecodeError:
        return True
    return bool(meta.get("exception")) or meta.get("end_time") is None


def describe_error(exc: BaseException) -> str:
    """A failure as ``error.txt`` quotes it: the kernel's traceback for a notebook error, else Python's. Its last
    line names the cause; a full disk anywhere in the traceback is that cause (a library's own message for it, such
    as PyTorch's ``unexpected pos`` on a truncated checkpoint, would say nothing a user can act on)."""
    ename = getattr(exc, "ename", None)
    if ename is not None:  # papermill.PapermillExecutionError: the kernel-side error
        tb = "\n".join(getattr(exc, "traceback", []) or [])
        tb = re.sub(r"\x1b\[[0-9;]*m", "", tb)  # ANSI colours from IPython
        text = f"{tb}\n{ename}: {exc.evalue}\n"
    else:
        text = "".join(traceback.format_exception(exc))
    full = _NO_SPACE.search(text)
    last = text.rstrip().splitlines()[-1] if text.strip() else ""
    if full is not None and "No space left on device" not in last:
        text += f"OSError: [Errno 28] No space left on device{f': {full.group(1)}' if full.group(1) else ''}\n"
    return text


@contextlib.contextmanager
def _error_reserve(run_dir: Path) -> Iterator[Any]:
    """Hold :data:`ERROR_RESERVE_BYTES` of disk in ``run_dir`` while the block runs; yields the function that
    frees it (for the error path). Best effort: a file system without ``fallocate`` holds nothing."""
    reserve = run_dir / ERROR_RESERVE
    try:
        handle = os.open(reserve, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(handle, 0, ERROR_RESERVE_BYTES)
        finally:
            os.close(handle)
    except OSError:
        pass

    def free() -> None:
        with contextlib.suppress(OSError):
            reserve.unlink(missing_ok=True)

    try:
        yield free
    finally:
        free()


def _write_error(run_dir: Path, text: str, free: Any) -> None:
    """``error.txt``, written into the space :func:`_error_reserve` held; when even that fails, its cause goes to
    standard error (the task's or the batch's log), never lost."""
    free()
    try:
        (run_dir / ERROR).write_text(text)
    except OSError as problem:
        with contextlib.suppress(OSError):  # a cut-short error.txt would quote a wrong last line
            (run_dir / ERROR).unlink(missing_ok=True)
        last = text.rstrip().splitlines()[-1] if text.strip() else ""
        print(f"rpm-batch: {run_dir}: failed ({last}); {ERROR} could not be written: {problem}", file=sys.stderr)


class _Backstop:
    """From ``at`` (``time.time()`` seconds) until closed, writes ``stop_file`` every :data:`BACKSTOP_REPEAT_S`.

    Written again and again because ``train`` removes a request it finds when it starts (one left from an earlier
    call): a run whose kernel was still starting must see the request all the same. Closing removes the file, so
    that no request outlives the run it was meant for.
    """

    def __init__(self, stop_file: Path, at: float) -> None:
        self.stop_file = stop_file
        self.at = at
        self.first_request: float | None = None  # ``time.time()`` when the first request was written
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"backstop {stop_file.parent.name}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        if self._closed.wait(max(0.0, self.at - time.time())):
            return
        while not self._closed.is_set():
            # a folder moved away, or a link or folder at the name: nothing is asked (never through a link)
            if request_stop(self.stop_file.parent) and self.first_request is None:
                self.first_request = time.time()
            self._closed.wait(BACKSTOP_REPEAT_S)

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        if self.first_request is not None:
            with contextlib.suppress(OSError):  # not a file (train refuses a folder there in one line)
                self.stop_file.unlink(missing_ok=True)


@contextlib.contextmanager
def _backstop_of(run_dir: Path, deadline: tuple[float, float] | None) -> Iterator[_Backstop | None]:
    """The run's :class:`_Backstop` while the block runs (``None`` without a deadline): it starts asking
    :data:`BACKSTOP_S` (at most a tenth of the budget) after the deadline's end."""
    if deadline is None:
        yield None
        return
    end, whole = deadline
    backstop = _Backstop(run_dir / STOP_FILE, end + min(BACKSTOP_S, 0.1 * whole))
    try:
        yield backstop
    finally:
        backstop.close()


def run_one(spec: RunSpec, config: BatchConfig, out: Path, cuda_devices: str | None = None,
            threads: int | None = None, deadline: tuple[float, float] | None = None) -> RunResult:
    """Execute one grid point (template, then the ``then`` notebooks); never raises for notebook failures.

    ``cuda_devices`` / ``threads`` set ``CUDA_VISIBLE_DEVICES`` / ``OMP_NUM_THREADS`` for the kernels started
    here (meant for worker processes; ``run_batch`` restores them when running in-process). ``deadline``
    = (end in ``time.time()`` seconds, the batch's whole budget) bounds the run: it gets ``time_budget`` and
    ``resume=true`` (see the module docstring) or, with too little time left, is not started (``unfinished``).
    A run still training :data:`BACKSTOP_S` after ``end`` is asked to stop at its next step (its stop-request file).
    """
    run_dir = run_dir_of(out, spec).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    # A finished run's run.json describes the run its metrics.json came from: a batch run again after its YAML was
    # edited (another lr) reaches a finished run only to redo a failed `then` notebook, and must not relabel it.
    if not (is_finished(run_dir) and (run_dir / RUN_RECORD).is_file()):
        write_object(run_dir / RUN_RECORD,
                     {"name": spec.name, "grid": spec.grid, "labels": spec.labels, "parameters": spec.parameters,
                      "template": str(config.template), "then": [str(p) for p in config.then]}, default=str)
    if cuda_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_devices
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    executed: list[str] = []
    steps: list[tuple[Path, dict[str, Any], Path]] = []

    def folders(nb: Path) -> dict[str, str]:
        return {RUN_DIR_PARAMETER: str(run_dir), OUTPUT_DIR_PARAMETER: str(run_dir / nb.stem)}

    if not is_finished(run_dir):
        budget: dict[str, Any] = {}
        if deadline is not None:
            end, whole = deadline
            left = end - time.time() - min(BATCH_MARGIN_S, 0.1 * whole)
            if left < min(MIN_RUN_SECONDS, 0.1 * whole):
                return RunResult(spec, run_dir, RunStatus.UNFINISHED, 0.0,
                                 "not started: the batch's time budget is spent")
            budget = {"time_budget": round(left, 1), "resume": True}
        steps.append((config.template, {**spec.parameters, **budget, **folders(config.template)},
                      run_dir / config.template.name))
    for nb in config.then:
        out_nb = run_dir / nb.name
        if steps or notebook_failed(out_nb):
            steps.append((nb, folders(nb), out_nb))
    if not steps:
        return RunResult(spec, run_dir, RunStatus.SKIPPED)
    (run_dir / ERROR).unlink(missing_ok=True)
    with _error_reserve(run_dir) as free:
        return _run_steps(spec, config, run_dir, steps, deadline, start, executed, free)


def _run_steps(spec: RunSpec, config: BatchConfig, run_dir: Path, steps: list[tuple[Path, dict[str, Any], Path]],
               deadline: tuple[float, float] | None, start: float, executed: list[str], free: Any) -> RunResult:
    """Execute ``steps`` (template, parameters, executed notebook) of one cell in order (see :func:`run_one`)."""
    for template, params, out_nb in steps:
        try:
            # only the training notebook runs against the batch's deadline
            with _backstop_of(run_dir, deadline if template == config.template else None) as backstop:
                # the kernels' own chatter (ipykernel's log lines, what C libraries print) stays with their run
                execute_notebook(template, out_nb, params, kernel_name=config.kernel, cwd=Path.cwd(),
                                 execution_timeout=config.execution_timeout, kernel_stderr=kernel_log_of(out_nb))
            executed.append(str(out_nb))
            if template == config.template and not is_finished(run_dir):
                if stopped_by_budget(run_dir):  # the time budget ended it: the `then` notebooks wait for the end
                    note = None
                    if backstop is not None and backstop.first_request is not None:
                        late = backstop.first_request - deadline[0]
                        note = (f"asked to stop {late:.0f} s after the batch's time budget had ended (work the run "
                                f"could not predict ran over)")
                    return RunResult(spec, run_dir, RunStatus.UNFINISHED, time.perf_counter() - start, note, executed)
                raise RuntimeError(f"{template} finished without writing {run_dir / METRICS}")
        except Exception as exc:  # noqa: BLE001 - any failure is recorded, the batch goes on
            header, error = f"step: {template}\nexecuted notebook: {out_nb}\n", describe_error(exc)
            message = f"{header}\n{error}"
            # the error stays the last line (the tables and the batch's summary quote it)
            _write_error(run_dir, f"{header}{_kernel_log_tail(kernel_log_of(out_nb))}\n{error}", free)
            return RunResult(spec, run_dir, RunStatus.FAILED, time.perf_counter() - start, message, executed)
    return RunResult(spec, run_dir, RunStatus.DONE, time.perf_counter() - start, None, executed)


def run_dir_of(out: Path, spec: RunSpec) -> Path:
    """The run folder: ``<out>/<grid>/<name>``."""
    return out / spec.grid / spec.name
