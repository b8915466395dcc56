"""The final evaluation of a run: every evaluated set with the final weights, and the record of what produced it.

:func:`evaluate_run` predicts the validation and test splits and every ``test_data_roots`` set, saves the test
predictions, and returns the metrics: the flat val / test keys, ``test_sets`` (in- / out-of-distribution labels,
:mod:`rpm_lib.training.eval_sets`) and the ``protocol`` the weights measure. :func:`provenance` adds the config,
seed, git commit, library versions, device and runtime.
"""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from rpm_lib.run_folder import EXTRA_PREDICTIONS_GLOB
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.datamodule import RpmDataModule
from rpm_lib.training.eval_sets import EvalSet, extra_sets, main_sets, read_regime, set_entry
from rpm_lib.training.evaluation import answer_summary, predict
from rpm_lib.training.module import RpmModule
from rpm_lib.training.plans import protocol_of
from rpm_lib.training.setups import SETUPS
from rpm_lib.training.trainer import resolve_precision


# ----------------------------------------------------------------------------------------------
# evaluation and provenance
# ----------------------------------------------------------------------------------------------
def _eval_device(config: TrainConfig, trainer: L.Trainer | None) -> torch.device:
    if config.trains_on_cuda:
        if trainer is not None and trainer.strategy.root_device.type == "cuda":
            return trainer.strategy.root_device
        return torch.device("cuda", 0)
    return torch.device("cpu")


def evaluate_run(config: TrainConfig, module: RpmModule, datamodule: RpmDataModule, trainer: L.Trainer | None,
              run_dir: Path, stages_run: list[str]) -> dict[str, Any]:
    """Final metrics: the flat val / test keys (unchanged) and ``test_sets``, one entry per evaluated set; the
    ``protocol`` (``rpm_lib.training.setups.PROTOCOLS``) says what the final weights measure."""
    device = _eval_device(config, trainer)
    precision = resolve_precision(config)
    protocol = protocol_of(config, stages_run)
    # A fine-tuned run is not the paper's linear evaluation: its label says so (Table 1 rows stay linear-eval).
    label = SETUPS[config.setup].label + ("+FT" if protocol == "fine_tuned" else "")
    metrics: dict[str, Any] = {"setup": config.setup, "setup_label": label, "protocol": protocol,
                               "encoder": config.encoder, "dataset": config.dataset}
    # Read after training: with generate=true the data (and its regime.json) exist only from the first stage on.
    trained = read_regime(config.data_root)
    entries = []
    for eval_set in [*main_sets(config), *extra_sets(config)]:
        summary = _evaluate_set(config, module, datamodule, eval_set, device, precision, run_dir)
        if eval_set.main:  # the flat keys of earlier versions: val_accuracy, test_accuracy_per_configuration, ...
            metrics.update({f"{eval_set.split}_{key}": value for key, value in summary.items()})
        evaluated = trained if eval_set.main else read_regime(eval_set.data_root, field="test_data_roots")
        entries.append(set_entry(eval_set, summary, trained, evaluated))
    metrics["test_sets"] = entries
    # Predictions of test sets this evaluation no longer lists (an earlier test_data_roots) would read as current.
    current = {eval_set.predictions_file for eval_set in [*main_sets(config), *extra_sets(config)]}
    for stale in run_dir.glob(EXTRA_PREDICTIONS_GLOB):
        if stale.name not in current:
            stale.unlink()
    return metrics


def _evaluate_set(config: TrainConfig, module: RpmModule, datamodule: RpmDataModule, eval_set: EvalSet,
                  device: torch.device, precision: str, run_dir: Path) -> dict[str, Any]:
    """Predict one set with the final weights, save its predictions (test splits), return its summary."""
    limit = config.limit_val_batches if eval_set.split == "val" else config.limit_test_batches
    loader = datamodule.eval_dataloader(eval_set.split, root=None if eval_set.main else eval_set.data_root)
    desc = f"evaluate {eval_set.split}" if eval_set.main else f"evaluate {eval_set.name} (test)"
    predictions = predict(module, loader, device, precision, limit, progress=config.progress_bar, desc=desc)
    if eval_set.split == "test" and config.save_predictions:
        predictions.save(run_dir / eval_set.predictions_file)
    return answer_summary(predictions, config)


def provenance(config: TrainConfig, seconds: float) -> dict[str, Any]:
    import lightning

    import rpm_lib

    versions = {"rpm_lib": rpm_lib.__version__, "python": platform.python_version(), "torch": torch.__version__,
                "lightning": lightning.__version__, "numpy": np.__version__}
    for name in ("albumentations", "cv2", "scipy"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    return {
        "config": config.to_dict(),
        "seed": config.seed,
        "git_commit": _git_commit(),
        "versions": versions,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
        "runtime_s": round(seconds, 3),
    }


def _git_commit() -> str | None:
    """HEAD of the repository holding rpm_lib (with ``-dirty`` when there are local changes), or None."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10)
        return commit.stdout.strip() + ("-dirty" if status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None
