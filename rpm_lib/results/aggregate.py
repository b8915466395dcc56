"""Finished runs aggregated over seeds: Table 1 rows (``table1``) and ablation series (``ablation_series``).

Accuracies are in **percent** (the paper's unit). Table 1's "Average ± Std" is, per (encoder, setup): for each
seed the mean of the 7 per-configuration test accuracies, then the mean and the sample standard deviation
(ddof=1) of those averages over seeds; the per-configuration columns are means over seeds.

``table1`` never averages runs that were trained or tested differently (settings recorded in ``metrics.json``
``config``, the dataset, the test set's regime and size, the configurations present): such runs get a row each,
with the setting in the row's ``group``; a seed counted twice (a copied folder) counts once; the paper's numbers
are only set beside linear-evaluation / supervised runs on I-RAVEN (a note when configurations are missing).
Damaged runs and runs whose ``metrics.json`` contradicts their ``run.json`` are refused, or set aside with why.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rpm_lib.results.accuracies import run_accuracies
from rpm_lib.results.paper import (CONFIGURATION_COLUMNS, ENCODER_NAMES, SETUP_LABELS, PaperRow, canonical_encoder,
                                   canonical_setup, paper_row)
from rpm_lib.results.records import RunRecord, clean_text, trained_with
from rpm_lib.training.config import NOT_COMPARED
from rpm_lib.run_folder import METRICS, RUN_RECORD, RunStatus


@dataclass
class Table1Row:
    """One (encoder, setup[, other labels]) row aggregated over seeds.

    Attributes:
        encoder, setup: paper spellings when known (``canonical_*``), else as labelled.
        group: the other grid labels that separate rows (e.g. ``{"data": "I-RAVEN"}``); empty for Table 1.
        seeds: seed labels that contributed.
        average, std: mean and sample std (ddof=1; NaN for one seed) over seeds of the per-seed average.
        per_configuration: short configuration name -> mean over seeds.
        paper: the published row, when the paper has one and every run is on I-RAVEN (not another regime or
            PGM); with fewer than 7 configurations ``notes`` say that the averages differ.
        runs: the run names counted; notes: what a reader of the row must know (a run not counted as it repeats
            a seed, runs split off by a setting, why the paper's numbers are not beside it).
    """

    encoder: str
    setup: str
    group: dict[str, str]
    seeds: list[str]
    average: float
    std: float
    per_configuration: dict[str, float]
    paper: PaperRow | None = None
    runs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var)


def _order_key(encoder: str, setup: str) -> tuple[int, int, str, str]:
    encoders = list(ENCODER_NAMES.values())
    e = encoders.index(encoder) if encoder in encoders else len(encoders)
    s = SETUP_LABELS.index(setup) if setup in SETUP_LABELS else len(SETUP_LABELS)
    return (e, s, encoder, setup)


def table1(records: Iterable[RunRecord], split: str = "test",
           excluded: list[tuple[RunRecord, str]] | None = None) -> list[Table1Row]:
    """Aggregate finished runs into Table 1 rows (ordered like the paper: SCL, HriNet, CoPINet, WReN; CE..MLCL+AUG).

    Runs are grouped by encoder, setup and every other label except ``seed``; within a group, runs that
    were trained or tested differently (``_settings``: another ``lr``, test set, dataset, ...) get a row each,
    the differing setting added to ``group``; a seed met again in a row (a copied folder) is counted once, the
    copy named in the row's ``notes``. Failed, pending and skipped runs are left out (``runs_table`` lists them).

    Args:
        excluded: where damaged runs (status ``damaged``) and runs with a ``conflict`` go, with the reason;
            ``None``: such a run raises.

    Raises:
        ValueError: a damaged or conflicting run, when ``excluded`` is None (one line naming the file and field).
    """
    groups: dict[tuple, list[tuple[RunRecord, dict[str, float]]]] = {}
    for rec in records:
        if rec.metrics is None or rec.status == RunStatus.SKIPPED:
            continue
        try:
            if rec.problem is not None or rec.conflict is not None:
                raise ValueError(rec.problem or rec.conflict)
            acc = run_accuracies(rec.metrics, split, where=str(rec.run_dir / METRICS))
        except ValueError as exc:
            if excluded is None:
                raise
            excluded.append((rec, str(exc)))
            continue
        others = tuple(sorted((k, v) for k, v in rec.labels.items() if k not in ("encoder", "setup", "seed")))
        key = (canonical_encoder(rec.encoder), canonical_setup(rec.setup), others)
        groups.setdefault(key, []).append((rec, acc))
    rows = []
    for (encoder, setup, others), members in groups.items():
        settings = [_settings(rec, acc) for rec, acc in members]
        shared = set.intersection(*(set(s) for s in settings))
        differing = sorted(k for k in shared if len({s[k] for s in settings}) > 1)
        parts: dict[tuple, list[tuple[RunRecord, dict[str, float]]]] = {}
        for member, setting in zip(members, settings):
            parts.setdefault(tuple((k, setting[k]) for k in differing), []).append(member)
        for split_off, part in parts.items():
            notes = []
            if differing:
                notes.append(f"its runs differ in {', '.join(differing)}: one row for each")
            rows.append(_table1_row(encoder, setup, {**dict(others), **dict(split_off)}, part, notes))
    rows.sort(key=lambda r: (_order_key(r.encoder, r.setup), sorted(r.group.items())))
    return rows


def _table1_row(encoder: str, setup: str, group: dict[str, str],
                members: list[tuple[RunRecord, dict[str, float]]], notes: list[str]) -> Table1Row:
    """One row from runs trained and tested alike: each seed once, mean ± std over seeds, the paper beside it."""
    counted: dict[str, RunRecord] = {}
    kept = []
    for rec, acc in members:
        if rec.seed != "?" and rec.seed in counted:
            notes.append(f"{rec.folder or rec.name} not counted: seed {rec.seed} again "
                         f"({counted[rec.seed].folder or counted[rec.seed].name} counted)")
            continue
        counted[rec.seed] = rec
        kept.append((rec, acc))
    averages = [acc["Average"] for _, acc in kept]
    mean, std = _mean_std(averages)
    per_config = {}
    for col in CONFIGURATION_COLUMNS:
        vals = [acc[col] for _, acc in kept if col in acc]
        if vals:
            per_config[col] = sum(vals) / len(vals)
    paper = paper_row(encoder, setup)
    # The published numbers are I-RAVEN's: none beside runs on another regime or dataset. They average 7
    # configurations: beside an Average over fewer (a small test set without some), a note says so.
    if paper is not None and not all(_on_iraven(rec.metrics) for rec, _ in kept):
        paper = None
        notes.append("no paper numbers: not trained and tested on I-RAVEN")
    missing = [col for col in CONFIGURATION_COLUMNS if col not in per_config]
    if paper is not None and missing:
        notes.append(f"Average over {len(CONFIGURATION_COLUMNS) - len(missing)} configurations (no "
                     f"{', '.join(missing)}); the paper's is over all {len(CONFIGURATION_COLUMNS)}, so Δ avg compares "
                     "different averages")
    return Table1Row(encoder=encoder, setup=setup, group=group, seeds=[rec.seed for rec, _ in kept], average=mean,
                     std=std, per_configuration=per_config, paper=paper, runs=[rec.name for rec, _ in kept],
                     notes=notes)


def _settings(rec: RunRecord, acc: Mapping[str, float]) -> dict[str, str]:
    """What a run trained and was tested on beyond its labels, as texts: the ``metrics.json`` ``config`` fields but
    ``NOT_COMPARED``, the dataset, the test set's size and regime, and the configurations with an accuracy. Runs of
    one row must agree on every one of them that all of them record (a field added by a later rpm_lib is not a
    difference)."""
    metrics = rec.metrics or {}
    config = metrics.get("config") if isinstance(metrics.get("config"), Mapping) else {}
    out = {k: clean_text(v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str))
           for k, v in config.items() if k not in NOT_COMPARED}
    if "dataset" in metrics:
        out["dataset"] = clean_text(metrics["dataset"])
    if metrics.get("test_num_samples") is not None:
        out["test problems"] = str(metrics["test_num_samples"])
    regime = _test_regime(metrics)
    if regime is not None:
        out["test regime"] = clean_text(regime)
    present = [c for c in CONFIGURATION_COLUMNS if c in acc]
    out["configurations"] = ("all 7" if len(present) == len(CONFIGURATION_COLUMNS)
                             else ",".join(present) or "overall accuracy only")
    return out


def _test_regime(metrics: Mapping[str, Any] | None) -> str | None:
    """The regime of a run's main test set (``test_sets``, from the data's ``regime.json``), None when unrecorded."""
    for entry in (metrics or {}).get("test_sets") or []:
        if isinstance(entry, Mapping) and entry.get("name") == "test":
            return entry.get("regime")
    return None


def _on_iraven(metrics: Mapping[str, Any] | None) -> bool:
    """Whether a run's data is (or may be) plain I-RAVEN: an I-RAVEN dataset (not PGM), whose main test set's regime
    is I-RAVEN or not recorded."""
    from rpm_lib.generator.regimes import IRAVEN

    dataset = trained_with(metrics).get("dataset", (metrics or {}).get("dataset"))
    if dataset not in (None, "iraven"):
        return False
    return _test_regime(metrics) in (None, IRAVEN.name)


def row_name(row: Table1Row) -> str:
    """``<encoder> <setup>`` and the row's group settings, e.g. ``SCL CE (lr=0.01)``: how notes and errors name a
    row."""
    group = ", ".join(f"{k}={v}" for k, v in sorted(row.group.items()))
    return f"{row.encoder} {row.setup}" + (f" ({group})" if group else "")


def table1_records(records: Sequence[RunRecord], main_grid: str | None = "main") -> list[RunRecord]:
    """The runs Table 1 is made of: those of ``main_grid`` (every run when it is empty / ``None`` or when no
    run belongs to it, e.g. a folder of single runs)."""
    if not main_grid:
        return list(records)
    return [r for r in records if r.grid == main_grid] or list(records)


@dataclass
class AblationPoint:
    """Mean ± std (percent, over seeds) of the average test accuracy at one value of the varied parameter."""

    value: float
    mean: float
    std: float
    seeds: int


def ablation_series(records: Iterable[RunRecord], parameter: str,
                    split: str = "test") -> dict[str, list[AblationPoint]]:
    """Average accuracy as a function of one numeric parameter (e.g. ``"beta"``, ``"batch_size"``).

    Only finished runs whose grid varies ``parameter`` (it is one of their labels) are used. Series are
    keyed ``"<Encoder> <Setup>"`` (plus other labels) and sorted by the parameter value. A seed met again at one
    point (a run folder copied twice) counts once, as in ``table1``.

    Raises:
        ValueError: a damaged run, a run with a ``conflict`` (its metrics.json trained with another value than its
            run.json labels, e.g. a run folder copied and relabelled), or a parameter value that is not a number
            (one line naming the run folder).
    """
    buckets: dict[str, dict[float, list[float]]] = {}
    seen: set[tuple[str, float, str]] = set()
    for rec in records:
        if rec.metrics is None or rec.status == RunStatus.SKIPPED or parameter not in rec.labels:
            continue
        if rec.problem is not None:
            raise ValueError(rec.problem)
        if rec.conflict is not None:  # its numbers are not those of the parameter value it is labelled with
            raise ValueError(rec.conflict)
        if parameter not in rec.parameters:
            raise ValueError(f"{rec.run_dir}: label '{parameter}' has no parameter of that name in run.json")
        value = rec.parameters[parameter]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{rec.run_dir / RUN_RECORD}: parameter '{parameter}' must be a number, got {value!r:.80}")
        value = float(value)
        others = [f"{k}={v}" for k, v in sorted(rec.labels.items()) if k not in ("encoder", "setup", "seed", parameter)]
        key = " ".join([canonical_encoder(rec.encoder), canonical_setup(rec.setup), *others])
        acc = run_accuracies(rec.metrics, split, str(rec.run_dir / METRICS))["Average"]
        if rec.seed != "?" and (key, value, rec.seed) in seen:
            continue
        seen.add((key, value, rec.seed))
        buckets.setdefault(key, {}).setdefault(value, []).append(acc)
    series = {}
    for key, by_value in sorted(buckets.items()):
        points = []
        for value in sorted(by_value):
            mean, std = _mean_std(by_value[value])
            points.append(AblationPoint(value, mean, std, len(by_value[value])))
        series[key] = points
    return series
