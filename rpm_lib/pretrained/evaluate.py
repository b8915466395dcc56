"""A shipped model on problems it has never seen: generated now, with another seed, scored per configuration.

:func:`fresh_problems` generates I-RAVEN (or a generalisation regime) at the model's image size into a cache;
:func:`score_folder` scores the model on every problem of it; :func:`accuracy_rows` sets the accuracy per
configuration beside the model's recorded test accuracy, with a Clopper-Pearson interval; :func:`regime_rows` does
the same per generalisation regime, each split labelled in or out of the model's training distribution
(``rpm_lib.training.eval_sets``). ``rpm-pretrained evaluate`` and ``notebooks/09_pretrained.ipynb`` drive these.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from rpm_lib.data.raw_files import SPLITS
from rpm_lib.generator.cache_writer import generate_cache
from rpm_lib.generator.regimes import Regime, resolve_regime
from rpm_lib.pretrained.registry import PretrainedModel
from rpm_lib.rules.vocabulary import SHORT_NAMES
from rpm_lib.training.samples import make_dataset
from rpm_lib.training.eval_sets import RegimeInfo, classify_distribution, read_regime
from rpm_lib.training.module import RpmModule

# Every split of a generated folder (data.raw_files.SPLITS) is scored: fresh plain I-RAVEN problems are all from the
# training distribution, so every split counts; a regime's train/val splits and its test split are reported apart.

#: The confidence of every interval shown.
CONFIDENCE = 0.99


@dataclasses.dataclass
class Scores:
    """A model's answers on one split of a folder (N problems, dataset order).

    Attributes:
        configuration: int64 (N,) index into ``configurations``.
        correct: bool (N,) the top-scored candidate is the answer.
        scores: float32 (N, 8) answer logits.
        configurations: the folder's configuration (folder) names.
    """

    configuration: np.ndarray
    correct: np.ndarray
    scores: np.ndarray
    configurations: list[str]

    def __len__(self) -> int:
        return len(self.correct)


def fresh_problems(out: str | Path, image_size: int, num_per_config: int = 100, seed: int = 20_261_128,
                   regime: str | Regime = "I-RAVEN", workers: int = 1, progress: bool = False) -> Path:
    """Generate ``num_per_config`` problems of every configuration (split 60/20/20) into the cache ``out`` at
    ``image_size`` px; an existing cache of the same settings is reused (generation is resumable)."""
    generate_cache(out, count=num_per_config, seed=seed, size=image_size, regime=regime, workers=workers,
                   progress=progress)
    return Path(out)


def score_folder(model: RpmModule, root: str | Path, splits: Iterable[str] = SPLITS, batch_size: int = 64,
                 progress: bool = False) -> dict[str, Scores]:
    """The model's answers on each split of the folder ``root`` (read with the model's own data settings)."""
    from tqdm.auto import tqdm

    model.eval()
    device = next(model.parameters()).device
    out: dict[str, Scores] = {}
    for split in splits:
        dataset = make_dataset(model.config, split, root=root)
        configuration, correct, scores = [], [], []
        loader = DataLoader(dataset, batch_size=batch_size)
        with torch.no_grad():
            # disable=None: a bar on a terminal only (not redrawn into a log file)
            for batch in tqdm(loader, desc=f"score {split}", unit="batch", disable=None if progress else True,
                              leave=False):
                logits = model(batch["panels"].to(device))["scores"].float().cpu()
                scores.append(logits.numpy())
                correct.append((logits.argmax(1) == batch["target"]).numpy())
                configuration.append(np.asarray(batch["configuration"]))
        out[split] = Scores(np.concatenate(configuration).astype(np.int64), np.concatenate(correct),
                            np.concatenate(scores).astype(np.float32), list(dataset.group_names))
    return out


def clopper_pearson(correct: int, total: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of an accuracy of ``correct`` out of ``total``."""
    from scipy.stats import binomtest

    if total == 0:
        return (0.0, 1.0)
    interval = binomtest(correct, total).proportion_ci(confidence_level=confidence, method="exact")
    return (float(interval.low), float(interval.high))


def expected_range(accuracy: float, total: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The accuracies that ``total`` fresh problems give with probability ``confidence`` when the model's true
    accuracy is ``accuracy`` (the central binomial interval, as fractions)."""
    from scipy.stats import binom

    low, high = binom.interval(confidence, total, accuracy)
    return (float(low) / total, float(high) / total)


def merged(scores: Sequence[Scores]) -> Scores:
    """One :class:`Scores` of several splits of one folder."""
    return Scores(np.concatenate([s.configuration for s in scores]), np.concatenate([s.correct for s in scores]),
                  np.concatenate([s.scores for s in scores]), scores[0].configurations)


def accuracy_rows(entry: PretrainedModel, scores: Scores) -> list[dict[str, Any]]:
    """Per configuration, then ``All``: problems, accuracy on the fresh problems with its interval, the recorded test
    accuracy, and whether the fresh accuracy lies in the range the recorded one predicts for this many problems."""
    rows = []
    groups = [(SHORT_NAMES.get(name, name), name, scores.configuration == index)
              for index, name in enumerate(scores.configurations)]
    groups.append(("All", None, np.ones(len(scores), dtype=bool)))
    for short, name, chosen in groups:
        total, correct = int(chosen.sum()), int(scores.correct[chosen].sum())
        if total == 0:
            continue
        recorded = entry.test_accuracy if name is None else entry.test_accuracy_per_configuration.get(name)
        low, high = clopper_pearson(correct, total)
        row = {"configuration": short, "problems": total, "correct": correct, "accuracy": correct / total,
               "low": low, "high": high, "recorded": recorded}
        if recorded is not None:
            lo, hi = expected_range(recorded, total)
            row["as_recorded"] = lo <= correct / total <= hi
        rows.append(row)
    return rows


def trained_regime(entry: PretrainedModel) -> RegimeInfo:
    """The regime of the model's training data, from the registry's data recipe."""
    record = entry.data["regime"]
    return RegimeInfo(regime=Regime.from_json(record), mode=record.get("mode"), path=None, seed=record.get("seed"),
                      val=record.get("val"), test=record.get("test"))


def regime_rows(model: RpmModule, entry: PretrainedModel, regimes: Sequence[str], folder: str | Path,
                num_per_config: int = 50, seed: int = 20_261_128, workers: int = 1,
                progress: bool = False) -> list[dict[str, Any]]:
    """The model on fresh problems of each regime: one row per regime and split group (train+val, test), with
    the distribution label relative to the model's training data, accuracy and interval.

    Args:
        regimes: generator regime names (``rpm_lib.generator.regimes.REGIMES``), e.g. ``["I-RAVEN", "A/Color",
            "I-RAVEN-Mesh"]``.
        folder: where each regime's problems are generated (``<folder>/<regime>``; reused when there).
    """
    trained = trained_regime(entry)
    rows = []
    for name in regimes:
        regime = resolve_regime(name)
        root = fresh_problems(Path(folder) / regime.name.replace("/", "-"), entry.image_size, num_per_config, seed,
                              regime, workers, progress)
        evaluated = read_regime(root)
        scores = score_folder(model, root, progress=progress)
        for label, splits in (("train+val", ("train", "val")), ("test", ("test",))):
            distribution, reason = classify_distribution(trained, evaluated, splits[-1])
            group = merged([scores[split] for split in splits])
            correct, total = int(group.correct.sum()), len(group)
            low, high = clopper_pearson(correct, total)
            rows.append({"regime": regime.name, "split": label, "distribution": distribution, "why": reason,
                         "problems": total, "accuracy": correct / total, "low": low, "high": high})
    return rows


def table_cells(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]
                ) -> tuple[list[str], list[list[str]]]:
    """``(header, cells)`` of ``rows`` as text: accuracies in percent, intervals as ``low–high``."""
    def cell(row: dict[str, Any], key: str) -> str:
        value = row.get(key)
        if key == "interval":
            return f"{100 * row['low']:.1f}–{100 * row['high']:.1f}"
        if key in ("accuracy", "recorded"):
            return "–" if value is None else f"{100 * value:.1f}"
        if key == "as_recorded":
            return "–" if value is None else ("yes" if value else "NO")
        return str(value)

    return [title for _, title in columns], [[cell(row, key) for key, _ in columns] for row in rows]


def format_rows(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> list[str]:
    """The lines of a Markdown table of ``rows`` (:func:`table_cells`)."""
    header, cells = table_cells(rows, columns)
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in cells)]


#: The columns of :func:`accuracy_rows` as printed.
ACCURACY_COLUMNS = (("configuration", "configuration"), ("problems", "problems"), ("accuracy", "fresh %"),
                    ("interval", f"{CONFIDENCE:.0%} interval"), ("recorded", "recorded test %"),
                    ("as_recorded", "as recorded?"))
#: The columns of :func:`regime_rows` as printed.
REGIME_COLUMNS = (("regime", "regime"), ("split", "split"), ("distribution", "distribution"),
                  ("problems", "problems"), ("accuracy", "accuracy %"), ("interval", f"{CONFIDENCE:.0%} interval"))
