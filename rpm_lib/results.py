"""Gather training runs into the paper's Table 1 layout, beside the published numbers.

A *run folder* is what ``rpm-batch`` (``rpm_lib.batch``) leaves for one grid point:

* ``run.json``     written by the batch runner before execution: ``{"name", "grid", "labels", "parameters"}``;
  ``labels`` maps each grid axis (e.g. ``encoder``, ``setup``, ``seed``) to the label of its value;
* ``metrics.json`` written by training (``rpm_lib.training.train``); its presence means "finished";
* ``error.txt``    written by the batch runner when the run failed.

Accuracies are reported in **percent** everywhere in this module (the paper's unit).
Table 1's "Average ± Std" is, per (encoder, setup): for each seed the mean of the 7 per-configuration
test accuracies, then the mean and the sample standard deviation (ddof=1) of those averages over seeds.
The per-configuration columns are means over seeds.

Run folders come from other machines and other people, so nothing in them is trusted (``load_runs``):

* a folder whose records cannot be read (an accuracy that is no fraction, a field of the wrong shape) gets the
  status ``damaged: <file>: <why>``; a symbolic link to a run folder is not followed (``skipped: ...``);
* a finished run whose ``metrics.json`` trained with another setup, encoder, seed or setting than its ``run.json``
  or ``config.yaml`` asks for keeps the status ``done`` with a ``conflict``: ``table1`` refuses it (or, for
  ``write_tables``, leaves it out and names it), and so does ``ablation_series``;
* ``table1`` never averages runs that were trained or tested differently (settings recorded in ``metrics.json``
  ``config``, the dataset, the test set's regime and size, the configurations present): such runs get a row each,
  with the setting in the Group column; a seed counted twice (a copied folder) counts once; the paper's numbers
  are only set beside linear-evaluation / supervised runs on I-RAVEN (a note when configurations are missing);
* ``write_tables`` (``rpm-batch --gather``) names under the table every run it leaves out, and why.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES
from rpm_lib.training.setups import SETUPS

#: Table 1 configuration columns, in the paper's order (``Center`` .. ``O-IG``).
CONFIGURATION_COLUMNS: tuple[str, ...] = tuple(SHORT_NAMES[c] for c in CONFIGURATIONS)

#: The paper's training setups (Table 1 row names), from the setup registry.
SETUP_LABELS: tuple[str, ...] = tuple(spec.label for spec in SETUPS.values())

#: Encoder registry names -> the paper's spelling.
ENCODER_NAMES: dict[str, str] = {"scl": "SCL", "hrinet": "HriNet", "copinet": "CoPINet", "wren": "WReN"}

#: Row label of the "best result reported in the literature" rows of Table 1.
LITERATURE = "literature"


@dataclass(frozen=True)
class PaperRow:
    """One row of the paper's Table 1 (test accuracy on Balanced-RAVEN / I-RAVEN, percent).

    Attributes:
        encoder: paper spelling, e.g. ``"SCL"``.
        setup: one of ``SETUP_LABELS`` or ``LITERATURE``.
        average: "Average" column.
        std: "± Std" over 4 seeds; ``None`` for literature rows.
        per_configuration: short configuration name (``CONFIGURATION_COLUMNS``) -> accuracy.
    """

    encoder: str
    setup: str
    average: float
    std: float | None
    per_configuration: dict[str, float]


def _paper_row(encoder: str, setup: str, average: float, std: float | None, *cells: float) -> PaperRow:
    if len(cells) != len(CONFIGURATION_COLUMNS):
        raise ValueError(f"paper row {encoder}/{setup}: expected {len(CONFIGURATION_COLUMNS)} cells, got {len(cells)}")
    return PaperRow(encoder, setup, average, std, dict(zip(CONFIGURATION_COLUMNS, cells)))


#: Table 1 of the paper, transcribed from ``mlcl-paper.tex`` (``tab:balanced-raven``).
PAPER_TABLE1: tuple[PaperRow, ...] = (
    _paper_row("SCL", "CE", 82.8, 0.7, 99.0, 80.3, 74.7, 83.9, 84.4, 87.3, 69.8),
    _paper_row("SCL", "CE+AUX-dense", 86.9, 3.5, 98.9, 86.9, 80.6, 88.4, 88.8, 92.0, 72.7),
    _paper_row("SCL", "CE+AUX-sparse", 95.9, 0.3, 99.8, 97.0, 91.8, 99.1, 99.1, 98.7, 85.8),
    _paper_row("SCL", "MLCL", 95.7, 0.5, 99.6, 96.4, 90.7, 99.2, 99.1, 99.1, 85.9),
    _paper_row("SCL", "MLCL+AUG", 96.8, 0.4, 99.8, 97.6, 93.8, 99.3, 99.4, 99.1, 88.9),
    _paper_row("SCL", LITERATURE, 95.0, None, 99.0, 96.2, 89.5, 97.9, 97.1, 97.6, 87.7),
    _paper_row("HriNet", "CE", 50.6, 1.3, 66.3, 41.0, 35.6, 56.0, 54.9, 58.5, 41.8),
    _paper_row("HriNet", "CE+AUX-dense", 51.6, 1.5, 75.7, 41.2, 36.5, 55.0, 55.4, 57.0, 40.2),
    _paper_row("HriNet", "CE+AUX-sparse", 57.0, 1.6, 84.5, 43.2, 36.9, 65.4, 66.1, 60.5, 42.6),
    _paper_row("HriNet", "MLCL", 56.2, 1.5, 78.9, 44.5, 38.2, 64.4, 64.1, 60.5, 42.9),
    _paper_row("HriNet", "MLCL+AUG", 65.7, 2.4, 94.4, 57.3, 46.8, 75.3, 76.0, 64.2, 45.8),
    _paper_row("HriNet", LITERATURE, 63.9, None, 80.1, 53.3, 46.0, 72.8, 74.5, 71.0, 49.6),
    _paper_row("CoPINet", "CE", 44.8, 0.8, 53.6, 35.9, 30.2, 51.0, 52.1, 51.1, 39.9),
    _paper_row("CoPINet", "CE+AUX-dense", 32.2, 1.9, 37.1, 30.1, 27.6, 33.4, 35.8, 33.3, 28.0),
    _paper_row("CoPINet", "CE+AUX-sparse", 46.8, 2.3, 52.7, 37.6, 34.2, 52.6, 55.7, 55.5, 39.0),
    _paper_row("CoPINet", "MLCL", 57.1, 0.4, 68.5, 42.8, 36.3, 68.8, 71.4, 68.7, 42.9),
    _paper_row("CoPINet", "MLCL+AUG", 58.0, 0.4, 68.3, 44.6, 38.9, 69.0, 71.7, 69.0, 44.4),
    _paper_row("CoPINet", LITERATURE, 46.3, None, 54.4, 33.4, 30.1, 56.8, 55.6, 54.3, 39.0),
)

#: Ablation numbers quoted in the paper's text (Sec. "Ablation study"), average test accuracy in percent.
#: ``beta=0``: contrastive loss only; ``gamma=0``: auxiliary loss only; ``no_choice_negatives``: MLCL
#: without the incorrectly-completed RPMs as extra negatives.
PAPER_ABLATIONS: dict[str, dict[str, float]] = {
    "beta=0": {"SCL": 35.3, "HriNet": 20.7, "CoPINet": 19.0},
    "gamma=0": {"SCL": 46.7, "HriNet": 31.9, "CoPINet": 24.2},
    "no_choice_negatives": {"SCL": 58.0, "HriNet": 37.2, "CoPINet": 26.5},
}


def _squash(name: str) -> str:
    """Lower-case and drop everything but letters and digits: ``"CE+AUX-dense"`` -> ``"ceauxdense"``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


_SETUP_BY_SQUASHED = {_squash(s): s for s in SETUP_LABELS}
_ENCODER_BY_SQUASHED = {_squash(k): v for k, v in ENCODER_NAMES.items()}


def canonical_setup(name: str) -> str:
    """The paper's spelling of a setup name (``"mlcl_aug"`` -> ``"MLCL+AUG"``); unknown names are returned as is.

    A fine-tuned variant keeps its suffix (``"mlcl_aug_ft"`` -> ``"MLCL+AUG+FT"``): it is not a Table 1 row.
    """
    squashed = _squash(name)
    if squashed.endswith("ft") and squashed[:-2] in _SETUP_BY_SQUASHED:
        return _SETUP_BY_SQUASHED[squashed[:-2]] + "+FT"
    return _SETUP_BY_SQUASHED.get(squashed, name)


def canonical_encoder(name: str) -> str:
    """The paper's spelling of an encoder name (``"copinet"`` -> ``"CoPINet"``); unknown names are returned as is."""
    return _ENCODER_BY_SQUASHED.get(_squash(name), name)


def paper_row(encoder: str, setup: str) -> PaperRow | None:
    """The published Table 1 row for ``(encoder, setup)`` (any spelling), or ``None`` if the paper has none."""
    enc, stp = canonical_encoder(encoder), canonical_setup(setup)
    for row in PAPER_TABLE1:
        if row.encoder == enc and row.setup == stp:
            return row
    return None


# ----------------------------------------------------------------------------------------------
# Reading runs
# ----------------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One run folder, read back.

    Attributes:
        run_dir: the folder.
        name: run name (folder name).
        grid: name of the grid it belongs to (``"main"`` for single-grid batches).
        labels: grid axis -> value label (strings), e.g. ``{"encoder": "scl", "setup": "MLCL", "seed": "0"}``.
        parameters: the notebook parameters the run was executed with.
        metrics: the parsed ``metrics.json`` (``None`` when the run has not finished).
        error: content of ``error.txt`` (``None`` when the run did not fail).
        problem: why the run cannot be counted: ``damaged: <file>: <why>`` (a record that cannot be read) or
            ``skipped: <why>`` (a symbolic link, a folder that cannot be listed); ``None`` for a sound folder.
        conflict: why a finished run's ``metrics.json`` is not the result of the run its ``run.json`` /
            ``config.yaml`` describe (``_contradiction``); ``None`` when they agree.
        folder: how tables name the folder: its path below the gathered folder (``load_runs``), else its name.
    """

    run_dir: Path
    name: str
    grid: str
    labels: dict[str, str]
    parameters: dict[str, Any]
    metrics: dict[str, Any] | None = None
    error: str | None = None
    problem: str | None = None
    folder: str = ""
    conflict: str | None = None

    @property
    def status(self) -> str:
        """``"done"`` (metrics present), ``"failed"`` (error recorded), ``"pending"``, or ``"damaged"`` /
        ``"skipped"`` (see ``problem``)."""
        if self.problem is not None:
            return self.problem.split(":", 1)[0]
        if self.metrics is not None:
            return "done"
        return "failed" if self.error is not None else "pending"

    def _recorded(self, key: str) -> str:
        """A label, else the run.json parameter, else what metrics.json says the run trained with, else ``?``
        (a grid that leaves ``encoder`` to the template's default labels no encoder)."""
        if key in self.labels:
            return self.labels[key]
        if key in self.parameters:
            return str(self.parameters[key])
        trained = _trained_with(self.metrics)
        return str(trained[key]) if key in trained else "?"

    @property
    def encoder(self) -> str:
        return self._recorded("encoder")

    @property
    def setup(self) -> str:
        """The setup label; ``+FT`` appended for a run whose final weights were fine-tuned (metrics.json
        ``protocol``), so a fine-tuned MLCL run never lands in (or is compared with) a linear-evaluation row;
        `` (<protocol>)`` for any other protocol but linear evaluation and supervised training, e.g. a contrastive
        run whose linear evaluation never ran (``untrained_head``: ``max_total_epochs`` left it no epoch), whose
        number measures a random head, not the encoder."""
        name = self._recorded("setup")
        if self.protocol == "fine_tuned" and not canonical_setup(name).endswith("+FT"):
            return f"{name}+FT"
        if self.protocol not in (None, "fine_tuned", "linear_evaluation", "supervised"):
            return f"{canonical_setup(name)} ({_clean(self.protocol)})"
        return name

    @property
    def protocol(self) -> str | None:
        """What the final weights measure (``rpm_lib.training.setups.PROTOCOLS``): metrics.json ``protocol``;
        for metrics written before it existed, ``fine_tuned`` when the config fine-tuned; ``None`` when unfinished."""
        if self.metrics is None:
            return None
        if "protocol" in self.metrics:
            return str(self.metrics["protocol"])
        return "fine_tuned" if (self.metrics.get("config") or {}).get("finetune") else None

    @property
    def seed(self) -> str:
        return self._recorded("seed")


#: The most bytes a run's JSON record may have: metrics.json is a few hundred KiB at most (rule metrics per slot);
#: a larger file (a shared folder's mistake, or a trap) is refused before it is read into memory.
MAX_RECORD_BYTES = 64 * 2**20

#: Files that make a folder a run folder (what ``rpm-batch progress`` lists too: a started or unfinished
#: ``rpm-train`` run has ``config.yaml`` / ``progress.json`` but neither ``run.json`` nor ``metrics.json``).
RUN_RECORDS: tuple[str, ...] = ("run.json", "metrics.json", "progress.json", "config.yaml")

#: TrainConfig fields that say how or where a run ran, not what it trained: ``run.json`` may differ from
#: ``metrics.json`` there (a batch moved to another machine, resumed with other workers) and seeds may differ
#: there within one Table 1 row. Every other recorded field must agree (``load_run``) / separates rows (``table1``).
NOT_COMPARED: frozenset[str] = frozenset({
    "run_dir", "seed", "resume", "overwrite", "progress_bar", "save_predictions", "log_every_n_steps", "logger",
    "time_budget", "data_root", "data_check", "test_data_roots", "generate", "generate_workers", "num_workers",
    "accelerator", "devices", "num_nodes", "strategy", "precision", "matmul_precision", "memory_format",
    "deterministic", "fused_adam", "compile", "compile_scope", "compile_mode",
})


def _clean(text: Any) -> str:
    """``text`` fit for one table cell and a UTF-8 file: bytes of a folder name that are not UTF-8, or a lone
    surrogate spelled in JSON (``"\\udcff"``), shown escaped; line breaks and other control characters as spaces
    (a label with a line break split its table1.md row in two)."""
    text = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return re.sub(r"[\x00-\x1f\x7f\u2028\u2029]", " ", text)


def _read_json(path: Path) -> dict[str, Any]:
    from rpm_lib.json_files import read_object

    size = path.stat().st_size
    if size > MAX_RECORD_BYTES:
        raise ValueError(f"{path}: {size / 2**20:.0f} MiB, more than a run's record can be "
                         f"({MAX_RECORD_BYTES / 2**20:.0f} MiB); not read")
    return read_object(path)


def _trained_with(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ``metrics.json`` says the run trained with: its ``config``, with the top-level ``encoder``, ``setup``
    and ``seed`` that training writes beside it."""
    metrics = metrics or {}
    config = metrics.get("config")
    trained = dict(config) if isinstance(config, Mapping) else {}
    trained.update({k: metrics[k] for k in ("encoder", "setup", "seed") if k in metrics})
    return trained


def _same(key: str, asked: Any, trained: Any) -> bool:
    """Whether a run.json value and the value metrics.json records are the same setting (numbers by value, names
    in any spelling); lists and mappings are not compared (training normalises them, e.g. configuration names)."""
    if key == "encoder":
        return canonical_encoder(str(asked)) == canonical_encoder(str(trained))
    if key == "setup":
        return canonical_setup(str(asked)) == canonical_setup(str(trained))
    numbers = (int, float)
    if isinstance(asked, numbers) and isinstance(trained, numbers) and not isinstance(asked, bool) \
            and not isinstance(trained, bool):
        return math.isclose(float(asked), float(trained), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(asked, (list, dict)) or isinstance(trained, (list, dict)):
        return True
    return asked == trained


def _contradiction(run_dir: Path, labels: Mapping[str, str], parameters: Mapping[str, Any],
                   metrics: Mapping[str, Any], source: str = "run.json") -> str | None:
    """Why ``metrics.json`` is not the result of the run ``source`` (``run.json``'s labels and parameters, or the
    run's ``config.yaml``) describes, or None.

    E.g. the batch YAML's ``lr`` changed and the batch was run again: finished runs are skipped, their run.json
    rewritten with the new parameters, their metrics.json still those of the old ``lr``; or a metrics.json copied
    into another seed's folder. Labels are checked where they name a known encoder / setup or a seed number (a grid
    may label values with any text)."""
    trained = _trained_with(metrics)
    asked: dict[str, Any] = {k: v for k, v in parameters.items() if k not in NOT_COMPARED or k == "seed"}
    for key in ("encoder", "setup"):
        label = labels.get(key)
        known = ENCODER_NAMES.values() if key == "encoder" else SETUP_LABELS
        if label is not None and (canonical_encoder if key == "encoder" else canonical_setup)(label) in known:
            asked.setdefault(key, label)
    if re.fullmatch(r"\d+", labels.get("seed", "")):
        asked.setdefault("seed", int(labels["seed"]))
    for key, value in asked.items():
        if key in trained and not _same(key, value, trained[key]):
            return (f"{run_dir / 'metrics.json'}: trained with {key}={trained[key]!r}, but {run_dir / source} "
                    f"asks for {key}={value!r} (results of an earlier run in this folder, or a copied file?)")
    return None


def _config_yaml(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` (written when training starts, kept with a finished run's results), or ``{}`` when
    it is absent or unreadable: it only serves to check ``metrics.json`` (``_contradiction``), the numbers come from
    ``metrics.json``. ``yaml.safe_load``: a shared folder's file must not build Python objects."""
    import yaml

    path = run_dir / "config.yaml"
    try:
        if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            return {}
        value = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return value if isinstance(value, dict) else {}


def _check_metrics(metrics: Mapping[str, Any], where: str) -> None:
    """Raise ValueError (naming ``where`` and the field) when ``metrics.json`` cannot be counted: its test
    accuracies (``run_accuracies``), ``config``, ``test_num_samples`` or ``test_sets`` of the wrong shape."""
    run_accuracies(metrics, "test", where)
    if "config" in metrics and not isinstance(metrics["config"], Mapping):
        raise ValueError(f"{where}: config must be an object, got {type(metrics['config']).__name__}")
    size = metrics.get("test_num_samples")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise ValueError(f"{where}: test_num_samples must be a count of problems, got {size!r}")
    for entry in _test_sets(metrics, where):
        _set_accuracies(entry, where)


def load_run(run_dir: str | Path) -> RunRecord:
    """Read one run folder (see the module docstring for its files).

    A folder without ``run.json`` (e.g. a single ``rpm-train`` / ``03_train`` run) is accepted: its labels
    are then taken from ``config.yaml`` / ``metrics.json`` when present, else left empty.

    A finished run whose ``metrics.json`` cannot be counted (no fraction for an accuracy, a field of the wrong
    shape) is returned with the status ``damaged``; one whose ``metrics.json`` contradicts ``run.json`` or
    ``config.yaml`` with a ``conflict``.

    Raises:
        ValueError: ``run.json`` or ``metrics.json`` is not a JSON object of the expected shape (one line naming
            the file), or is larger than ``MAX_RECORD_BYTES``.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    info = _read_json(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    for key in ("labels", "parameters"):
        if not isinstance(info.get(key, {}), dict):
            raise ValueError(f"{run_dir / 'run.json'}: '{key}' must be an object, got {type(info[key]).__name__}")
    odd = [k for k, v in info.get("labels", {}).items() if isinstance(v, (list, dict))]
    if odd:
        raise ValueError(f"{run_dir / 'run.json'}: label '{odd[0]}' must be a text or a number")
    metrics = _read_json(run_dir / "metrics.json") if (run_dir / "metrics.json").is_file() else None
    # error.txt holds a notebook's traceback, whose bytes need not be UTF-8
    error = (run_dir / "error.txt").read_bytes().decode("utf-8", "replace") if (run_dir / "error.txt").is_file() \
        else None
    parameters = dict(info.get("parameters", {}))
    if not parameters and metrics is not None and isinstance(metrics.get("config"), dict):
        parameters = dict(metrics["config"])
    labels = {_clean(k): _clean(v) for k, v in info.get("labels", {}).items()}
    problem = conflict = None
    if metrics is not None:
        try:
            _check_metrics(metrics, str(run_dir / "metrics.json"))
        except ValueError as exc:
            problem = str(exc)
        conflict = (_contradiction(run_dir, labels, dict(info.get("parameters", {})), metrics)
                    or _contradiction(run_dir, {}, _config_yaml(run_dir), metrics, source="config.yaml"))
    return RunRecord(
        run_dir=run_dir,
        name=_clean(info.get("name", run_dir.name)),
        grid=_clean(info.get("grid", "main")),
        labels=labels,
        parameters=parameters,
        metrics=metrics,
        error=error,
        problem=None if problem is None else _clean(f"damaged: {problem}"),
        folder=_clean(run_dir.name),
        conflict=None if conflict is None else _clean(conflict),
    )


#: ``problem`` of a symbolic link to a run folder (``load_runs`` does not follow links, as ``rpm-batch progress``).
SYMLINK_PROBLEM = "skipped: a symbolic link (not followed; copy the run folder here to count it)"


def load_runs(batch_dir: str | Path) -> list[RunRecord]:
    """Every run folder below ``batch_dir`` (a folder holding one of ``RUN_RECORDS``), sorted by path.

    One folder never stops the others: a folder whose records cannot be read is returned with the status
    ``damaged`` (``problem`` says which file and why); a symbolic link to a run folder (links in a shared folder may
    lead anywhere, or loop) and a folder that cannot be listed (its permissions) with the status ``skipped``, so
    that tables name them instead of losing them (``Path.rglob`` passes both over without a word).
    """
    batch_dir = Path(batch_dir)
    if not batch_dir.is_dir():
        raise FileNotFoundError(f"batch folder {batch_dir} does not exist")
    run_dirs: set[Path] = set()
    skipped: dict[Path, str] = {}
    unlisted: list[OSError] = []
    for folder, dirs, files in os.walk(batch_dir, onerror=unlisted.append):  # links are not followed
        here = Path(folder)
        if any(name in files for name in RUN_RECORDS):
            run_dirs.add(here)
        for name in dirs:
            if (here / name).is_symlink() and any((here / name / record).is_file() for record in RUN_RECORDS):
                skipped[here / name] = SYMLINK_PROBLEM
    for error in unlisted:
        skipped[Path(error.filename)] = (f"skipped: {error.filename}: cannot be listed ({error.strerror}); no run "
                                         "below it is counted")
    records = []
    for run_dir in sorted(run_dirs | set(skipped)):
        shown = _clean(run_dir.relative_to(batch_dir).as_posix()) if run_dir != batch_dir else "."
        if run_dir in skipped:
            records.append(RunRecord(run_dir, _clean(run_dir.name), "?", {}, {}, problem=_clean(skipped[run_dir]),
                                     folder=shown))
            continue
        try:
            record = load_run(run_dir)
        except (ValueError, OSError) as exc:
            from rpm_lib.json_files import read_object_or_empty

            grid = read_object_or_empty(run_dir / "run.json").get("grid", "?")
            message = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.strerror else str(exc)
            record = RunRecord(run_dir, _clean(run_dir.name), _clean(grid), {}, {},
                               problem=_clean(f"damaged: {message}"))
        record.folder = shown
        records.append(record)
    return records


# ----------------------------------------------------------------------------------------------
# Accuracies from metrics.json
# ----------------------------------------------------------------------------------------------


def _as_percent(value: Any, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{where}: accuracy must be a finite number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{where}: accuracy {value!r} is not a fraction in [0, 1]")
    return 100.0 * float(value)


def run_accuracies(metrics: Mapping[str, Any], split: str = "test", where: str = "metrics.json") -> dict[str, float]:
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


def _test_sets(metrics: Mapping[str, Any], where: str) -> list[Mapping[str, Any]]:
    """``metrics["test_sets"]`` (empty when absent), each entry checked to be an object."""
    sets = metrics.get("test_sets") or []
    if not isinstance(sets, list) or not all(isinstance(entry, Mapping) for entry in sets):
        raise ValueError(f"{where}: test_sets must be a list of objects, got {sets!r:.80}")
    return sets


def _set_accuracies(entry: Mapping[str, Any], where: str) -> tuple[float, dict[str, float]]:
    """Overall accuracy and ``run_accuracies`` (percent) of one ``test_sets`` entry."""
    where = f"{where} [test_sets {entry.get('name')}]"
    per_config = {"test_accuracy_per_configuration": entry.get("accuracy_per_configuration"),
                  "test_accuracy": entry.get("accuracy")}
    acc = run_accuracies({k: v for k, v in per_config.items() if v is not None}, "test", where)
    return _as_percent(entry.get("accuracy"), where), acc


# ----------------------------------------------------------------------------------------------
# Table 1
# ----------------------------------------------------------------------------------------------


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
        if rec.metrics is None or rec.status == "skipped":
            continue
        try:
            if rec.problem is not None or rec.conflict is not None:
                raise ValueError(rec.problem or rec.conflict)
            acc = run_accuracies(rec.metrics, split, where=str(rec.run_dir / "metrics.json"))
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
    out = {k: _clean(v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str))
           for k, v in config.items() if k not in NOT_COMPARED}
    if "dataset" in metrics:
        out["dataset"] = _clean(metrics["dataset"])
    if metrics.get("test_num_samples") is not None:
        out["test problems"] = str(metrics["test_num_samples"])
    regime = _test_regime(metrics)
    if regime is not None:
        out["test regime"] = _clean(regime)
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

    dataset = _trained_with(metrics).get("dataset", (metrics or {}).get("dataset"))
    if dataset not in (None, "iraven"):
        return False
    return _test_regime(metrics) in (None, IRAVEN.name)


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells are ``str()``-ed, ``|`` escaped, line breaks made spaces (a label
    from someone's run.json must not add a row or a column)."""
    def cell(v: Any) -> str:
        return _clean(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"markdown_table: row has {len(row)} cells, header has {len(header)}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def table1_header(with_paper: bool = True) -> list[str]:
    """Column names of ``table1_cells``."""
    head = ["Encoder", "Setup", "Group", "Seeds", "Average ± Std"]
    if with_paper:
        head += ["Paper avg ± std", "Δ avg"]
    return head + list(CONFIGURATION_COLUMNS)


def table1_cells(rows: Sequence[Table1Row], with_paper: bool = True) -> list[list[str]]:
    """Table 1 as strings. Configuration cells read ``ours`` or, with the paper, ``ours (paper)``."""
    out = []
    for r in rows:
        paper = r.paper if with_paper else None
        cells = [
            r.encoder,
            r.setup,
            ", ".join(f"{k}={v}" for k, v in sorted(r.group.items())) or "–",
            str(len(r.seeds)),
            f"{_fmt(r.average)} ± {_fmt(r.std)}",
        ]
        if with_paper:
            cells.append(f"{_fmt(paper.average)} ± {_fmt(paper.std)}" if paper else "–")
            cells.append(f"{r.average - paper.average:+.1f}" if paper else "–")
        for col in CONFIGURATION_COLUMNS:
            ours = _fmt(r.per_configuration.get(col))
            if paper is not None:
                ours += f" ({_fmt(paper.per_configuration[col])})"
            cells.append(ours)
        out.append(cells)
    return out


def table1_markdown(rows: Sequence[Table1Row], with_paper: bool = True) -> str:
    """Table 1 layout in Markdown; with the paper, each configuration cell is ``ours (paper)``."""
    note = (
        "Test accuracy (%), mean over seeds; Average ± sample std over seeds"
        + ("; paper values (Table 1 of the MLCL paper) in parentheses." if with_paper else ".")
        + "\n\n"
    )
    return note + markdown_table(table1_header(with_paper), table1_cells(rows, with_paper)) + _row_notes(rows)


def row_name(row: Table1Row) -> str:
    """``<encoder> <setup>`` and the row's group settings, e.g. ``SCL CE (lr=0.01)``: how notes and errors name a row."""
    group = ", ".join(f"{k}={v}" for k, v in sorted(row.group.items()))
    return f"{row.encoder} {row.setup}" + (f" ({group})" if group else "")


def _row_notes(rows: Sequence[Table1Row]) -> str:
    """The rows' ``notes`` as a Markdown list under the table ("" when there are none)."""
    lines = [f"- {_clean(row_name(r))}: {_clean(note)}" for r in rows for note in r.notes]
    return "\nNotes:\n\n" + "\n".join(lines) + "\n" if lines else ""


def write_table1(rows: Sequence[Table1Row], csv_path: str | Path, with_paper: bool = True) -> Path:
    """Write Table 1 as CSV with numeric columns (ours and, optionally, paper side by side)."""
    header = ["encoder", "setup", "group", "seeds", "average", "std"]
    if with_paper:
        header += ["paper_average", "paper_std"]
    for col in CONFIGURATION_COLUMNS:
        header += [col] + ([f"paper_{col}"] if with_paper else [])
    header.append("notes")
    lines = []
    for r in rows:
        line: list[Any] = [r.encoder, r.setup, ";".join(f"{k}={v}" for k, v in sorted(r.group.items())),
                           len(r.seeds), round(r.average, 4), "" if math.isnan(r.std) else round(r.std, 4)]
        if with_paper:
            line += [r.paper.average, r.paper.std] if r.paper else ["", ""]
        for col in CONFIGURATION_COLUMNS:
            v = r.per_configuration.get(col)
            line.append("" if v is None else round(v, 4))
            if with_paper:
                line.append(r.paper.per_configuration[col] if r.paper else "")
        lines.append([*line, "; ".join(r.notes)])
    return write_csv(header, lines, csv_path)


def _label_axes(records: Sequence[RunRecord]) -> list[str]:
    """Every grid axis the runs are labelled with, in order of first appearance (the table columns)."""
    return list(dict.fromkeys(k for rec in records for k in rec.labels))


def runs_table(records: Iterable[RunRecord], split: str = "test") -> tuple[list[str], list[list[Any]]]:
    """One row per run (finished, failed, pending, damaged or skipped): header and rows for CSV / display.

    Columns: ``name, grid, status``, every label axis seen, ``Average`` and the 7 configurations (percent,
    empty when not finished), ``folder`` (the run folder below the gathered one: runs copied from two machines
    share a name), and the last line of the error for failed runs (why, for damaged or skipped ones).
    """
    records = list(records)
    axes = _label_axes(records)
    header = ["name", "grid", "status", *axes, "Average", *CONFIGURATION_COLUMNS, "folder", "error"]
    rows = []
    for rec in records:
        status, acc = rec.status, {}
        err = (rec.problem or rec.conflict or rec.error or "").strip().splitlines()
        if status == "done":
            try:
                acc = run_accuracies(rec.metrics or {}, split, str(rec.run_dir / "metrics.json"))
            except ValueError as exc:  # e.g. a damaged val accuracy, with split="val"
                status, err = "damaged", [str(exc)]
        rows.append(
            [rec.name, rec.grid, status, *(rec.labels.get(a, "") for a in axes),
             *("" if acc.get(c) is None else round(acc[c], 4) for c in ["Average", *CONFIGURATION_COLUMNS]),
             rec.folder or rec.name, _clean(err[-1]) if err else ""]
        )
    return header, rows


def eval_sets_table(records: Iterable[RunRecord]) -> tuple[list[str], list[list[Any]]]:
    """One row per (finished run, evaluated set) from the runs' ``metrics.json`` ``test_sets``
    (``rpm_lib.training.eval_sets``): the "train regime x test set" view of a batch.

    Columns: ``name, grid``, every label axis seen, ``set, split, regime, distribution, num_samples``,
    ``accuracy`` (over all problems of the set), ``Average`` and the 7 configurations (percent; ``Average`` is the
    mean over the configurations present, as in Table 1, and the overall accuracy when the set has no
    per-configuration accuracy). Runs without ``test_sets`` are left out, and damaged ones (``runs_table`` and
    table1.md name them).
    """
    records = [r for r in records if r.status == "done" and r.metrics is not None and r.metrics.get("test_sets")]
    axes = _label_axes(records)
    header = ["name", "grid", *axes, "set", "split", "regime", "distribution", "num_samples", "accuracy",
              "Average", *CONFIGURATION_COLUMNS]
    rows = []
    for rec in records:
        where = str(rec.run_dir / "metrics.json")
        for entry in _test_sets(rec.metrics or {}, where):
            overall, acc = _set_accuracies(entry, where)
            rows.append([rec.name, rec.grid, *(rec.labels.get(a, "") for a in axes),
                         *(_clean(entry.get(k) or "") for k in ("name", "split", "regime", "distribution")),
                         entry.get("num_samples"), round(overall, 4),
                         *("" if acc.get(c) is None else round(acc[c], 4)
                           for c in ["Average", *CONFIGURATION_COLUMNS])])
    return header, rows


def spreadsheet_safe(value: Any) -> Any:
    """``value`` for a CSV cell that a spreadsheet opens as text, never as a formula: a text starting with ``=``,
    ``+``, ``-``, ``@``, a tab or a carriage return (a label from someone's run.json, ``=HYPERLINK(...)``) gets a
    leading ``'``; numbers, and texts that read as numbers (``-0.5``), are left as they are."""
    if not isinstance(value, str) or not value or value[0] not in "=+-@\t\r":
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def write_csv(header: Sequence[str], rows: Iterable[Sequence[Any]], path: str | Path) -> Path:
    """Write ``header`` + ``rows`` as CSV (creating the parent folder); texts through ``spreadsheet_safe``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8", errors="backslashreplace") as fh:
        writer = csv.writer(fh)
        writer.writerow([spreadsheet_safe(v) for v in header])
        writer.writerows([spreadsheet_safe(v) for v in row] for row in rows)
    return path


# ----------------------------------------------------------------------------------------------
# Ablations
# ----------------------------------------------------------------------------------------------


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
        if rec.metrics is None or rec.status == "skipped" or parameter not in rec.labels:
            continue
        if rec.problem is not None:
            raise ValueError(rec.problem)
        if rec.conflict is not None:  # its numbers are not those of the parameter value it is labelled with
            raise ValueError(rec.conflict)
        if parameter not in rec.parameters:
            raise ValueError(f"{rec.run_dir}: label '{parameter}' has no parameter of that name in run.json")
        value = rec.parameters[parameter]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{rec.run_dir / 'run.json'}: parameter '{parameter}' must be a number, got {value!r:.80}")
        value = float(value)
        others = [f"{k}={v}" for k, v in sorted(rec.labels.items()) if k not in ("encoder", "setup", "seed", parameter)]
        key = " ".join([canonical_encoder(rec.encoder), canonical_setup(rec.setup), *others])
        acc = run_accuracies(rec.metrics, split, str(rec.run_dir / "metrics.json"))["Average"]
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


# ----------------------------------------------------------------------------------------------
# A batch folder's tables
# ----------------------------------------------------------------------------------------------


def table1_records(records: Sequence[RunRecord], main_grid: str | None = "main") -> list[RunRecord]:
    """The runs Table 1 is made of: those of ``main_grid`` (every run when it is empty / ``None`` or when no
    run belongs to it, e.g. a folder of single runs)."""
    if not main_grid:
        return list(records)
    return [r for r in records if r.grid == main_grid] or list(records)


def left_out_markdown(records: Sequence[RunRecord], excluded: Sequence[tuple[RunRecord, str]]) -> str:
    """A Markdown list of the runs among ``records`` that Table 1 does not count, with why ("" when none)."""
    from rpm_lib.json_files import read_object_or_empty

    why = {id(rec): reason for rec, reason in excluded}
    lines = []
    for rec in records:
        if id(rec) in why:
            reason = why[id(rec)]
        elif rec.status == "pending":
            progress = read_object_or_empty(rec.run_dir / "progress.json").get("status")
            reason = ("unfinished (progress.json): run it again to continue" if progress == "unfinished"
                      else "not finished (no metrics.json yet)")
        elif rec.status == "failed":
            last = (rec.error or "").strip().splitlines()
            reason = "failed: " + (last[-1] if last else "see error.txt")
        elif rec.status in ("damaged", "skipped"):
            reason = rec.problem or rec.status
        else:
            continue
        lines.append(f"- {_clean(rec.folder or rec.name)}: {_clean(reason)}")
    if not lines:
        return ""
    return f"\nNot in the table ({len(lines)} run{'s' if len(lines) > 1 else ''}):\n\n" + "\n".join(lines) + "\n"


def table1_and_left_out(records: Sequence[RunRecord], main_grid: str | None = "main") -> tuple[list[Table1Row], str]:
    """Table 1 of ``table1_records(records, main_grid)``, and the Markdown list (``left_out_markdown``) of every
    run it does not count: unfinished, failed, damaged, skipped, or contradicting its run.json. What ``table1.md``
    and the report notebook show, so that no run leaves the table without a word."""
    excluded: list[tuple[RunRecord, str]] = []
    candidates = table1_records(records, main_grid)
    table = table1(candidates, excluded=excluded)
    # damaged or linked folders of unknown grid are named too: which grid they were is what cannot be read
    unknown = [r for r in records if r.status in ("damaged", "skipped") and r not in candidates]
    return table, left_out_markdown(candidates + unknown, excluded)


def write_tables(records: Sequence[RunRecord], out_dir: str | Path, main_grid: str | None = "main",
                 with_paper: bool = True) -> dict[str, Path]:
    """Write ``results.csv`` (one row per run), ``table1.csv`` and ``table1.md`` (Table 1 of
    :func:`table1_records`, beside the published numbers when ``with_paper``) into ``out_dir``.

    With runs that report ``test_sets`` (every run of a current ``rpm_lib.training``) also ``test_sets.csv``
    (:func:`eval_sets_table`).

    One run never stops the tables: a damaged run is left out of Table 1, and table1.md names under the table
    every run of Table 1's grid that it leaves out (unfinished, failed, damaged, a symbolic link), and why: a
    row of 3 seeds where 4 were planned must say so where it is read.

    Returns:
        ``{"results_csv", "table1_csv", "table1_md"}`` (+ ``"test_sets_csv"``) -> the paths written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header, rows = runs_table(records)
    table, left_out = table1_and_left_out(records, main_grid)
    md = out_dir / "table1.md"
    md.write_text(table1_markdown(table, with_paper=with_paper) + left_out, encoding="utf-8",
                  errors="backslashreplace")
    paths = {"results_csv": write_csv(header, rows, out_dir / "results.csv"),
             "table1_csv": write_table1(table, out_dir / "table1.csv", with_paper=with_paper), "table1_md": md}
    sets_header, sets_rows = eval_sets_table(records)
    if sets_rows:
        paths["test_sets_csv"] = write_csv(sets_header, sets_rows, out_dir / "test_sets.csv")
    return paths
