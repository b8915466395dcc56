"""``rpm-batch``: run a grid of papermill notebook executions, resumably, and gather the results.

A batch is described by a YAML file (``configs/table1.yaml``, ``configs/demo.yaml``; its format, how it is
read and checked and how its grids expand into runs: ``rpm_lib.batch_config``).

Every run gets the folder ``<out>/<grid>/<axis>-<label>__<axis>-<label>...`` (labels made file-safe:
``train-A_Color__setup-MLCL_AUG``) holding ``run.json`` (its
name, grid, labels, parameters) and the executed notebook(s). Every notebook (template and ``then``) gets
two more parameters: ``run_dir`` = the run folder (``03_train`` trains into it, so ``metrics.json`` lands
there; ``04``/``05`` read the run from it) and ``output_dir`` = ``<run folder>/<notebook stem>`` for its
figures and tables; a kernel that writes to its standard error writes into ``<notebook stem>.kernel.log`` beside
its executed notebook. A run whose folder
has ``metrics.json`` is finished and skipped on the next invocation (the ``then`` notebooks are re-run only
when their executed copy is missing or recorded an exception). A failing run leaves its executed notebook
and ``error.txt``; the other runs go on. At the end ``<out>/results.csv`` (one line per run) and
``<out>/table1.csv`` / ``<out>/table1.md`` (the paper's Table 1 layout, ``rpm_lib.results``) and, when runs
report extra test sets, ``<out>/test_sets.csv`` (one line per run and evaluated set) are written,
and the ``report`` notebook (if any) is executed into ``<out>/<stem>.ipynb`` with ``batch_dir=<out>`` and
``output_dir=<out>/report``.

Relative paths in the YAML (template, out, prepare) and relative paths passed to notebooks are relative
to the current working directory (run from the repository root); kernels run in that directory.

Time-boxed batches (``--time-budget SECONDS``): every run started gets ``time_budget`` = the time left (less
:data:`BATCH_MARGIN_S` for its kernel and the tables) and ``resume=true``; a run the budget cut short ends
``unfinished`` (its ``progress.json`` says so, ``03_train`` skips its figures), the ``then`` notebooks wait
for a finished run, runs not started for lack of time are ``unfinished`` too, and ``rpm-batch`` exits with 75.
A run still going :data:`BACKSTOP_S` after the budget's end is asked to stop at its next step (its ``stop.request``).
Running the same command again continues. ``rpm-batch pack`` / ``unpack`` carry the resumable state of a batch
folder to another machine (``rpm_lib.run_archive``); ``rpm-batch progress`` prints each run's epochs and
validation accuracy.

While runs execute (locally, or on SLURM with ``--wait``), a line per finished epoch of each running run gives its
stage, epoch, losses, validation accuracy and the estimated time left for the run and the grid, and a run whose
folder stays unchanged for ``--stall-minutes`` is reported (not stopped); ``--quiet`` turns these lines off
(``rpm_lib.live_progress``, which reads them from the run folders).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rpm_lib.batch_config import (  # noqa: F401 - the batch's vocabulary, re-exported
    OUTPUT_DIR_PARAMETER, RUN_DIR_PARAMETER, BatchConfig, BatchConfigError, Grid, PrepareStep, RunSpec,
    check_parameters, expand_grid, load_batch_config, notebook_parameters, run_dir_of, run_name, slug)
from rpm_lib.cli_parser import OneLineArgumentParser, print_error
from rpm_lib.live_progress import STALL_SECONDS, LiveProgress, stage_epochs, stage_views
from rpm_lib.notebook_execution import execute_notebook, kernel_log_of
from rpm_lib.run_progress import STOP_FILE, UNFINISHED_EXIT_CODE, stopped_by_budget

#: A training run is finished when its folder holds this file.
FINISHED_MARKER = "metrics.json"
#: Seconds of a batch's time budget kept back from each run's own: its kernel's start and the batch's tables
#: (at most a tenth of the budget, for short budgets).
BATCH_MARGIN_S = 20.0
#: Default of ``--stall-minutes``: a running run whose folder has not changed for this long is reported.
STALL_MINUTES = STALL_SECONDS / 60
#: A run is not started when less than this (at most a tenth of the budget) is left for it.
MIN_RUN_SECONDS = 15.0
#: A run still going this long after the batch's time budget ended (at most a tenth of the budget) is asked to stop
#: at its next step boundary, through its stop-request file, and asked again every :data:`BACKSTOP_REPEAT_S`.
#: A run predicts its own stop, but not work it has not measured yet (the first validation of a slice, the start of
#: a stage); without this, such work could carry a batch past a device call's or a job's hard limit, where
#: everything since the last epoch's checkpoint would be lost with the process.
BACKSTOP_S = 15.0
BACKSTOP_REPEAT_S = 2.0
#: Lines of a failed notebook's kernel log quoted in the run's ``error.txt``.
KERNEL_LOG_TAIL_LINES = 20


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
    """Outcome of one run: ``status`` is ``"done"``, ``"skipped"`` (already finished), ``"failed"``, ``"planned"`` or
    ``"unfinished"`` (a time budget ended it, or left no time to start it; run the batch again to continue)."""

    spec: RunSpec
    run_dir: Path
    status: str
    seconds: float = 0.0
    error: str | None = None
    notebooks: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# Execution
# ----------------------------------------------------------------------------------------------


def _notebook_failed(path: Path) -> bool:
    """True when an executed notebook is missing or papermill recorded an exception in it."""
    if not path.is_file():
        return True
    try:
        meta = json.loads(path.read_text()).get("metadata", {}).get("papermill", {})
    except json.JSONDecodeError:
        return True
    return bool(meta.get("exception")) or meta.get("end_time") is None


def _describe_error(exc: BaseException) -> str:
    ename = getattr(exc, "ename", None)
    if ename is not None:  # papermill.PapermillExecutionError: the kernel-side error
        tb = "\n".join(getattr(exc, "traceback", []) or [])
        tb = re.sub(r"\x1b\[[0-9;]*m", "", tb)  # ANSI colours from IPython
        return f"{tb}\n{ename}: {exc.evalue}\n"
    return "".join(traceback.format_exception(exc))


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
            with contextlib.suppress(OSError):  # a folder moved away: nothing is left to stop there
                self.stop_file.touch()
                if self.first_request is None:
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
    if not ((run_dir / FINISHED_MARKER).is_file() and (run_dir / "run.json").is_file()):
        (run_dir / "run.json").write_text(json.dumps(
            {"name": spec.name, "grid": spec.grid, "labels": spec.labels, "parameters": spec.parameters,
             "template": str(config.template), "then": [str(p) for p in config.then]}, indent=2, default=str))
    if cuda_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_devices
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    executed: list[str] = []
    steps: list[tuple[Path, dict[str, Any], Path]] = []

    def folders(nb: Path) -> dict[str, str]:
        return {RUN_DIR_PARAMETER: str(run_dir), OUTPUT_DIR_PARAMETER: str(run_dir / nb.stem)}

    if not (run_dir / FINISHED_MARKER).is_file():
        budget: dict[str, Any] = {}
        if deadline is not None:
            end, whole = deadline
            left = end - time.time() - min(BATCH_MARGIN_S, 0.1 * whole)
            if left < min(MIN_RUN_SECONDS, 0.1 * whole):
                return RunResult(spec, run_dir, "unfinished", 0.0, "not started: the batch's time budget is spent")
            budget = {"time_budget": round(left, 1), "resume": True}
        steps.append((config.template, {**spec.parameters, **budget, **folders(config.template)},
                      run_dir / config.template.name))
    for nb in config.then:
        out_nb = run_dir / nb.name
        if steps or _notebook_failed(out_nb):
            steps.append((nb, folders(nb), out_nb))
    if not steps:
        return RunResult(spec, run_dir, "skipped")
    (run_dir / "error.txt").unlink(missing_ok=True)
    for template, params, out_nb in steps:
        try:
            # only the training notebook runs against the batch's deadline
            with _backstop_of(run_dir, deadline if template == config.template else None) as backstop:
                # the kernels' own chatter (ipykernel's log lines, what C libraries print) stays with their run
                execute_notebook(template, out_nb, params, kernel_name=config.kernel, cwd=Path.cwd(),
                                 execution_timeout=config.execution_timeout, kernel_stderr=kernel_log_of(out_nb))
            executed.append(str(out_nb))
            if template == config.template and not (run_dir / FINISHED_MARKER).is_file():
                if stopped_by_budget(run_dir):  # the time budget ended it: the `then` notebooks wait for the end
                    note = None
                    if backstop is not None and backstop.first_request is not None:
                        late = backstop.first_request - deadline[0]
                        note = (f"asked to stop {late:.0f} s after the batch's time budget had ended (work the run "
                                f"could not predict ran over)")
                    return RunResult(spec, run_dir, "unfinished", time.perf_counter() - start, note, executed)
                raise RuntimeError(f"{template} finished without writing {run_dir / FINISHED_MARKER}")
        except Exception as exc:  # noqa: BLE001 - any failure is recorded, the batch goes on
            header, error = f"step: {template}\nexecuted notebook: {out_nb}\n", _describe_error(exc)
            message = f"{header}\n{error}"
            # the error stays the last line (the tables and the batch's summary quote it)
            (run_dir / "error.txt").write_text(f"{header}{_kernel_log_tail(kernel_log_of(out_nb))}\n{error}")
            return RunResult(spec, run_dir, "failed", time.perf_counter() - start, message, executed)
    return RunResult(spec, run_dir, "done", time.perf_counter() - start, None, executed)


def _resolve_command(command: Sequence[str]) -> list[str]:
    """``python`` -> this interpreter; a console script missing from PATH -> the one beside this interpreter."""
    first, rest = command[0], list(command[1:])
    if first in ("python", "python3"):
        return [sys.executable, *rest]
    beside = Path(sys.executable).parent / first
    if shutil.which(first) is None and beside.is_file():
        return [str(beside), *rest]
    return [first, *rest]


def _run_prepare(config: BatchConfig, dry_run: bool, log) -> None:
    """Run the ``prepare`` steps. Consecutive steps may share one ``creates`` (generate, then cache): each is
    skipped once that path exists, and only the last step naming it must have made it."""
    for number, step in enumerate(config.prepare):
        if step.creates is not None and Path(step.creates).exists():
            log(f"prepare: {step.creates} exists, skipping: {' '.join(step.command)}")
            continue
        log(f"prepare: {' '.join(step.command)}")
        if dry_run:
            continue
        try:
            result = subprocess.run(_resolve_command(step.command), check=False)
        except FileNotFoundError as exc:
            raise RuntimeError(f"{config.path}: prepare command not found: {step.command[0]}") from exc
        if result.returncode != 0:
            raise RuntimeError(f"{config.path}: prepare command failed (exit {result.returncode}): "
                               f"{' '.join(step.command)}")
        last_to_create = all(later.creates != step.creates for later in config.prepare[number + 1:])
        if step.creates is not None and last_to_create and not Path(step.creates).exists():
            raise RuntimeError(f"{config.path}: prepare command did not create {step.creates}: "
                               f"{' '.join(step.command)}")


def gather_results(out: str | Path) -> dict[str, Path]:
    """Write the batch folder's tables (``rpm_lib.results.write_tables``: results.csv, table1.csv, table1.md and,
    when runs report extra test sets, test_sets.csv).

    Run folders may come from other machines: one that is damaged, contradicts its run.json, or is a symbolic link
    never stops the gather (``--gather`` and the end of a batch would lose every other run to its traceback); it
    is left out of Table 1 and named, with why, under the table in table1.md (which both print)."""
    from rpm_lib import results

    return results.write_tables(results.load_runs(out), out)


def _run_report(report: Path, out: Path, config: BatchConfig, log) -> dict[str, Path]:
    """Execute the batch's report notebook; a failure is logged (with the notebook kept), not raised."""
    out_nb = out / report.name
    try:
        params = {"batch_dir": str(out.resolve()), OUTPUT_DIR_PARAMETER: str((out / "report").resolve())}
        execute_notebook(report, out_nb, params, kernel_name=config.kernel, cwd=Path.cwd(),
                         execution_timeout=config.execution_timeout, kernel_stderr=kernel_log_of(out_nb))
    except Exception as exc:  # noqa: BLE001 - the runs are done; a broken report must not hide them
        log(f"report notebook {report} failed (see {out_nb}): {_describe_error(exc).strip().splitlines()[-1]}")
    return {"report": out_nb}


def _printer() -> Callable[[str], None]:
    """``print`` with flush, one line at a time: the live progress thread prints too."""
    lock = threading.Lock()

    def log(message: str) -> None:
        with lock:
            print(message, flush=True)

    return log


@contextlib.contextmanager
def _watching(watcher: LiveProgress | None) -> Iterator[None]:
    """Live progress while the block runs: the watcher's thread starts on entry and takes a last look on exit."""
    if watcher is not None:
        watcher.start()
    try:
        yield
    finally:
        if watcher is not None:
            watcher.stop()


def _watcher(config: BatchConfig, todo: Sequence[tuple[RunSpec, Path]], log: Callable[[str], None], jobs: int,
             stall_minutes: float) -> LiveProgress:
    """The live progress of ``todo`` (see ``rpm_lib.live_progress``); each run's epoch limits are known beforehand
    when the template is a training notebook (every TrainConfig field a parameter, as ``03_train``)."""
    from rpm_lib.training.config import TrainConfig

    training = set(TrainConfig.field_names()) <= set(notebook_parameters(config.template))
    planned = {f"{s.grid}/{s.name}": stage_epochs(s.parameters) if training else None for s, _ in todo}
    views = {f"{s.grid}/{s.name}": stage_views(s.parameters) if training else None for s, _ in todo}
    return LiveProgress([(f"{s.grid}/{s.name}", d) for s, d in todo], log, stall_s=60.0 * stall_minutes,
                        planned=planned, jobs=jobs, views=views)


def run_batch(config_path: str | Path, jobs: int = 1, dry_run: bool = False, out: str | Path | None = None,
              grids: Sequence[str] | None = None, overrides: Mapping[str, Any] | None = None,
              cuda_devices: Sequence[str] | None = None, quiet: bool = False,
              prepare: bool = True, time_budget: float | None = None,
              workers_per_run: int | str | None = None, executor: str = "local",
              slurm: Mapping[str, Any] | None = None, wait: bool = False, live: bool = True,
              stall_minutes: float = STALL_MINUTES, cuda_mps: bool = False) -> list[RunResult]:
    """Run (or, with ``dry_run``, only plan) every run of a batch YAML; see the module docstring.

    Args:
        config_path: the batch YAML.
        jobs: runs executed at once (separate processes, one kernel each).
        dry_run: print the plan, execute nothing, write nothing (results have status ``planned``/``skipped``).
        out: batch folder, overriding the YAML's ``out``.
        grids: grid names to run (default: every grid with ``default: true``).
        overrides: parameters forced on every run (win over the YAML).
        cuda_devices: e.g. ``["0", "1"]``: run *i* gets ``CUDA_VISIBLE_DEVICES=cuda_devices[i % n]``.
        quiet: no progress lines on stdout (live ones included).
        prepare: run the YAML's ``prepare`` commands (False when the caller already made the data,
            e.g. ``make demo``, which passes its own ``data_root`` in ``overrides``).
        time_budget: wall-clock seconds for the whole call, preparation included (see the module docstring);
            needs a template with a ``time_budget`` parameter (``03_train``).
        workers_per_run: DataLoader workers of each run (the template's ``num_workers``), or ``"auto"``: the
            machine's cores shared among the runs at once (``jobs``, or fewer when fewer runs are left to train),
            one core each kept for the training process.
        executor: ``local`` (processes here) or ``slurm`` (one job array, ``rpm_lib.slurm``; the ``prepare``
            steps still run here first).
        slurm: ``--slurm KEY=VALUE`` settings over the YAML's ``slurm:`` mapping.
        wait: with ``slurm``, wait for the array and gather the tables (else return once it is submitted;
            results then have status ``submitted``).
        live: a line per finished epoch of every running run (``rpm_lib.live_progress``; local runs, and SLURM
            runs with ``wait``).
        stall_minutes: a running run whose folder has not changed for this long is reported (not stopped).
        cuda_mps: local runs share their GPU through a private CUDA Multi-Process Service daemon
            (``rpm_lib.cuda_mps``), started before the first run and stopped after the last; the log says how many
            processes connected.

    Returns:
        One ``RunResult`` per run, in grid order. Failed runs do not raise.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if (problem := _time_budget_problem(time_budget)) is not None:
        raise BatchConfigError(problem)
    if not stall_minutes > 0:
        raise BatchConfigError(f"--stall-minutes must be a positive number of minutes, got {stall_minutes}")
    if cuda_mps and executor != "local":
        raise BatchConfigError("--cuda-mps: an MPS daemon is started for local runs only (on SLURM, ask the site "
                               "for MPS, e.g. through its gres)")
    if cuda_mps and not dry_run:
        from rpm_lib.cuda_mps import find_control

        find_control()  # before the prepare steps, which may take minutes: no daemon, one line now
    deadline = None if time_budget is None else (time.time() + time_budget, float(time_budget))
    log = (lambda *_: None) if quiet else _printer()
    config = load_batch_config(config_path)
    out_dir = Path(out) if out is not None else config.out
    plan = _plan(config, out_dir, expand_grid(config, grids, overrides))
    if workers_per_run is not None:
        if workers_per_run == "auto":
            # the runs that train at once: a grid resumed with fewer runs left than --jobs gives each more workers
            at_once = max(1, min(jobs, sum(not finished for _, _, finished in plan)))
            workers_per_run = max(0, (os.cpu_count() or 1) // at_once - 1)
        overrides = {**(overrides or {}), "num_workers": int(workers_per_run)}
        # the same runs in the same order (an override names no run): only their parameters change
        plan = [(spec, run_dir, finished) for spec, (_, run_dir, finished)
                in zip(expand_grid(config, grids, overrides), plan, strict=True)]
    specs = [spec for spec, _, _ in plan]
    check_parameters(config, specs)
    if deadline is not None and "time_budget" not in notebook_parameters(config.template):
        raise BatchConfigError(f"{config.path}: --time-budget: the template {config.template} has no 'time_budget' "
                               "parameter")
    todo = [(s, d) for s, d, f in plan if not f]
    log(f"rpm-batch {config.path}: {len(specs)} runs ({len(specs) - len(todo)} already finished), "
        f"{jobs} at a time, into {out_dir}")
    if dry_run:
        if prepare:
            _run_prepare(config, True, log)
        if cuda_mps:
            log("MPS: the runs would share the GPU through a private CUDA MPS daemon (not checked in a dry run)")
        results = []
        for spec, run_dir, finished in plan:
            status = "skipped" if finished else "planned"
            params = " ".join(f"{k}={v!r}" for k, v in spec.parameters.items())
            log(f"  [{status}] {run_dir}: {params}")
            results.append(RunResult(spec, run_dir, status))
        return results
    if prepare:
        _run_prepare(config, False, log)
    watcher = _watcher(config, todo, log, jobs, stall_minutes) if live and not quiet else None
    if executor == "slurm":
        return _run_on_slurm(config, specs, out_dir, dict(slurm or {}), wait, log, watcher)
    if executor != "local":
        raise BatchConfigError(f"--executor must be local or slurm, got {executor!r}")
    by_name: dict[tuple[str, str], RunResult] = {
        (s.grid, s.name): RunResult(s, d.resolve(), "skipped") for s, d, f in plan if f}
    devices = list(cuda_devices) if cuda_devices else None

    def device_for(i: int) -> str | None:
        return None if devices is None else devices[i % len(devices)]

    def report(i: int, res: RunResult) -> None:
        by_name[(res.spec.grid, res.spec.name)] = res
        if watcher is not None:
            watcher.ended(f"{res.spec.grid}/{res.spec.name}")
        tail = "" if res.error is None else f": {res.error.strip().splitlines()[-1]}"
        log(f"  [{i}/{len(todo)}] {res.status:6s} {res.spec.grid}/{res.spec.name} ({res.seconds:.1f} s){tail}")

    with _through_cuda_mps(cuda_mps, log):
        _run_locally(todo, config, out_dir, jobs, device_for, deadline, watcher, report, log)
    results = [by_name[(s.grid, s.name)] for s in specs]
    paths = gather_results(out_dir)
    failed = [r for r in results if r.status == "failed"]
    unfinished = [r for r in results if r.status == "unfinished"]
    log(f"done: {sum(r.status == 'done' for r in results)} run, {sum(r.status == 'skipped' for r in results)} "
        f"skipped, {len(failed)} failed, {len(unfinished)} unfinished")
    for r in unfinished:
        log(f"  unfinished {r.run_dir}{': ' + r.error if r.error else ''} (run the batch again to continue)")
    for r in failed:
        log(f"  FAILED {r.run_dir} (see error.txt and the executed notebook there)")
    if config.report is not None:
        paths.update(_run_report(config.report, out_dir, config, log))
    for key, p in paths.items():
        log(f"{key}: {p}")
    log("")
    log(paths["table1_md"].read_text())
    return results


def _time_budget_problem(seconds: float | None) -> str | None:
    """What is wrong with a batch's time budget (``None``: no budget, or a usable one)."""
    if seconds is None or (math.isfinite(seconds) and seconds > 0):
        return None
    return f"--time-budget must be a positive, finite number of seconds, got {seconds:g}"


def _plan(config: BatchConfig, out_dir: Path, specs: list[RunSpec]) -> list[tuple[RunSpec, Path, bool]]:
    """(spec, run folder, finished) of each run: finished when its training wrote ``metrics.json`` and no ``then``
    notebook failed."""
    plan = []
    for spec in specs:
        run_dir = run_dir_of(out_dir, spec)
        finished = (run_dir / FINISHED_MARKER).is_file() and not any(
            _notebook_failed(run_dir / nb.name) for nb in config.then)
        plan.append((spec, run_dir, finished))
    return plan


def _run_locally(todo: Sequence[tuple[RunSpec, Path]], config: BatchConfig, out_dir: Path, jobs: int,
                 device_for: Callable[[int], str | None], deadline: tuple[float, float] | None,
                 watcher: LiveProgress | None, report: Callable[[int, RunResult], None],
                 log: Callable[[str], None]) -> None:
    """Execute ``todo`` here: one after the other in this process (``jobs`` 1), else ``jobs`` worker processes at
    once; every result goes to ``report(i, result)``."""
    if jobs == 1 or len(todo) <= 1:
        # run_one sets the device for its kernels here; a notebook calling run_batch keeps its own
        with _environment_restored("CUDA_VISIBLE_DEVICES"), _watching(watcher):
            for i, (spec, run_dir) in enumerate(todo, 1):
                log(f"  [{i}/{len(todo)}] start  {spec.grid}/{spec.name} -> {run_dir}")
                report(i, run_one(spec, config, out_dir, device_for(i - 1), deadline=deadline))
        return
    # Parallel kernels on a small CPU machine oversubscribe cores with torch's default thread count:
    # each worker gives its kernels their share unless the caller set OMP_NUM_THREADS.
    threads = None if "OMP_NUM_THREADS" in os.environ else max(1, (os.cpu_count() or 1) // jobs)
    # spawn: the parent may have imported torch/threads (a notebook, the demo); fork would be unsafe.
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    with pool, _watching(watcher):
        futures = {pool.submit(run_one, spec, config, out_dir, device_for(i), threads, deadline): spec
                   for i, (spec, _) in enumerate(todo)}
        for i, fut in enumerate(as_completed(futures), 1):
            spec = futures[fut]
            try:
                res = fut.result()
            except Exception as exc:  # noqa: BLE001 - a crashed worker is one failed run, not the batch
                res = RunResult(spec, run_dir_of(out_dir, spec).resolve(), "failed", 0.0, _describe_error(exc))
                (res.run_dir / "error.txt").write_text(res.error or "")
            report(i, res)


@contextlib.contextmanager
def _environment_restored(*names: str) -> Iterator[None]:
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
def _through_cuda_mps(enabled: bool, log: Callable[[str], None]) -> Iterator[None]:
    """With ``enabled``, the processes started in the block (worker processes and their notebook kernels inherit
    this environment) are clients of a private MPS daemon (``rpm_lib.cuda_mps``); afterwards the log says how many
    CUDA processes connected, and says so plainly when none did (then the runs shared the GPU by taking turns)."""
    if not enabled:
        yield
        return
    from rpm_lib.cuda_mps import LOG_VARIABLE, PIPE_VARIABLE, private_mps_daemon

    with private_mps_daemon() as daemon:
        try:
            with _environment_restored(PIPE_VARIABLE, LOG_VARIABLE):
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


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def _run_on_slurm(config: BatchConfig, specs: list[RunSpec], out: Path, overrides: dict[str, Any], wait: bool,
                  log, watcher: LiveProgress | None = None) -> list[RunResult]:
    from rpm_lib import slurm

    settings = slurm.parse_settings(config.slurm, overrides, source=str(config.path))
    submitted = dict((s.name, job) for s, job in slurm.submit(config, specs, out, settings, log))
    if not wait:
        return [RunResult(s, run_dir_of(out, s).resolve(), "submitted" if s.name in submitted else "skipped")
                for s in specs]
    with _watching(watcher):  # the cells' epochs, read from their folders as they train on the cluster
        statuses = {status.run: status for status in slurm.wait(config, specs, out, log=log)}
    names = {"done": "done", "unfinished": "unfinished"}
    results = [RunResult(s, run_dir_of(out, s).resolve(), names.get(statuses[f"{s.grid}/{s.name}"].state, "failed"))
               for s in specs]
    paths = gather_results(out)
    log(f"done: {sum(r.status == 'done' for r in results)} finished, {sum(r.status == 'failed' for r in results)} "
        f"failed, {sum(r.status == 'unfinished' for r in results)} unfinished")
    log(paths["table1_md"].read_text())
    return results


def _parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), yaml.safe_load(value)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="rpm-batch",
        description=(
            "Run a grid of notebook executions with papermill (one run folder per grid point, named from its "
            "parameters), resumably: runs whose folder holds metrics.json are skipped; a failing run keeps its "
            "executed notebook and error.txt and does not stop the others. At the end writes results.csv and "
            "table1.csv / table1.md (the MLCL paper's Table 1 layout, with the published numbers), and test_sets.csv "
            "(every run's in- / out-of-distribution test sets) when runs report them, into the batch folder. The "
            "YAML format is described in rpm_lib/batch.py and configs/table1.yaml."),
        epilog=("examples:\n"
                "  rpm-batch configs/demo.yaml --dry-run        # print the plan\n"
                "  rpm-batch configs/demo.yaml --jobs 2\n"
                "  rpm-batch configs/table1.yaml --jobs 4       # the paper's grid (GPU machine)\n"
                "  rpm-batch configs/table1.yaml --grid ablation_beta --set max_epochs=10\n"
                "  rpm-batch configs/regimes_cpu.yaml           # train on a regime, test in / out of distribution\n"
                "  rpm-batch --gather runs/table1              # only rebuild results.csv / table1.md\n"
                "  rpm-batch configs/table1_scl_gpu.yaml --jobs 5 --cuda-devices 0 --time-budget 540   # one GPU slice\n"
                "  rpm-batch pack runs/table1_scl --out state.tar.gz   # resumable state (also: unpack, progress;\n"
                "                                                  #   rpm-batch pack --help)"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", nargs="?", help="batch YAML (e.g. configs/table1.yaml)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="runs executed in parallel (default 1)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (runs, parameters, skips) and exit")
    parser.add_argument("--prepare-only", action="store_true",
                        help="run the YAML's prepare steps (make the data) and exit, e.g. before a time-limited "
                             "call or job that should spend its time on training")
    parser.add_argument("--out", help="batch folder (default: the YAML's 'out')")
    parser.add_argument("--grid", action="append", help="run only this grid (repeatable; default: default grids)")
    parser.add_argument("--set", dest="overrides", action="append", type=_parse_override, default=[],
                        metavar="KEY=VALUE", help="force a notebook parameter on every run (YAML value; repeatable)")
    parser.add_argument("--cuda-devices", help="comma-separated GPU ids assigned round-robin to runs, e.g. 0,1,2,3")
    parser.add_argument("--gather", metavar="BATCH_DIR", help="only gather results of an existing batch folder")
    parser.add_argument("--time-budget", type=float, metavar="SECONDS",
                        help="wall-clock seconds for this call: runs stop at a step boundary before it ends, leave a "
                             "resumable state and count as unfinished (exit status 75); run again to continue. A run still "
                             f"going {BACKSTOP_S:g} s after it has ended is asked to stop at its next step")
    parser.add_argument("--executor", choices=("local", "slurm"), default="local",
                        help="where runs execute: local processes (default) or one SLURM job array through submitit "
                             "(settings: the YAML's 'slurm:' mapping and --slurm; docs/cluster.md)")
    parser.add_argument("--slurm", dest="slurm", action="append", type=_parse_override, default=[],
                        metavar="KEY=VALUE", help="a SLURM setting over the YAML's (partition, account, time_min, "
                        "cpus_per_task, gpus_per_task, mem_gb, signal_delay_s, max_requeues, array_parallelism, "
                        "extra, setup); repeatable")
    parser.add_argument("--wait", action="store_true",
                        help="with --executor slurm: wait for the array, then write the tables (else return once "
                             "submitted; `rpm-batch status CONFIG` shows the cells)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no live progress lines (one per finished epoch of each running run; the start / done "
                             "lines and the tables stay)")
    parser.add_argument("--stall-minutes", type=float, default=STALL_MINUTES, metavar="MIN",
                        help="report a running run whose folder has not changed for MIN minutes as 'no progress' "
                             f"(it is not stopped; default {STALL_MINUTES:g})")
    parser.add_argument("--cuda-mps", action="store_true",
                        help="NVIDIA GPUs: the runs executed at once share their GPU through a private CUDA "
                             "Multi-Process Service daemon, so that their kernels may run side by side instead of "
                             "taking turns (started before the first run, stopped after the last; local runs only). "
                             "Whether it pays: bench/bench_concurrent_runs.py --cuda-mps")
    parser.add_argument("--workers-per-run", type=_workers, metavar="N|auto",
                        help="DataLoader workers of each run (its num_workers); auto: the cores shared among the runs "
                             "executed at once (--jobs, or the runs left to train when fewer), one kept for each "
                             "run's training process")
    return parser


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a count or 'auto', got {text!r}")
    return int(text)


def build_state_parser() -> argparse.ArgumentParser:
    """``rpm-batch pack | unpack | progress``: a batch folder's resumable state and standing."""
    parser = OneLineArgumentParser(
        prog="rpm-batch",
        description="Carry a batch's (or one run's) resumable state to another machine, or show where its runs "
                    "stand. pack keeps only what resuming needs (config, progress, history, results; the "
                    "checkpoints of unfinished runs, best weights reduced to the model); unpack checks every file's "
                    "SHA-256 and refuses anything but run-state files. Resume there with the same command after "
                    "regenerating the data: a run refuses data whose fingerprint differs from its progress.json.",
        epilog="examples:\n"
               "  rpm-batch pack runs/table1_scl --out results/table1_scl_gpu/state.tar.gz\n"
               "  rpm-batch unpack results/table1_scl_gpu/state.tar.gz --out runs/table1_scl\n"
               "  rpm-batch progress runs/table1_scl --plot runs/table1_scl/progress.png --paper",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    pack = commands.add_parser("pack", help="pack the resumable state of every run under a folder")
    pack.add_argument("folder", help="a batch folder or one run folder")
    pack.add_argument("--out", required=True,
                      help="archive to write (.tar.gz); replaces an archive written by pack, never another file")
    pack.add_argument("--keep-final-weights", action="store_true",
                      help="also keep finished runs' final weights (resuming never needs them)")
    pack.add_argument("--compact", action="store_true",
                      help="store unfinished runs' Adam moments in bfloat16 (12 instead of 16 bytes per parameter; "
                           "resuming is then not bit-exact: for GPU runs, which are not bit-exact anyway)")
    unpack = commands.add_parser("unpack", help="restore run folders from an archive")
    unpack.add_argument("archive", help="an archive written by rpm-batch pack")
    unpack.add_argument("--out", required=True, help="folder to restore into (the packed folder's place)")
    unpack.add_argument("--overwrite", action="store_true",
                        help="replace runs already there, each as a whole (their progress, results and checkpoints "
                             "that the archive lacks are removed); a run that had gone further is named on stderr")
    unpack.add_argument("--keep-further", action="store_true",
                        help="with --overwrite: keep a run already there that had gone further than the archive's "
                             "(finished, or more steps or epochs) instead of replacing it, and say so on stderr; "
                             "e.g. a second time slice on a machine that still holds the first one's runs")
    progress = commands.add_parser("progress", help="print each run's status, epochs and validation accuracy")
    progress.add_argument("folder", help="a batch folder")
    progress.add_argument("--json", action="store_true", help="print JSON (one object per run) instead of a table")
    progress.add_argument("--json-out", metavar="FILE",
                          help="also write that JSON into FILE (the table is printed as without it)")
    progress.add_argument("--plot", metavar="PNG",
                          help="also draw each run's validation accuracy over its epochs into this PNG file")
    progress.add_argument("--paper", action="store_true",
                          help="with --plot: dash the MLCL paper's Table 1 test average of each run's encoder and "
                               "setup (I-RAVEN at the paper's settings)")
    return parser


def state_main(argv: Sequence[str]) -> int:
    """``rpm-batch pack | unpack | progress``; returns 2 for bad input (one line on stderr)."""
    from rpm_lib import run_archive, run_progress

    parser = build_state_parser()
    args = parser.parse_args(argv)
    for name in ("folder", "archive", "out"):
        # Path("") is the current folder: an unset shell variable would pack, unpack or list whatever is here
        if getattr(args, name, None) is not None and not getattr(args, name).strip():
            parser.error(f"argument {name if name != 'out' else '--out'}: empty path")
    try:
        if args.command == "pack":
            runs = run_archive.pack(args.folder, args.out, keep_final_weights=args.keep_final_weights,
                                    compact=args.compact)
            print(f"rpm-batch pack: {len(runs)} run(s) into {args.out} ({Path(args.out).stat().st_size / 1e6:.2f} MB)")
            print("\n".join(run_archive.describe(runs)))
        elif args.command == "unpack":
            manifest = run_archive.unpack(
                args.archive, args.out, overwrite=args.overwrite, keep_further=args.keep_further,
                warn=lambda line: print(f"rpm-batch unpack: {'note' if args.keep_further else 'warning'}: {line}",
                                        file=sys.stderr))
            print(f"rpm-batch unpack: {len(manifest['runs'])} run(s), {len(manifest['files'])} files into {args.out} "
                  f"(packed {manifest.get('created', '?')})")
        else:
            if not Path(args.folder).is_dir():
                raise run_archive.ArchiveError(f"{args.folder}: no such batch folder")
            if args.plot is not None and not args.plot.lower().endswith(".png"):  # "" too: an unset shell variable
                raise run_archive.ArchiveError(f"--plot {args.plot}: give a .png file name")
            if args.paper and args.plot is None:
                raise run_archive.ArchiveError("--paper draws into the figure: give --plot PNG too")
            if args.json_out is not None and not args.json_out.strip():
                raise run_archive.ArchiveError("--json-out: empty path")
            runs = run_progress.batch_progress(args.folder)
            if args.json_out is not None:
                Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json_out).write_text(json.dumps([dataclasses.asdict(run) for run in runs], indent=1) + "\n")
            if args.json:
                print(json.dumps([dataclasses.asdict(run) for run in runs], indent=1))
            else:
                print(run_progress.progress_table(runs))
            if args.plot is not None:
                figure = run_progress.progress_figure(args.folder, runs, paper=args.paper)
                Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
                figure.savefig(args.plot, dpi=100, bbox_inches="tight")
                print(f"rpm-batch progress: figure written to {args.plot}", file=sys.stderr if args.json else sys.stdout)
    except run_archive.ArchiveError as error:
        print(f"rpm-batch {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a file that cannot be read or written (permissions, a vanished run folder, ...)
        print(f"rpm-batch {args.command}: error: {error.filename or args.command}: {error.strerror or error}",
              file=sys.stderr)
        return 2
    return 0


STATE_COMMANDS = ("pack", "unpack", "progress")
SLURM_COMMANDS = ("status", "cancel")


def slurm_main(argv: Sequence[str]) -> int:
    """``rpm-batch status | cancel CONFIG``: the cells of a batch submitted with ``--executor slurm``."""
    from rpm_lib import slurm

    parser = OneLineArgumentParser(prog=f"rpm-batch {argv[0]}", description=(
        "status: each cell of a batch submitted with --executor slurm (done, failed, unfinished, or SLURM's state: "
        "pending, running, requeued, ...), its job id and requeues. cancel: scancel the cells' jobs SLURM still "
        "lists (finished runs keep their results; rerun the batch to resume the others)."))
    parser.add_argument("config", help="the batch YAML")
    parser.add_argument("--out", help="batch folder (default: the YAML's 'out')")
    parser.add_argument("--grid", action="append", help="only this grid (repeatable; default: default grids)")
    args = parser.parse_args(argv[1:])
    try:
        config = load_batch_config(args.config)
        out = Path(args.out) if args.out else config.out
        specs = expand_grid(config, args.grid)
        if argv[0] == "status":
            print(slurm.status_table(slurm.cell_status(config, specs, out)))
        else:
            jobs = slurm.cancel(config, specs, out)
            print(f"rpm-batch cancel: {len(jobs)} job(s) cancelled" + (f": {' '.join(jobs)}" if jobs else ""))
    except (BatchConfigError, FileNotFoundError, slurm.SlurmError) as exc:
        print(f"rpm-batch {argv[0]}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``rpm-batch``; returns 1 when any run failed, 75 when runs are unfinished (time budget),
    2 for bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in STATE_COMMANDS:
        return state_main(argv)
    if argv and argv[0] in SLURM_COMMANDS:
        return slurm_main(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if not args.stall_minutes > 0:
        parser.error(f"--stall-minutes must be a positive number of minutes, got {args.stall_minutes:g}")
    if (problem := _time_budget_problem(args.time_budget)) is not None:
        parser.error(problem)  # before the YAML is read, like the other arguments
    if args.gather:
        if not Path(args.gather).is_dir():
            parser.error(f"--gather: batch folder {args.gather} does not exist")
        try:
            written = gather_results(args.gather)
        except OSError as error:  # a shared folder one may read but not write: what and where, no traceback
            print_error("rpm-batch", f"--gather: {error.strerror or error} ({error.filename or args.gather}); the "
                        "tables are written into the batch folder: gather a copy of it that you can write to")
            return 1
        for key, p in written.items():
            print(f"{key}: {p}")
        print(Path(args.gather, "table1.md").read_text())
        return 0
    if not args.config:
        parser.error("a batch YAML is required (or --gather BATCH_DIR)")
    devices = [d.strip() for d in args.cuda_devices.split(",")] if args.cuda_devices else None
    if devices is not None and not all(devices):
        parser.error(f"--cuda-devices: an empty GPU id in {args.cuda_devices!r} (e.g. 0,1,2,3)")
    # CUDA_VISIBLE_DEVICES takes indices and UUIDs; anything else hides every GPU, and a run with
    # accelerator=auto would then train on the CPU without a word
    unknown = [d for d in devices or () if not re.fullmatch(r"\d+|(GPU|MIG)-\S+", d)]
    if unknown:
        parser.error(f"--cuda-devices: {unknown[0]!r} is neither a GPU index (0, 1, ...) nor a GPU-/MIG- UUID "
                     "(nvidia-smi -L lists both); CUDA would show such a run no GPU")
    try:
        if args.prepare_only:
            config = load_batch_config(args.config)
            if not config.prepare:
                print(f"rpm-batch: {config.path} has no prepare steps; nothing to do")
            _run_prepare(config, args.dry_run, (lambda *_: None) if args.quiet else _printer())
            return 0
        results = run_batch(args.config, jobs=args.jobs, dry_run=args.dry_run, out=args.out, grids=args.grid,
                            overrides=dict(args.overrides), cuda_devices=devices,
                            time_budget=args.time_budget, workers_per_run=args.workers_per_run,
                            executor=args.executor, slurm=dict(args.slurm), wait=args.wait,
                            live=not args.quiet, stall_minutes=args.stall_minutes, cuda_mps=args.cuda_mps)
    except (BatchConfigError, FileNotFoundError, RuntimeError) as exc:  # RuntimeError: a failed prepare step, SLURM
        print(f"rpm-batch: error: {exc}", file=sys.stderr)
        return 2
    if any(r.status == "failed" for r in results):
        return 1
    return UNFINISHED_EXIT_CODE if any(r.status == "unfinished" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
