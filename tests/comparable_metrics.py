"""Two runs of the same training compared: their metrics without what legitimately differs (paths, times)."""
from __future__ import annotations

from typing import Any

#: Stage entries' keys that depend on the machine and the run folder, not on the training.
STAGE_TIMING = ("wall_time_s", "val_seconds", "weights")
#: Config fields that say where and how a run ran, not what it trained.
CONFIG_RUN_CONTROL = ("run_dir", "data_root", "time_budget", "resume", "overwrite", "restart_stage")


def comparable(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` without run times, the git commit, paths and run-control config fields."""
    out = {k: v for k, v in metrics.items() if k not in {"runtime_s", "stages", "git_commit", "config"}}
    out["stages"] = [{k: v for k, v in s.items() if k not in STAGE_TIMING} for s in metrics["stages"]]
    if "test_sets" in metrics:
        out["test_sets"] = [{k: v for k, v in entry.items() if k != "data_root"} for entry in metrics["test_sets"]]
    out["config"] = {k: v for k, v in metrics["config"].items() if k not in CONFIG_RUN_CONTROL}
    return out
