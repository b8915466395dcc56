"""``progress.json`` of a run (:class:`ProgressRecord`): finished stages, status, time slices, data fingerprint.

``train`` writes it after every stage, when a time budget or a stop request ends a slice (``"status":
"unfinished"``) and when the run finishes; ``resume=true`` skips the stages it lists as completed and refuses data
whose fingerprint differs from the one it recorded when the run started.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from rpm_lib.run_folder import FINISHED, PROGRESS, UNFINISHED
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.run_dir import write_json
from rpm_lib.training.time_budget import Deadline, stage_start_seconds


class ProgressRecord:
    """``progress.json`` of a run: finished stages, the run's status, its time slices, the data fingerprint.

    Layout::

        {"status": "finished" | "unfinished",
         "stages": {name: summary},           # summary["completed"] is false for a stage a budget cut short;
                                              # summary["restarted"]: restart_stage=true began it again at step 0
         "data_fingerprint": "sha256-pieces-v1:...",   # every array file, pixels included
         "data_problems": "sha256-problems-v1:...",    # a cache's arrays but its pixels (absent for raw files)
         "data_opencv": {"rendered": "5.0.0", "resized": "5.0.0"},
         "data_changes": [...],                        # pixel changes accepted with data_check=problems
         "slices": [{"seconds": s, "ended_in": stage | "evaluation" | "end", "global_step": n,
                     "called_at": t, "process_s": s,  # when the call began (time.time()); its process's age then
                     "first_step_s": s}, ...]}       # first_step_s: only for a call that trained a step

    Args:
        run_dir: the run folder.
        progress: the file's content when resuming (``{}`` for a new run).
        writer: whether this process writes files (rank 0).
        data_check: ``exact`` or ``problems`` (:class:`TrainConfig`'s field).
        call: ``called_at`` and ``process_s`` of this training call, recorded in each of its slices.
    """

    def __init__(self, run_dir: Path, progress: dict[str, Any], writer: bool, data_check: str = "exact",
                 call: dict[str, float | None] | None = None) -> None:
        self.run_dir = run_dir
        self.progress = progress
        self.writer = writer
        self.data_check = data_check
        self.call = {k: v for k, v in (call or {}).items() if v is not None}  # called_at, process_s
        self._fingerprint: str | None = None  # computed once per process: every stage's data module asks

    @property
    def path(self) -> Path:
        return self.run_dir / PROGRESS

    def check_data(self, root: str | Path) -> str:
        """Fingerprint ``root``; record it for a new run, or refuse data that differ from the recorded one.

        Beside ``data_fingerprint`` (every pixel) a run records ``data_problems`` (a cache's arrays but its pixels,
        :func:`rpm_lib.data.fingerprint.problems_fingerprint`) and ``data_opencv`` (what drew and resized the
        pixels, :mod:`rpm_lib.data.opencv_version`); a run that began before these existed gets them at the next
        check its data pass. When only the pixels differ, the refusal says so and names both OpenCV versions;
        ``data_check="problems"`` then continues, appending the change to ``data_changes``.

        Raises:
            ConfigError: naming the folder, both fingerprints and what to do.
        """
        import rpm_lib.data.opencv_version as opencv_version
        from rpm_lib.data.fingerprint import data_fingerprint, problems_fingerprint

        if self._fingerprint is not None:
            return self._fingerprint
        current = data_fingerprint(root)
        recorded = self.progress.get("data_fingerprint")
        problems = problems_fingerprint(root)
        made = opencv_version.recorded(root)
        if recorded is not None and recorded != current:
            then = self.progress.get("data_opencv")
            same_problems = problems is not None and problems == self.progress.get("data_problems")
            versions = (f"pixels here {opencv_version.describe(made)}, when the run started "
                        f"{opencv_version.describe(then)}")
            # The same recorded versions cannot explain other pixels: another CPU's code path or an edited cache can.
            same_versions = bool(made) and made == then
            cause = ("the same OpenCV versions made both, so something else changed the pixels: another build or "
                     "CPU, or an edited cache" if same_versions else "OpenCV versions draw some edge pixels differently")
            if not same_problems:
                raise ConfigError(
                    f"resume: the data in {root} are not the data this run started on (fingerprint {current[-12:]}, "
                    f"recorded {recorded[-12:]} in {self.path}; {versions}); regenerate them with the run's generator "
                    "settings (seed, count, regime, image size) or start a new run")
            if self.data_check != "problems":
                raise ConfigError(
                    f"resume: the data in {root} hold the problems this run started on, but other pixels "
                    f"(fingerprint {current[-12:]}, recorded {recorded[-12:]} in {self.path}; {versions}: {cause}); "
                    "make them as the run's were, or pass data_check=problems to continue on these pixels")
            if self.writer:  # once per run, not once per DDP rank
                print(f"rpm-train: note: continuing on other pixels of the same problems in {root} ({versions}"
                      f"{'; ' + cause if same_versions else ''}); recorded in {self.path} under data_changes",
                      file=sys.stderr)
            self.progress.setdefault("data_changes", []).append(
                {"slice": len(self.progress.get("slices", [])) + 1, "data_fingerprint": current,
                 "previous_fingerprint": recorded, "data_opencv": made, "previous_opencv": then,
                 "accepted_by": "data_check=problems"})
        self.progress["data_fingerprint"] = self._fingerprint = current
        if problems is not None:
            self.progress["data_problems"] = problems
        self.progress["data_opencv"] = made
        if recorded is None and self.writer:
            # Written now, not when the first stage ends: a run killed before that (SIGKILL, the out-of-memory
            # killer, a lost node) resumes from its last.ckpt, and without the record it would accept any data.
            write_json(self.path, self.progress)
        return current

    def has_time_for_evaluation(self, deadline: Deadline, config: TrainConfig) -> bool:
        """Whether the final evaluation (val, test, extra test sets) is predicted to end before the deadline.

        Predicted from the last stage's measured validation time (its summary's ``val_seconds``).
        """
        if not deadline.active:
            return True
        summaries = [s for s in self.progress.get("stages", {}).values() if s.get("val_seconds")]
        if not summaries:
            return deadline.allows(stage_start_seconds(deadline))
        last = summaries[-1]
        # val + test (the same size under the 60/20/20 split) + each extra test set; a validation pass also
        # computed losses, so this overestimates a little, which is the safe side.
        sets = 2 + len(config.test_data_roots or [])
        return deadline.allows(sets * float(last["val_seconds"]) + 1.0)

    def write(self, stages: dict[str, Any], status: str | None = None) -> None:
        self.progress["stages"] = stages
        if status is not None:
            self.progress["status"] = status
        if self.writer:
            write_json(self.path, self.progress)

    def _slice(self, ended_in: str, stages: dict[str, Any], began: float, first_step_s: float | None) -> None:
        steps = {name: summary.get("global_step") for name, summary in stages.items()}
        entry = {"seconds": round(time.perf_counter() - began, 3), "ended_in": ended_in, "global_step": steps,
                 **self.call}
        if first_step_s is not None:
            # what this call spent before training (data check, checkpoint, loaders, CUDA), its first step included
            entry["first_step_s"] = first_step_s
        self.progress.setdefault("slices", []).append(entry)

    def unfinished(self, config: TrainConfig, stage: str, stages: dict[str, Any], began: float,
                   stop_requested: bool = False, first_step_s: float | None = None) -> dict[str, Any]:
        """Record that the budget (or a stop request) ended this slice in ``stage``; return the unfinished result
        (``made_progress``: whether this call trained a step or finished a stage, for the unfinished line).
        ``first_step_s``: when this call's first training step ended (:attr:`Deadline.first_step_s`)."""
        def standing(slice_record: dict[str, Any]) -> Any:
            return slice_record.get("ended_in"), slice_record.get("global_step")

        previous = self.progress.get("slices") or []
        before = standing(previous[-1]) if previous else None
        self._slice(stage, stages, began, first_step_s)
        self.write(stages, UNFINISHED)
        made_progress = (standing(self.progress["slices"][-1]) != before if previous else
                         any(s.get("completed") or s.get("global_step") for s in stages.values()))
        return {"status": UNFINISHED, "stage": stage, "global_step": stages.get(stage, {}).get("global_step"),
                "run_dir": str(self.run_dir), "seconds": round(time.perf_counter() - began, 3),
                "time_budget": config.time_budget, "stop_requested": stop_requested, "made_progress": made_progress}

    def finish(self, stages: dict[str, Any], began: float, first_step_s: float | None = None) -> None:
        self._slice("end", stages, began, first_step_s)
        self.write(stages, FINISHED)
