"""Live progress of the runs a batch is executing: one line per finished epoch, and a notice for a quiet run.

``rpm-batch`` (and so ``make demo``) starts a :class:`LiveProgress` beside its runs. It never talks to a run: it
polls each run folder from the outside, so it works the same for runs in local processes and for jobs on a
cluster that share the folder. What it reads is what a run keeps up to date anyway:

* ``run.json`` (rewritten by ``rpm-batch`` when a run starts): a run counts as started once this file changes;
* ``history.csv`` (one row per finished epoch, ``rpm_lib.training.history``): each new row gives one line, e.g.
  ``[1/2] main/setup-ce__seed-0 supervised epoch 3/5: train loss 1.8312, val acc 31.2%, 2m10s elapsed,
  ETA run 1m30s, grid 6m05s``;
* ``config.yaml`` (the run's TrainConfig): the epoch limit N of each stage (``rpm_lib.runs.plan``);
* ``metrics.json`` / ``error.txt``: written since the run started, the run has ended (executors that do not tell);
* every file of the folder: a run whose folder has not changed for ``stall_s`` seconds is reported once per such
  period as ``no progress for N min`` (it is not stopped: a long epoch or evaluation looks the same).

Times are measured with this process's clock (when a change was seen), never from file times, so a cluster's
skewed clocks do not matter. ETAs are estimates: the epochs left up to each stage's limit times the seconds per
epoch measured so far (of that stage when it has run, else of the latest measured stage). Where early stopping
could end a run sooner, its ETA is a range that starts with the fewest epochs early stopping leaves
(``rpm_lib.training.early_stopping``, replayed from the validation losses in ``history.csv`` with the run's
``patience`` and ``min_delta``). The grid's adds the runs not yet started (their epoch limits when known, else the
average run) shared among the runs executed at once.
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpm_lib.run_folder import ERROR, HISTORY, METRICS, RUN_RECORD
from rpm_lib.runs.plan import epochs_of, run_config, stage_plans, train_config, views_of
from rpm_lib.training import early_stopping
from rpm_lib.training.history import history_rows

#: Default seconds between two looks at the run folders.
POLL_SECONDS = 2.0
#: Files whose writing tells that a run ended (for executors that do not tell the watcher: a cluster's).
END_FILES: tuple[str, ...] = (METRICS, ERROR)
#: Default seconds without any change in a run folder before ``no progress`` is reported (``--stall-minutes``).
STALL_SECONDS = 600.0


def duration(seconds: float) -> str:
    """``42 s``, ``3m05s``, ``1h07m``: a length of time for a progress line."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.0f} min"


def stage_views(values: Mapping[str, Any]) -> dict[str, int] | None:
    """Views per RPM of each stage (MLCL pre-training: 2): an epoch's cost scales with them, so a stage not yet
    measured is estimated from a measured one per view."""
    return views_of(stage_plans(train_config(values)))


@dataclass
class _Run:
    """What the watcher knows of one run."""

    key: str
    run_dir: Path
    label: str
    planned: dict[str, int] | None  # epoch limits when known before the run starts
    initial: int | None  # run.json's mtime_ns when watching began
    started: float | None = None
    ended: bool = False
    seen: set[tuple[str, int]] = field(default_factory=set)
    done: dict[str, int] = field(default_factory=dict)  # stage -> epochs finished (all rows, earlier slices too)
    last_stage: str | None = None
    epoch_seconds: dict[str, list[float]] = field(default_factory=dict)  # measured here, per stage
    last_event: float = 0.0
    history_mtime: int | None = None
    signature: tuple[int, int] | None = None
    last_change: float = 0.0
    notices: int = 0
    own_plan: bool = False
    end_marks: dict[str, int | None] = field(default_factory=dict)  # END_FILES' mtime_ns when it started
    views: dict[str, int] | None = None  # views per RPM of each stage, when known
    losses: dict[str, list[float]] = field(default_factory=dict)  # stage -> validation loss of each epoch (NaN: none)
    stopping: tuple[int, float] | None = None  # (patience, min_delta) from the run's config.yaml, when known

    def plan(self) -> dict[str, int] | None:
        """The epoch limits, from the run's own ``config.yaml`` once it has one."""
        if self.started is not None and not self.own_plan:
            values = run_config(self.run_dir)
            config = None if values is None else train_config(values)
            plans = stage_plans(config)
            if plans is not None:
                self.planned, self.views, self.own_plan = epochs_of(plans), views_of(plans), True
                self.stopping = (config.patience, config.min_delta)
        return self.planned

    def view_count(self, stage: str) -> int:
        return max(1, (self.views or {}).get(stage, 1))

    def remaining_seconds(self, fallback_per_view: float | None, fewest: bool = False) -> float | None:
        """Estimated seconds left in training (None: no epoch limit or no measured rate yet). A stage not measured
        yet costs the latest measured stage's seconds per epoch and view times its own views. Every stage runs to
        its epoch limit; with ``fewest`` (and the run's early-stopping settings known), each ends as soon as early
        stopping can end it (:func:`rpm_lib.training.early_stopping.epochs_left`)."""
        plan = self.planned
        rates = {stage: sum(v) / len(v) for stage, v in self.epoch_seconds.items() if v}
        measured = self.last_stage if self.last_stage in rates else (list(rates)[-1] if rates else None)
        per_view = rates[measured] / self.view_count(measured) if measured is not None else fallback_per_view
        if plan is None or per_view is None:
            return None
        stages = list(plan)
        current = stages.index(self.last_stage) if self.last_stage in stages else 0
        left = 0.0
        for position, stage in enumerate(stages):
            if position < current:
                continue
            done = self.done.get(stage, 0) if position == current else 0
            epochs = max(0, plan[stage] - done)
            if fewest and self.stopping is not None:
                losses = self.losses.get(stage, []) if position == current else []
                epochs = early_stopping.epochs_left(losses, done, plan[stage], *self.stopping)[0]
            left += epochs * rates.get(stage, per_view * self.view_count(stage))
        return left


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _folder_signature(folder: Path) -> tuple[int, int]:
    """(newest mtime_ns, number of entries) below ``folder``: changes whenever the run writes anything."""
    newest, count = 0, 0
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            mtime = _mtime_ns(Path(root) / name)
            if mtime is not None:
                newest, count = max(newest, mtime), count + 1
    return newest, count


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


class LiveProgress:
    """Watch run folders from the outside and print a line per finished epoch (see the module docstring).

    Args:
        runs: ``(key, run folder)`` of every run the batch will execute, in order (key: ``grid/name``).
        log: where lines go (``print``-like, one string).
        stall_s: seconds without any change in a started run's folder before ``no progress`` is reported.
        poll_s: seconds between two looks (the thread of :meth:`start`; default :data:`POLL_SECONDS`).
        planned: key -> epoch limit per stage, for runs whose training is known before they start (grid ETA).
        views: key -> views per RPM of each stage (:func:`stage_views`), which scale an epoch's estimated cost.
        jobs: runs executed at once (the grid's ETA shares the work left among them).
        clock: seconds, monotonic (tests pass their own).

    Use as a context manager (a daemon thread polls) or call :meth:`poll` yourself. :meth:`ended` reports a
    run's last lines and stops watching it; a run whose folder shows an end (``metrics.json`` or ``error.txt``
    written after it started) stops being watched by itself.
    """

    def __init__(self, runs: Sequence[tuple[str, Path]], log: Callable[[str], Any], stall_s: float = STALL_SECONDS,
                 poll_s: float | None = None, planned: Mapping[str, dict[str, int] | None] | None = None,
                 jobs: int = 1, clock: Callable[[], float] = time.monotonic,
                 views: Mapping[str, dict[str, int] | None] | None = None) -> None:
        if not stall_s > 0:
            raise ValueError(f"stall time must be a positive number of seconds, got {stall_s}")
        self.log = log
        self.stall_s = float(stall_s)
        self.poll_s = POLL_SECONDS if poll_s is None else float(poll_s)
        self.jobs = max(1, int(jobs))
        self.clock = clock
        planned = planned or {}
        total = len(runs)
        self.runs = [_Run(key, Path(run_dir), f"[{i}/{total}] {key}", planned.get(key),
                          _mtime_ns(Path(run_dir) / RUN_RECORD)) for i, (key, run_dir) in enumerate(runs, 1)]
        self._by_key = {run.key: run for run in self.runs}
        for run in self.runs:
            run.views = (views or {}).get(run.key)
        for run in self.runs:  # rows an earlier call left (a resumed run) are not news
            run.history_mtime = _mtime_ns(run.run_dir / HISTORY)
            self._absorb(run, history_rows(run.run_dir / HISTORY))
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._announced = False

    # -- thread --------------------------------------------------------------------------------
    def start(self) -> "LiveProgress":
        self._thread = threading.Thread(target=self._loop, name="rpm-live-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread after a last look."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._safe_poll(set())

    def __enter__(self) -> "LiveProgress":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _loop(self) -> None:
        said: set[str] = set()
        while not self._stop.wait(self.poll_s):
            self._safe_poll(said)

    def _safe_poll(self, said: set[str]) -> None:
        try:
            self.poll()
        except Exception as error:  # noqa: BLE001 - progress lines must never stop a batch
            message = f"  (live progress: {type(error).__name__}: {error})"
            if message not in said:  # once, not at every look
                said.add(message)
                self.log(message)

    # -- polling -------------------------------------------------------------------------------
    def ended(self, key: str) -> None:
        """The run ``key`` has ended: print what it wrote since the last look, then stop watching it."""
        with self._lock:
            run = self._by_key.get(key)
            if run is None or run.ended:
                return
            try:
                if run.started is None and _mtime_ns(run.run_dir / RUN_RECORD) != run.initial:
                    self._start(run, self.clock())
                if run.started is not None:
                    self._epochs(run, self.clock())
            except Exception as error:  # noqa: BLE001 - progress lines must never stop a batch
                self.log(f"  (live progress: {type(error).__name__}: {error})")
            run.ended = True

    def poll(self) -> None:
        """One look at every run not yet ended: starts, new epochs (a line each), stalls (a notice)."""
        with self._lock:
            now = self.clock()
            for run in self.runs:
                if run.ended:
                    continue
                if run.started is None:
                    if _mtime_ns(run.run_dir / RUN_RECORD) == run.initial:
                        continue
                    self._start(run, now)
                self._epochs(run, now)
                if self._finished_on_disk(run):
                    run.ended = True
                    continue
                self._stall(run, now)

    def _start(self, run: _Run, now: float) -> None:
        run.started = run.last_event = run.last_change = now
        run.signature = _folder_signature(run.run_dir)
        run.end_marks = {name: _mtime_ns(run.run_dir / name) for name in END_FILES}

    def _absorb(self, run: _Run, rows: list[dict[str, str]]) -> list[dict[str, str]]:
        """Record ``rows`` (all of ``history.csv``); returns those not seen before."""
        new = []
        run.losses = {}
        for row in rows:
            try:
                key = (row["stage"], int(row["epoch"]))
            except (KeyError, TypeError, ValueError):
                continue
            loss = _number(row.get("val_loss"))
            run.losses.setdefault(key[0], []).append(math.nan if loss is None else loss)
            run.done[key[0]] = max(run.done.get(key[0], 0), key[1] + 1)
            run.last_stage = key[0]
            if key not in run.seen:
                run.seen.add(key)
                new.append(row)
        return new

    def _epochs(self, run: _Run, now: float) -> None:
        mtime = _mtime_ns(run.run_dir / HISTORY)
        if mtime == run.history_mtime:
            return
        run.history_mtime = mtime
        new = self._absorb(run, history_rows(run.run_dir / HISTORY))
        if not new:
            return
        share = (now - run.last_event) / len(new)
        run.last_event = now
        for row in new:
            run.epoch_seconds.setdefault(row["stage"], []).append(share)
        plan = run.plan()
        for row in new:
            self.log(self._epoch_line(run, row, plan, now))
        if not self._announced:
            self._announced = True
            grid = self._grid_seconds()
            if grid is not None:
                at = time.strftime("%H:%M", time.localtime(time.time() + grid))
                self.log(f"  first epoch measured ({duration(share)}): the runs' training should end within about "
                         f"{duration(grid)} on this machine (by {at}; sooner where early stopping ends a run; "
                         "evaluation notebooks come on top)")

    def _epoch_line(self, run: _Run, row: dict[str, str], plan: dict[str, int] | None, now: float) -> str:
        stage, epoch = row["stage"], int(row["epoch"]) + 1
        limit = f"/{plan[stage]}" if plan and stage in plan else ""
        parts = []
        loss = _number(row.get("train_loss"))
        if loss is not None:
            parts.append(f"train loss {loss:.4f}")
        accuracy = _number(row.get("val_accuracy"))
        if accuracy is not None:
            parts.append(f"val acc {100 * accuracy:.1f}%")
        else:
            val_loss = _number(row.get("val_loss"))
            if val_loss is not None:
                parts.append(f"val loss {val_loss:.4f}")
        parts.append(f"{duration(now - run.started if run.started is not None else 0.0)} elapsed")
        mean = self._mean_epoch_seconds()
        left = run.remaining_seconds(mean)
        if left is not None:
            soonest = duration(run.remaining_seconds(mean, fewest=True) or 0.0)
            # early stopping may end the run sooner than its epoch limits: from the soonest it can to the limits
            eta = f"ETA run {soonest + '–' if soonest != duration(left) else ''}{duration(left)}"
            grid = self._grid_seconds()
            others = any(not other.ended and other is not run for other in self.runs)
            parts.append(eta + (f", grid {duration(grid)}" if grid is not None and others else ""))
        return f"  {run.label} {stage} epoch {epoch}{limit}: " + ", ".join(parts)

    def _mean_epoch_seconds(self) -> float | None:
        """Mean measured seconds per epoch and view (see :func:`stage_views`) over every run and stage."""
        values = [s / run.view_count(stage) for run in self.runs for stage, seconds in run.epoch_seconds.items()
                  for s in seconds]
        return sum(values) / len(values) if values else None

    def _grid_seconds(self) -> float | None:
        """Estimated seconds until every run not yet ended has trained (None when something is unknown)."""
        rate = self._mean_epoch_seconds()
        if rate is None:
            return None
        now = self.clock()
        running: list[float] = []
        totals: list[float] = []  # elapsed + left of the running runs: the average run, for waiting runs of no plan
        waiting = []
        for run in self.runs:
            if run.ended:
                continue
            if run.started is None:
                waiting.append(run)
                continue
            left = run.remaining_seconds(rate)
            if left is None:
                return None
            running.append(left)
            totals.append(now - run.started + left)
        pending = 0.0
        for run in waiting:
            if run.planned is not None:
                pending += sum(epochs * run.view_count(stage) for stage, epochs in run.planned.items()) * rate
            elif totals:
                pending += sum(totals) / len(totals)
            else:
                return None
        return max(max(running, default=0.0), (sum(running) + pending) / self.jobs)

    def _finished_on_disk(self, run: _Run) -> bool:
        """Whether the folder shows that the run ended since it started (for executors that do not tell: a
        cluster's jobs): ``metrics.json`` or ``error.txt`` written."""
        return any(_mtime_ns(run.run_dir / name) not in (None, mtime) for name, mtime in run.end_marks.items())

    def _stall(self, run: _Run, now: float) -> None:
        signature = _folder_signature(run.run_dir)
        if signature != run.signature:
            run.signature, run.last_change, run.notices = signature, now, 0
            return
        quiet = now - run.last_change
        if quiet >= self.stall_s * (run.notices + 1):
            run.notices += 1
            self.log(f"  {run.label}: no progress for {_minutes(quiet)} (nothing written to {run.run_dir}; "
                     "still running, not stopped)")
