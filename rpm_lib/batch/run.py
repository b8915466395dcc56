"""One ``rpm-batch`` call on a batch YAML (:func:`run_batch`): plan the runs (finished ones are skipped), run the
``prepare`` steps, execute the cells (here, ``rpm_lib.batch.local``, or as a SLURM job array,
``rpm_lib.batch.slurm``), then write the batch folder's tables (:func:`gather_results`) and its report notebook.

At the end ``<out>/results.csv`` (one line per run) and ``<out>/table1.csv`` / ``<out>/table1.md`` (the paper's
Table 1 layout, ``rpm_lib.results``) and, when runs report extra test sets, ``<out>/test_sets.csv`` (one line per run
and evaluated set) are written, and the ``report`` notebook (if any) is executed into ``<out>/<stem>.ipynb`` with
``batch_dir=<out>`` and ``output_dir=<out>/report``.

Time-boxed batches (``--time-budget SECONDS``): every run started gets ``time_budget`` = the time left (less
``rpm_lib.batch.cell.BATCH_MARGIN_S`` for its kernel and the tables) and ``resume=true``; a run the budget cut short
ends ``unfinished`` (its ``progress.json`` says so, ``03_train`` skips its figures), the ``then`` notebooks wait for a
finished run, runs not started for lack of time are ``unfinished`` too, and ``rpm-batch`` exits with 75. Running the
same command again continues.

While runs execute (locally, or on SLURM with ``--wait``), a line per finished epoch of each running run gives its
stage, epoch, losses, validation accuracy and the estimated time left for the run and the grid, and a run whose
folder stays unchanged for ``--stall-minutes`` is reported (not stopped); ``--quiet`` turns these lines off
(``rpm_lib.runs.live``, which reads them from the run folders).
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rpm_lib.batch.cell import RunResult, describe_error, notebook_failed, run_dir_of
from rpm_lib.batch.config import (OUTPUT_DIR_PARAMETER, BatchConfig, BatchConfigError, RunSpec, SlurmSettings,
                                  job_settings, load_batch_config, parse_settings)
from rpm_lib.batch.grid import expand_grid
from rpm_lib.batch.local import run_locally, through_cuda_mps, watching
from rpm_lib.batch.notebook import check_parameters, notebook_parameters
from rpm_lib.batch.prepare import run_prepare
from rpm_lib.cuda_mps import find_control
from rpm_lib.runs.live import STALL_SECONDS, LiveProgress, stage_views
from rpm_lib.runs.plan import stage_epochs
from rpm_lib.notebook_execution import execute_notebook, kernel_log_of
from rpm_lib.run_folder import RunStatus, is_finished

#: Default of ``--stall-minutes``: a running run whose folder has not changed for this long is reported.
STALL_MINUTES = STALL_SECONDS / 60


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
        executor: ``local`` (processes here) or ``slurm`` (one job array, ``rpm_lib.batch.slurm``; the ``prepare``
            steps still run here first).
        slurm: ``--slurm KEY=VALUE`` settings over the YAML's ``slurm:`` mapping.
        wait: with ``slurm``, wait for the array and gather the tables (else return once it is submitted;
            results then have status ``submitted``).
        live: a line per finished epoch of every running run (``rpm_lib.runs.live``; local runs, and SLURM
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
    if (problem := time_budget_problem(time_budget)) is not None:
        raise BatchConfigError(problem)
    if not stall_minutes > 0:
        raise BatchConfigError(f"--stall-minutes must be a positive number of minutes, got {stall_minutes}")
    if time_budget is not None and executor == "slurm":  # was dropped without a word
        raise BatchConfigError("--time-budget: on SLURM each task's budget is its time limit (the YAML's slurm "
                               "'time_min', less 'signal_delay_s'); drop --time-budget or use --executor local")
    if cuda_mps and executor != "local":
        raise BatchConfigError("--cuda-mps: an MPS daemon is started for local runs only (on SLURM, ask the site "
                               "for MPS, e.g. through its gres)")
    if cuda_mps and not dry_run:
        find_control()  # before the prepare steps, which may take minutes: no daemon, one line now
    deadline = None if time_budget is None else (time.time() + time_budget, float(time_budget))
    log = (lambda *_: None) if quiet else printer()
    config = load_batch_config(config_path)
    out_dir = Path(out) if out is not None else config.out
    # the SLURM settings (YAML and --slurm) before any work, with every executor and in a dry run too
    settings = job_settings(config, out_dir, slurm or {}) if executor == "slurm" else parse_settings(
        config.slurm, slurm or {}, source=str(config.path))
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
    how = "as one SLURM job array" if executor == "slurm" else f"{jobs} at a time"
    log(f"rpm-batch {config.path}: {len(specs)} runs ({len(specs) - len(todo)} already finished), {how}, "
        f"into {out_dir}")
    if dry_run:
        if prepare:
            run_prepare(config, True, log)
        if cuda_mps:
            log("MPS: the runs would share the GPU through a private CUDA MPS daemon (not checked in a dry run)")
        results = []
        for spec, run_dir, finished in plan:
            status = RunStatus.SKIPPED if finished else RunStatus.PLANNED
            params = " ".join(f"{k}={v!r}" for k, v in spec.parameters.items())
            log(f"  [{status}] {run_dir}: {params}")
            results.append(RunResult(spec, run_dir, status))
        return results
    if prepare:
        run_prepare(config, False, log)
    watcher = _watcher(config, todo, log, jobs, stall_minutes) if live and not quiet else None
    if executor == "slurm":
        return _run_on_slurm(config, specs, out_dir, settings, wait, log, watcher)
    if executor != "local":
        raise BatchConfigError(f"--executor must be local or slurm, got {executor!r}")
    by_name: dict[tuple[str, str], RunResult] = {
        (s.grid, s.name): RunResult(s, d.resolve(), RunStatus.SKIPPED) for s, d, f in plan if f}
    devices = list(cuda_devices) if cuda_devices else None

    def device_for(i: int) -> str | None:
        return None if devices is None else devices[i % len(devices)]

    def report(i: int, res: RunResult) -> None:
        by_name[(res.spec.grid, res.spec.name)] = res
        if watcher is not None:
            watcher.ended(f"{res.spec.grid}/{res.spec.name}")
        tail = "" if res.error is None else f": {res.error.strip().splitlines()[-1]}"
        log(f"  [{i}/{len(todo)}] {res.status:6s} {res.spec.grid}/{res.spec.name} ({res.seconds:.1f} s){tail}")

    with through_cuda_mps(cuda_mps, log):
        run_locally(todo, config, out_dir, jobs, device_for, deadline, watcher, report, log)
    results = [by_name[(s.grid, s.name)] for s in specs]
    paths = gather_results(out_dir)
    failed = [r for r in results if r.status == RunStatus.FAILED]
    unfinished = [r for r in results if r.status == RunStatus.UNFINISHED]
    log(f"done: {sum(r.status == RunStatus.DONE for r in results)} run, "
        f"{sum(r.status == RunStatus.SKIPPED for r in results)} "
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


#: The longest ``--time-budget``: 30 days.
MAX_TIME_BUDGET_S = 30 * 24 * 3600


def time_budget_problem(seconds: float | None) -> str | None:
    """What is wrong with a batch's time budget (``None``: no budget, or a usable one)."""
    if seconds is None or (math.isfinite(seconds) and 0 < seconds <= MAX_TIME_BUDGET_S):
        return None
    if math.isfinite(seconds) and seconds > 0:
        return f"--time-budget must be at most {MAX_TIME_BUDGET_S} seconds (30 days), got {seconds:g}"
    return f"--time-budget must be a positive, finite number of seconds, got {seconds:g}"


def _plan(config: BatchConfig, out_dir: Path, specs: list[RunSpec]) -> list[tuple[RunSpec, Path, bool]]:
    """(spec, run folder, finished) of each run: finished when its training wrote ``metrics.json`` and no ``then``
    notebook failed."""
    plan = []
    for spec in specs:
        run_dir = run_dir_of(out_dir, spec)
        finished = is_finished(run_dir) and not any(notebook_failed(run_dir / nb.name) for nb in config.then)
        plan.append((spec, run_dir, finished))
    return plan



def _run_on_slurm(config: BatchConfig, specs: list[RunSpec], out: Path, settings: SlurmSettings, wait: bool,
                  log: Callable[[str], None], watcher: LiveProgress | None = None) -> list[RunResult]:
    """``--executor slurm``: submit the cells as one job array; with ``wait``, stay until it is done and write the
    tables."""
    from rpm_lib.batch.slurm import submit, wait as wait_for_cells  # its task's modules load Lightning

    hint = f"rpm-batch status {config.path}" + ("" if out == config.out else f" --out {out}")
    submitted = dict((s.name, job) for s, job in submit(config, specs, out, settings, log, status_hint=hint))
    if not wait:
        return [RunResult(s, run_dir_of(out, s).resolve(),
                          RunStatus.SUBMITTED if s.name in submitted else RunStatus.SKIPPED) for s in specs]
    with watching(watcher):  # the cells' epochs, read from their folders as they train on the cluster
        statuses = {status.run: status for status in wait_for_cells(config, specs, out, log=log)}
    ended = (RunStatus.DONE, RunStatus.UNFINISHED)
    results = [RunResult(s, run_dir_of(out, s).resolve(), RunStatus(state) if (state := statuses[
        f"{s.grid}/{s.name}"].state) in ended else RunStatus.FAILED) for s in specs]
    paths = gather_results(out)
    log(f"done: {sum(r.status == RunStatus.DONE for r in results)} finished, "
        f"{sum(r.status == RunStatus.FAILED for r in results)} failed, "
        f"{sum(r.status == RunStatus.UNFINISHED for r in results)} unfinished")
    log(paths["table1_md"].read_text())
    return results



def gather_results(out: str | Path) -> dict[str, Path]:
    """Write the batch folder's tables (``rpm_lib.results.write_tables``: results.csv, table1.csv, table1.md and,
    when runs report extra test sets, test_sets.csv).

    Run folders may come from other machines: one that is damaged, contradicts its run.json, or is a symbolic link
    never stops the gather (``--gather`` and the end of a batch would lose every other run to its traceback); it
    is left out of Table 1 and named, with why, under the table in table1.md (which both print)."""
    from rpm_lib import results

    return results.write_tables(results.load_runs(out), out)


def _run_report(report: Path, out: Path, config: BatchConfig, log: Callable[[str], None]) -> dict[str, Path]:
    """Execute the batch's report notebook; a failure is logged (with the notebook kept), not raised."""
    out_nb = out / report.name
    try:
        params = {"batch_dir": str(out.resolve()), OUTPUT_DIR_PARAMETER: str((out / "report").resolve())}
        execute_notebook(report, out_nb, params, kernel_name=config.kernel, cwd=Path.cwd(),
                         execution_timeout=config.execution_timeout, kernel_stderr=kernel_log_of(out_nb))
    except Exception as exc:  # noqa: BLE001 - the runs are done; a broken report must not hide them
        log(f"report notebook {report} failed (see {out_nb}): {describe_error(exc).strip().splitlines()[-1]}")
    return {"report": out_nb}


def printer() -> Callable[[str], None]:
    """``print`` with flush, one line at a time: the live progress thread prints too."""
    lock = threading.Lock()

    def log(message: str) -> None:
        with lock:
            print(message, flush=True)

    return log



def _watcher(config: BatchConfig, todo: Sequence[tuple[RunSpec, Path]], log: Callable[[str], None], jobs: int,
             stall_minutes: float) -> LiveProgress:
    """The live progress of ``todo`` (see ``rpm_lib.runs.live``); each run's epoch limits are known beforehand
    when the template is a training notebook (every TrainConfig field a parameter, as ``03_train``)."""
    from rpm_lib.training.config import TrainConfig

    training = set(TrainConfig.field_names()) <= set(notebook_parameters(config.template))
    planned = {f"{s.grid}/{s.name}": stage_epochs(s.parameters) if training else None for s, _ in todo}
    views = {f"{s.grid}/{s.name}": stage_views(s.parameters) if training else None for s, _ in todo}
    return LiveProgress([(f"{s.grid}/{s.name}", d) for s, d in todo], log, stall_s=60.0 * stall_minutes,
                        planned=planned, jobs=jobs, views=views)
