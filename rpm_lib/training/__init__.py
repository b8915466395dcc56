"""The paper's training setups on Lightning.

Python API (what notebooks call; ``rpm-train`` runs exactly the same)::

    from rpm_lib.training import TrainConfig, train

    config = TrainConfig.from_yaml("configs/tiny.yaml", ["setup=mlcl_aug", "encoder=scl"])
    metrics = train(config)          # writes <run_dir>/{config.yaml, metrics.json, predictions.npz, history.csv}

Modules: ``config`` (TrainConfig; ``config_values``: YAML, key=value overrides, value checks), ``setups`` (the setup
registry: ce, ce_aux_dense, ce_aux_sparse, mlcl, mlcl_aug and their stage kinds), ``objectives`` (the loss terms a
stage weights and their heads), ``plans`` (a config's stage plans), ``module`` (RpmModule, the LightningModule),
``datamodule`` (RpmDataModule and deterministic sampling), ``distributed`` (MLCL gathering under DDP), ``metrics`` /
``evaluation`` (accuracy per configuration, rule metrics, predictions), ``eval_sets`` (the evaluated sets, extra
``test_data_roots``, in / out-of-distribution labels), ``run`` (``train``) with ``run_dir`` (lock, overwrite, resume
checks), ``progress_record`` (progress.json), ``fit`` (running the stages), ``trainer`` (a stage's Lightning
Trainer) and ``final_evaluation`` (metrics.json), ``cli`` (``rpm-train``).
Heavy imports (torch, lightning) happen on first use of ``train`` / ``RpmModule`` / ``RpmDataModule``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpm_lib.training.config import ConfigError, TrainConfig, parse_overrides
from rpm_lib.training.plans import stage_plan
from rpm_lib.training.setups import SETUPS, STAGES, SetupSpec, StagePlan

if TYPE_CHECKING:
    from rpm_lib.training.datamodule import RpmDataModule
    from rpm_lib.training.module import RpmModule
    from rpm_lib.training.run import train

_LAZY = {
    "train": "rpm_lib.training.run",
    "RpmModule": "rpm_lib.training.module",
    "RpmDataModule": "rpm_lib.training.datamodule",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rpm_lib.training' has no attribute {name!r}")


__all__ = ["ConfigError", "RpmDataModule", "RpmModule", "SETUPS", "STAGES", "SetupSpec", "StagePlan", "TrainConfig",
           "parse_overrides", "stage_plan", "train"]
