"""Run folders as ``rpm-batch`` leaves them (``run.json`` and ``metrics.json``), written for the tests of gathering
runs into Table 1 (tests/test_gather.py) and of checking the paper's claims (tests/test_claims.py)."""
from __future__ import annotations

import json
from pathlib import Path

from rpm_lib.rules import CONFIGURATIONS


def run_metrics(value: float = 0.6, configs=CONFIGURATIONS, **extra) -> dict:
    per_config = {c: value for c in configs}
    return {"test_accuracy": value, "test_accuracy_per_configuration": per_config, "test_num_samples": 700,
            **extra}


def write_run(root: Path, name: str, labels: dict | None, params: dict | None = None,
              metrics: dict | str | None = None, grid: str = "main") -> Path:
    """A run folder as rpm-batch leaves it: run.json (unless ``labels`` is None) and metrics.json when given."""
    folder = root / name
    folder.mkdir(parents=True)
    if labels is not None:
        (folder / "run.json").write_text(json.dumps({"name": folder.name, "grid": grid, "labels": labels,
                                                     "parameters": params or {}}))
    if metrics is not None:
        (folder / "metrics.json").write_text(metrics if isinstance(metrics, str) else json.dumps(metrics))
    return folder
