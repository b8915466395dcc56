"""A run's test accuracies in percent, read from its ``metrics.json``.

Owns the one reading of accuracies that every table shares: ``run_accuracies`` (per configuration, and the
paper's "Average", the mean over the configurations present) and the checks that refuse a value that is no
fraction in [0, 1] or a field of the wrong shape, with a message naming the file and the field. ``metrics.json``
is written by training (``rpm_lib.training``); a shared folder's copy may have been edited, so nothing in it is
trusted.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES
from rpm_lib.run_folder import METRICS


def _as_percent(value: Any, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{where}: accuracy must be a finite number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{where}: accuracy {value!r} is not a fraction in [0, 1]")
    return 100.0 * float(value)


def run_accuracies(metrics: Mapping[str, Any], split: str = "test", where: str = METRICS) -> dict[str, float]:
    """Test accuracies of one run in percent: ``{"Average": …, "Center": …, …, "O-IG": …}``.

    ``metrics`` is the parsed ``metrics.json`` of ``rpm_lib.training``. ``"Average"`` is the mean of the
    per-configuration accuracies that are present (the paper's definition); configurations absent from the
    run (e.g. a run on a subset) are absent from the result.

    Raises:
        ValueError: when the file has no accuracy for ``split`` or a value is not a fraction in [0, 1].
    """
    per_config = _per_configuration_accuracy(metrics, split, where)
    out: dict[str, float] = {}
    for configuration in CONFIGURATIONS:
        if configuration in per_config:
            out[SHORT_NAMES[configuration]] = _as_percent(per_config[configuration], f"{where} [{configuration}]")
    if out:
        out = {"Average": sum(out.values()) / len(out), **out}
    else:
        out["Average"] = _as_percent(_overall_accuracy(metrics, split, where), f"{where} [{split} accuracy]")
    return out


def _per_configuration_accuracy(metrics: Mapping[str, Any], split: str, where: str) -> dict[str, Any]:
    """``{configuration folder name: fraction}`` from ``metrics`` (empty when the run has none)."""
    table = metrics.get(f"{split}_accuracy_per_configuration")
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise ValueError(f"{where}: {split}_accuracy_per_configuration must be a mapping, got {type(table).__name__}")
    unknown = sorted(set(table) - set(CONFIGURATIONS))
    if unknown:
        raise ValueError(f"{where}: unknown configuration(s) {unknown} in {split}_accuracy_per_configuration")
    return dict(table)


def _overall_accuracy(metrics: Mapping[str, Any], split: str, where: str) -> Any:
    key = f"{split}_accuracy"
    if key not in metrics:
        raise ValueError(f"{where}: no '{key}' (keys: {sorted(metrics)})")
    return metrics[key]


def recorded_test_sets(metrics: Mapping[str, Any], where: str) -> list[Mapping[str, Any]]:
    """``metrics["test_sets"]`` (empty when absent), each entry checked to be an object."""
    sets = metrics.get("test_sets") or []
    if not isinstance(sets, list) or not all(isinstance(entry, Mapping) for entry in sets):
        raise ValueError(f"{where}: test_sets must be a list of objects, got {sets!r:.80}")
    return sets


def set_accuracies(entry: Mapping[str, Any], where: str) -> tuple[float, dict[str, float]]:
    """Overall accuracy and ``run_accuracies`` (percent) of one ``test_sets`` entry."""
    where = f"{where} [test_sets {entry.get('name')}]"
    per_config = {"test_accuracy_per_configuration": entry.get("accuracy_per_configuration"),
                  "test_accuracy": entry.get("accuracy")}
    acc = run_accuracies({k: v for k, v in per_config.items() if v is not None}, "test", where)
    return _as_percent(entry.get("accuracy"), where), acc
