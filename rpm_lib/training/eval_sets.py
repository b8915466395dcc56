"""The sets a finished run is evaluated on, and whether each is in or out of the training distribution.

After training, the final model is evaluated on the training data's ``val`` and ``test`` splits (as before) and
on the ``test`` split of every folder in ``TrainConfig.test_data_roots``. Each becomes one entry of
``metrics["test_sets"]`` (see :func:`set_entry`), labelled ``"in-distribution"``, ``"out-of-distribution"`` or
``"unknown"`` from the ``regime.json`` the generator writes into every folder it makes
(docs/generalisation.md, "How in / out is decided"):

* neither folder has a ``regime.json`` (or only one has) -> ``unknown``: nothing says what the data are;
* different regimes (name, held-out groups, mesh or generator mode differ) -> ``out-of-distribution``;
* same regime, a train-like split (``train`` / ``val``) -> ``in-distribution``;
* same regime, the ``test`` split -> ``out-of-distribution`` when the regime holds attribute groups out
  (their rules in test differ from train/val), else ``in-distribution``.

A cache made by ``rpm-data prepare`` records its raw folder's ``regime.json`` in its ``manifest.json`` when it
is built, and that record is used, whatever the raw folder holds later (or whether it still exists).

Training-vs-test overlap is checked by content: an extra test set whose test problems have the panels of
training problems is refused, whatever the folders' names or records say (the panels are read from the folders
and hashed, ``rpm_lib.data.problem_hashes.ProblemPanels``; a copied or edited problem-hash record hides nothing).

An out-of-distribution set may still hold configurations whose rules are drawn exactly as in training (in
A/Position only the grids can change Number/Position, so the Center, L-R, U-D and O-IC test problems are
in-distribution); each entry lists them in ``configurations_in_distribution`` (:func:`unshifted_configurations`).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rpm_lib.data.records import REGIME_FILE
from rpm_lib.generator.regimes import REGIMES, Regime
from rpm_lib.json_files import read_object, shown_value
from rpm_lib.rules import MESH_META_ROWS, RULE_GROUPS
from rpm_lib.training.config import ConfigError, TrainConfig

IN_DISTRIBUTION = "in-distribution"
OUT_OF_DISTRIBUTION = "out-of-distribution"
UNKNOWN = "unknown"
#: The values of an entry's ``distribution``.
DISTRIBUTIONS: tuple[str, ...] = (IN_DISTRIBUTION, OUT_OF_DISTRIBUTION, UNKNOWN)
#: Splits whose rules follow the training distribution in every regime (a regime changes rules in ``test`` only).
TRAINLIKE_SPLITS: tuple[str, ...] = ("train", "val")
#: Names of the entries of the training data's own splits.
MAIN_SET_NAMES: tuple[str, ...] = ("val", "test")


# ----------------------------------------------------------------------------------------------
# regime.json
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RegimeInfo:
    """What a folder's ``regime.json`` says about its distribution.

    Attributes:
        regime: the generator's :class:`~rpm_lib.generator.regimes.Regime` (name, held-out groups, mesh).
        mode: generator mode (``"balanced"`` / ``"original"``), ``None`` when not recorded.
        path: the ``regime.json`` read (``None`` for the record ``generate=true`` is about to write).
        seed: generator seed; val / test: split proportions in tenths (``None`` when not recorded).
    """

    regime: Regime
    mode: str | None
    path: Path | None
    seed: int | None = None
    val: int | None = None
    test: int | None = None

    @property
    def name(self) -> str:
        return self.regime.name

    @property
    def held_out(self) -> tuple[str, ...]:
        """Held-out groups as ``"Color:Constant"`` (group: train rule), empty for none."""
        return tuple(f"{RULE_GROUPS[group]}:{rule}" for group, rule in self.regime.held_out)

    @property
    def has_held_out(self) -> bool:
        return bool(self.regime.held_out)

    def identity(self) -> tuple[Any, ...]:
        """What must agree for two folders to be drawn from one distribution (seed and sizes do not matter)."""
        return (self.name, self.held_out, self.regime.mesh, self.mode)


def regime_file(root: str | Path) -> Path | None:
    """The file recording ``root``'s regime: its ``regime.json``, or for a cache its ``manifest.json`` (field
    ``regime``, copied from the raw folder when the cache was built); else None."""
    root = Path(root)
    for name in ("manifest.json", REGIME_FILE):
        if (root / name).is_file():
            return root / name
    return None


def read_regime(root: str | Path, field: str = "data_root") -> RegimeInfo | None:
    """The regime of ``root``, or ``None`` when nothing records one.

    A raw folder's ``regime.json`` must agree with its ``generator.json`` and its data
    (``writer.read_regime_record``). A cache's regime is the one its manifest recorded when it was built, whatever
    its raw folder holds now; a cache built before manifests recorded it has none (a note says so), as its raw
    folder may since have been regenerated with another regime.

    Raises:
        ConfigError: an unreadable or disagreeing record (one line naming ``field`` and the file).
    """
    from rpm_lib.data.cache import MANIFEST
    from rpm_lib.data.problem_hashes import note
    from rpm_lib.data.records import GeneratorSettingsError
    from rpm_lib.data.validation import read_regime_record

    root = Path(root)
    path = regime_file(root)
    if path is None:
        return None
    if path.name == MANIFEST:
        try:
            manifest = read_object(path, _Unreadable)
        except (OSError, _Unreadable):
            return None  # the cache reader reports a broken manifest with its own message
        if "regime" not in manifest:
            note(f"{root}: a cache built before caches recorded their regime; its distribution is taken as unknown "
                 "(rebuild it with `rpm-data prepare` to record it)")
            return None
        data = manifest["regime"]
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ConfigError(f"config field '{field}': {path}: field 'regime' must be an object or null, got "
                              f"{shown_value(data)}")
    else:
        try:
            data = read_regime_record(root)
        except GeneratorSettingsError as error:
            raise ConfigError(f"config field '{field}': {error}") from None
    try:
        regime = Regime.from_json(data)
    except ValueError as error:
        raise ConfigError(f"config field '{field}': {path}: {error}") from None
    if path.name == MANIFEST:
        rows = manifest.get("meta_rows")
        if type(rows) is int and (rows == MESH_META_ROWS) != regime.mesh:
            raise ConfigError(f"config field '{field}': {path}: field 'regime' says mesh={regime.mesh}, but the "
                              f"cache's labels have {rows} meta_matrix rows; the record does not describe this data")
    mode = data.get("mode")
    if mode is not None and not isinstance(mode, str):
        raise ConfigError(f"config field '{field}': {path}: field 'mode' must be a generator mode (str) or null, got "
                          f"{shown_value(mode)}")
    numbers = {key: data.get(key) if type(data.get(key)) is int else None for key in ("seed", "val", "test")}
    return RegimeInfo(regime=regime, mode=mode, path=path, **numbers)


class _Unreadable(ValueError):
    """A cache manifest that ``read_object`` refuses (left to the cache reader to report)."""


def classify_distribution(trained: RegimeInfo | None, evaluated: RegimeInfo | None, split: str) -> tuple[str, str]:
    """Whether ``split`` of a folder with regime ``evaluated`` is in the distribution a model trained on
    ``trained`` (the training split of the run's data) saw, and why (rules in the module docstring).

    Returns:
        ``(distribution, reason)``: one of :data:`DISTRIBUTIONS` and one sentence.
    """
    if split not in (*TRAINLIKE_SPLITS, "test"):
        raise ValueError(f"classify_distribution: unknown split {split!r}")
    if trained is None:
        return UNKNOWN, "the training data has no regime.json, so its distribution is not recorded"
    if evaluated is None:
        return UNKNOWN, "this folder has no regime.json, so its distribution is not recorded"
    if trained.identity() != evaluated.identity():
        parts = [name for name, a, b in zip(("regime", "held-out groups", "mesh", "generator mode"),
                                            trained.identity(), evaluated.identity()) if a != b]
        return OUT_OF_DISTRIBUTION, (f"regime {evaluated.name} differs from the training regime {trained.name} "
                                     f"({', '.join(parts)})")
    if split in TRAINLIKE_SPLITS:
        return IN_DISTRIBUTION, f"{split} split of the training regime {trained.name} (train/val rules)"
    if trained.has_held_out:
        return OUT_OF_DISTRIBUTION, (f"test split of {trained.name}: the held-out {', '.join(trained.held_out)} "
                                     "follow other rules in test than in train/val")
    return IN_DISTRIBUTION, f"test split of {trained.name}, which holds nothing out (same rules as train)"


def unshifted_configurations(trained: RegimeInfo | None, evaluated: RegimeInfo | None, split: str) -> list[str] | None:
    """Configurations (folder names) whose problems in ``split`` of ``evaluated`` draw every rule exactly as the
    training split of ``trained`` does (the generator's exact rule tables, ``regime_rule_table``).

    ``None`` when a regime is unknown; ``[]`` when mesh or generator mode differ (then nothing is drawn alike).
    """
    from rpm_lib.generator.sampling import configurations_drawn_alike

    if trained is None or evaluated is None:
        return None
    if (trained.regime.mesh, trained.mode) != (evaluated.regime.mesh, evaluated.mode):
        return []
    return configurations_drawn_alike(trained.regime, evaluated.regime, split)


# ----------------------------------------------------------------------------------------------
# the sets of a run
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EvalSet:
    """One evaluated split.

    Attributes:
        name: entry name: ``"val"`` / ``"test"`` for the training data, the folder name for an extra set
            (made unique with ``-2``, ``-3``, ...).
        data_root: the folder as configured.
        split: the split evaluated (extra sets: always ``"test"``).
        main: True for the training data's own splits.
    """

    name: str
    data_root: str
    split: str
    main: bool

    @property
    def predictions_file(self) -> str:
        """File name of its per-sample predictions: ``predictions.npz`` for the main test (as before),
        ``predictions_<name>.npz`` for an extra set (name made file-safe)."""
        if self.main:
            return "predictions.npz"
        return f"predictions_{re.sub(r'[^A-Za-z0-9._-]+', '_', self.name).strip('_') or 'set'}.npz"


def main_sets(config: TrainConfig) -> list[EvalSet]:
    """The training data's val and test splits."""
    return [EvalSet(split, config.data_root, split, True) for split in MAIN_SET_NAMES]


def extra_sets(config: TrainConfig) -> list[EvalSet]:
    """One set per ``test_data_roots`` entry (its test split), named after the folder, names unique."""
    taken = set(MAIN_SET_NAMES)
    sets = []
    for root in config.test_data_roots or []:
        base = Path(root).name or Path(root).resolve().name or "set"
        name, number = base, 1
        while name in taken:
            number += 1
            name = f"{base}-{number}"
        taken.add(name)
        sets.append(EvalSet(name, root, "test", False))
    return sets


def check_extra_sets(config: TrainConfig) -> None:
    """Fail before training when an extra test set cannot be evaluated: the folder is missing, its
    ``regime.json`` is broken, it has no readable test problems for this run (configurations, image size), or
    its test problems repeat training problems (by content, :func:`_check_overlap`).

    Raises:
        ConfigError: one line naming ``test_data_roots`` and the folder.
    """
    from rpm_lib.data import DataFormatError
    from rpm_lib.training.samples import make_dataset

    trained = training_regime(config)
    for eval_set in extra_sets(config):
        root = Path(eval_set.data_root)
        if not root.is_dir():
            raise ConfigError(f"config field 'test_data_roots': {root} does not exist"
                              + ("" if not root.exists() else " as a folder"))
        evaluated = read_regime(root, field="test_data_roots")
        if root.resolve() == Path(config.data_root).resolve():
            raise ConfigError(f"config field 'test_data_roots': {root} is the training data (data_root); its test "
                              "split is already evaluated as 'test'")
        _check_streams(trained, evaluated, root)
        try:
            dataset = make_dataset(config, "test", root=root)
            if len(dataset) and Path(config.data_root).exists():
                _check_overlap(config, dataset, root)
        except DataFormatError as error:  # its message names the folder or file already, when it can
            where = "" if str(root) in str(error) else f"{root}: "
            raise ConfigError(f"config field 'test_data_roots': {where}{error}") from None
        if len(dataset) == 0:
            raise ConfigError(f"config field 'test_data_roots': no test problems found in {root}")


def _check_overlap(config: TrainConfig, tested: Any, root: Path) -> None:
    """Refuse an extra test set whose test problems are training problems (same panels) or are exactly the training
    data's own test split, whatever the folders are called or their records say.

    ``tested``: the ``RpmDataset`` of ``root``'s test split. The problems are compared by what the folders hold
    (``problem_hashes.ProblemPanels``), never by their problem-hash records, which a copy or an edit makes say
    anything: the original panels where both folders hold them (raw folders, caches at 160 px), else the resized
    panels of a cache against the other folder's panels resized the same way. Where that comparison may miss a
    shared problem (two OpenCV versions resizing by a non-integer factor) or cannot be made (two caches resized
    differently), the records are compared too, and a note says that they cannot be checked.
    """
    from rpm_lib.data import DataFormatError
    from rpm_lib.data.problem_hashes import ProblemPanels, comparison_level, note, shared_by_content, shared_problems
    from rpm_lib.training.samples import make_dataset

    test_panels = ProblemPanels(tested)
    recorded: dict[str, list[bytes] | None] = {}  # the records' hashes, read only where content cannot decide

    def records(dataset: Any, key: str) -> list[bytes] | None:
        if key not in recorded:
            recorded[key] = dataset.problem_hashes()
        return recorded[key]

    noted = checked = False
    for split in ("train", "val", "test"):
        try:
            own = make_dataset(config, split)
        except DataFormatError:
            continue  # a training folder without this split: nothing to share
        own_panels = ProblemPanels(own)
        comparable, level, exact = comparison_level(own_panels, test_panels)
        if not checked:  # a note where the test folder's record is incomplete or, when free, wrong
            test_panels.check_records(against_panels=comparable and level is None)
            checked = True
        pairs = set(shared_by_content(own_panels, test_panels, level)) if comparable else set()
        if not exact:
            if not noted:
                how = (f"are compared with those of {config.data_root} at {level[0]} px ({level[1]}), resized by "
                       "OpenCV versions that may set some pixels differently (or one not recorded), so their "
                       "problem-hash records are compared too" if comparable else
                       f"and those of {config.data_root} are panels resized differently ({own_panels.stored} vs "
                       f"{test_panels.stored}), so only their problem-hash records are compared")
                note(f"{root}: its test problems {how}, and those records cannot be checked against the panels")
                noted = True
            own_hashes, test_hashes = records(own, split), records(tested, "tested")
            if own_hashes is not None and test_hashes is not None:
                pairs.update(shared_problems(own_hashes, test_hashes))
        shared = sorted({j: i for i, j in sorted(pairs)}.items())  # one pair per test problem j: (j, i)
        if split == "test":
            if len(shared) == len(test_panels) == len(own_panels):
                raise ConfigError(f"config field 'test_data_roots': {root} holds the training data's test problems "
                                  f"(same panels as {config.data_root}'s test split); they are already evaluated as "
                                  "'test'")
            continue
        if shared:
            j, i = shared[0]
            raise ConfigError(f"config field 'test_data_roots': {root}: {len(shared)} of its {len(test_panels)} test "
                              f"problems have the panels of {split} problems of {config.data_root} (e.g. "
                              f"{tested.source_ids[j]} = {own.source_ids[i]}); a test set must not repeat what the "
                              "model trained on")


def training_regime(config: TrainConfig) -> RegimeInfo | None:
    """The regime of the training data: its ``regime.json``, or, before ``generate=true`` has written it, the
    record the generator will write (regime ``generate_regime``, seed ``generate_seed``, balanced, 6/2/2)."""
    found = read_regime(config.data_root) if Path(config.data_root).exists() else None
    if found is not None or not config.generate:
        return found
    return RegimeInfo(regime=REGIMES[config.generate_regime], mode="balanced", path=None, seed=config.generate_seed,
                      val=2, test=2)


def _check_streams(trained: RegimeInfo | None, evaluated: RegimeInfo | None, root: Path) -> None:
    """Refuse an extra test folder whose test problems may repeat training problems.

    The generator draws problem ``k`` of a configuration from a stream of ``(seed, configuration, k)`` only. Two
    folders of one seed with the same split proportions never give a training ``k`` to a test problem; with other
    proportions (e.g. an all-test folder, val=0 test=10) they do, and with the same regime those problems are
    identical.
    """
    if trained is None or evaluated is None or None in (trained.seed, evaluated.seed):
        return
    if trained.seed == evaluated.seed and (trained.val, trained.test) != (evaluated.val, evaluated.test):
        raise ConfigError(f"config field 'test_data_roots': {root} was generated with the training data's seed "
                          f"({trained.seed}) but other split proportions (val/test {evaluated.val}/{evaluated.test} "
                          f"vs {trained.val}/{trained.test}), so some of its test problems reuse training problems' "
                          "random streams; generate it with another seed")


def set_entry(eval_set: EvalSet, summary: Mapping[str, Any], trained: RegimeInfo | None,
              evaluated: RegimeInfo | None) -> dict[str, Any]:
    """The ``metrics["test_sets"]`` entry of one evaluated set.

    Args:
        eval_set: the set.
        summary: its metrics from :func:`rpm_lib.training.evaluation.answer_summary` (accuracy fractions).
        trained: regime of the training data; evaluated: regime of ``eval_set``'s folder.

    Returns:
        ``{"name", "data_root", "split", "regime", "held_out", "distribution", "distribution_reason",
        "configurations_in_distribution", "accuracy", "accuracy_per_configuration" (I-RAVEN) or
        "accuracy_per_regime" (PGM), "num_samples", "loss", "rules" (with a rule head), ...}``; accuracies are
        fractions in [0, 1]; ``held_out`` lists ``"group:train rule"``; ``configurations_in_distribution``: the
        set's configurations whose rules follow the training distribution (all of them for an in-distribution
        set, ``None`` when unknown or for PGM).
    """
    distribution, reason = classify_distribution(trained, evaluated, eval_set.split)
    present = summary.get("accuracy_per_configuration")
    alike = unshifted_configurations(trained, evaluated, eval_set.split) if present is not None else None
    return {
        "name": eval_set.name,
        "data_root": eval_set.data_root,
        "split": eval_set.split,
        "regime": None if evaluated is None else evaluated.name,
        "held_out": None if evaluated is None else list(evaluated.held_out),
        "distribution": distribution,
        "distribution_reason": reason,
        "configurations_in_distribution": None if alike is None else [c for c in present if c in alike],
        **summary,
    }
