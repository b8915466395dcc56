"""A run's training plan as its folder describes it: ``config.yaml``'s values, their ``TrainConfig``, the stages.

``rpm-batch progress`` (``rpm_lib.runs.progress``) and the live watcher (``rpm_lib.runs.live``) both read a run's
``config.yaml`` to know its stages, their epoch limits and the early-stopping settings; this module is that one
reading. A folder from elsewhere may hold anything: every function returns None rather than raise when the file is
missing, damaged or not a valid ``TrainConfig``. Light to import (no Lightning; the configuration is imported when
first needed).
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rpm_lib.typed_values import load_yaml_file_text
from rpm_lib.run_folder import CONFIG


def run_config(run_dir: Path) -> dict[str, Any] | None:
    """The mapping in ``run_dir/config.yaml``; None when it is missing, unreadable or not a mapping."""
    import yaml

    try:
        values = load_yaml_file_text((run_dir / CONFIG).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return values if isinstance(values, dict) else None


def train_config(values: Mapping[str, Any]) -> Any:
    """The ``TrainConfig`` a mapping of its fields describes (a run's ``config.yaml``); keys that are not
    TrainConfig fields are ignored. None when the values are not a valid TrainConfig."""
    from rpm_lib.training.config import ConfigError, TrainConfig

    names = set(TrainConfig.field_names())
    try:
        return TrainConfig.from_dict({k: v for k, v in values.items() if k in names})
    except (ConfigError, TypeError, ValueError):
        return None


def stage_plans(config: Any) -> list[Any] | None:
    """The stages (``StagePlan``, in order, epoch limits cut by ``max_total_epochs``) of ``config`` (a
    ``TrainConfig`` from :func:`train_config`); None when there is none."""
    from rpm_lib.training.plans import stage_plan, within_total_epochs

    if config is None:
        return None
    try:
        plans = stage_plan(config)
    except (TypeError, ValueError):
        return None
    kept: list[Any] = []
    for full in plans:
        plan = within_total_epochs(full, sum(p.max_epochs for p in kept), config)
        if plan is not None:
            kept.append(plan)
    return kept


def epochs_of(plans: list[Any] | None) -> dict[str, int] | None:
    """Epoch limit of each stage (in order) of ``plans`` (:func:`stage_plans`)."""
    return None if plans is None else {plan.name: plan.max_epochs for plan in plans}


def views_of(plans: list[Any] | None) -> dict[str, int] | None:
    """Views per RPM of each stage (in order) of ``plans`` (:func:`stage_plans`; MLCL pre-training: 2)."""
    return None if plans is None else {plan.name: plan.num_views for plan in plans}


def epoch_limits(config: Any) -> dict[str, int] | None:
    """Epoch limit of each stage (in order) of ``config`` (a ``TrainConfig`` from :func:`train_config`, or None)."""
    return epochs_of(stage_plans(config))


def stage_epochs(values: Mapping[str, Any]) -> dict[str, int] | None:
    """Epoch limit of each stage (in order) of the training a mapping of TrainConfig fields describes (see
    :func:`train_config`); None when the values are not a valid TrainConfig."""
    return epoch_limits(train_config(values))
