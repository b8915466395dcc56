"""Reading run folders back: one folder into a ``RunRecord`` (``load_run``), every one below a folder (``load_runs``).

A *run folder* (``rpm_lib.run_folder``) holds, for this module: ``run.json`` (written by ``rpm-batch`` before the
run: ``{"name", "grid", "labels", "parameters"}``, ``labels`` mapping each grid axis such as ``encoder``,
``setup`` or ``seed`` to the label of its value), ``metrics.json`` (written by training; its presence means
"finished"), ``config.yaml`` and ``error.txt`` (why a batch cell failed).

Run folders come from other machines and other people, so nothing in them is trusted: a folder whose records
cannot be read gets the status ``damaged: <file>: <why>``, a symbolic link to a run folder is not followed
(``skipped: ...``), and a finished run whose ``metrics.json`` trained with another setting than its ``run.json`` or
``config.yaml`` asks for keeps the status ``done`` with a ``conflict``, which the tables refuse.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpm_lib.typed_values import load_yaml_file_text
from rpm_lib.json_files import read_object, read_object_or_empty
from rpm_lib.results.accuracies import recorded_test_sets, run_accuracies, set_accuracies
from rpm_lib.results.paper import ENCODER_NAMES, SETUP_LABELS, canonical_encoder, canonical_setup
# NOT_COMPARED: TrainConfig fields that say how or where a run ran, not what it trained (its field metadata):
# run.json may differ from metrics.json there, and they separate no Table 1 rows; every other field must agree.
from rpm_lib.training.config import NOT_COMPARED
from rpm_lib.run_folder import CONFIG, ERROR, METRICS, RUN_RECORD, RunStatus, find_run_folders


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
            return RunStatus.DONE
        return RunStatus.FAILED if self.error is not None else RunStatus.PENDING

    def _recorded(self, key: str) -> str:
        """A label, else the run.json parameter, else what metrics.json says the run trained with, else ``?``
        (a grid that leaves ``encoder`` to the template's default labels no encoder)."""
        if key in self.labels:
            return self.labels[key]
        if key in self.parameters:
            return str(self.parameters[key])
        trained = trained_with(self.metrics)
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
            return f"{canonical_setup(name)} ({clean_text(self.protocol)})"
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

def clean_text(text: Any) -> str:
    """``text`` fit for one table cell and a UTF-8 file: bytes of a folder name that are not UTF-8, or a lone
    surrogate spelled in JSON (``"\\udcff"``), shown escaped; line breaks and other control characters as spaces
    (a label with a line break split its table1.md row in two)."""
    text = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    return re.sub(r"[\x00-\x1f\x7f\u2028\u2029]", " ", text)


def _read_json(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    if size > MAX_RECORD_BYTES:
        raise ValueError(f"{path}: {size / 2**20:.0f} MiB, more than a run's record can be "
                         f"({MAX_RECORD_BYTES / 2**20:.0f} MiB); not read")
    return read_object(path)


def trained_with(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
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
                   metrics: Mapping[str, Any], source: str = RUN_RECORD) -> str | None:
    """Why ``metrics.json`` is not the result of the run ``source`` (``run.json``'s labels and parameters, or the
    run's ``config.yaml``) describes, or None.

    E.g. the batch YAML's ``lr`` changed and the batch was run again: finished runs are skipped, their run.json
    rewritten with the new parameters, their metrics.json still those of the old ``lr``; or a metrics.json copied
    into another seed's folder. Labels are checked where they name a known encoder / setup or a seed number (a grid
    may label values with any text)."""
    trained = trained_with(metrics)
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
            return (f"{run_dir / METRICS}: trained with {key}={trained[key]!r}, but {run_dir / source} "
                    f"asks for {key}={value!r} (results of an earlier run in this folder, or a copied file?)")
    return None


def _config_yaml(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` (written when training starts, kept with a finished run's results), or ``{}`` when
    it is absent or unreadable: it only serves to check ``metrics.json`` (``_contradiction``), the numbers come from
    ``metrics.json``. ``yaml.safe_load``: a shared folder's file must not build Python objects."""
    import yaml

    path = run_dir / CONFIG
    try:
        if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            return {}
        value = load_yaml_file_text(path.read_text())
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
    for entry in recorded_test_sets(metrics, where):
        set_accuracies(entry, where)


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
    info = _read_json(run_dir / RUN_RECORD) if (run_dir / RUN_RECORD).is_file() else {}
    for key in ("labels", "parameters"):
        if not isinstance(info.get(key, {}), dict):
            raise ValueError(f"{run_dir / RUN_RECORD}: '{key}' must be an object, got {type(info[key]).__name__}")
    odd = [k for k, v in info.get("labels", {}).items() if isinstance(v, (list, dict))]
    if odd:
        raise ValueError(f"{run_dir / RUN_RECORD}: label '{odd[0]}' must be a text or a number")
    metrics = _read_json(run_dir / METRICS) if (run_dir / METRICS).is_file() else None
    # error.txt holds a notebook's traceback, whose bytes need not be UTF-8
    error = (run_dir / ERROR).read_bytes().decode("utf-8", "replace") if (run_dir / ERROR).is_file() else None
    parameters = dict(info.get("parameters", {}))
    if not parameters and metrics is not None and isinstance(metrics.get("config"), dict):
        parameters = dict(metrics["config"])
    labels = {clean_text(k): clean_text(v) for k, v in info.get("labels", {}).items()}
    problem = conflict = None
    if metrics is not None:
        try:
            _check_metrics(metrics, str(run_dir / METRICS))
        except ValueError as exc:
            problem = str(exc)
        conflict = (_contradiction(run_dir, labels, dict(info.get("parameters", {})), metrics)
                    or _contradiction(run_dir, {}, _config_yaml(run_dir), metrics, source=CONFIG))
    return RunRecord(
        run_dir=run_dir,
        name=clean_text(info.get("name", run_dir.name)),
        grid=clean_text(info.get("grid", "main")),
        labels=labels,
        parameters=parameters,
        metrics=metrics,
        error=error,
        problem=None if problem is None else clean_text(f"damaged: {problem}"),
        folder=clean_text(run_dir.name),
        conflict=None if conflict is None else clean_text(conflict),
    )


#: ``problem`` of a symbolic link to a run folder (``load_runs`` does not follow links, as ``rpm-batch progress``).
SYMLINK_PROBLEM = "skipped: a symbolic link (not followed; copy the run folder here to count it)"


def load_runs(batch_dir: str | Path) -> list[RunRecord]:
    """Every run folder below ``batch_dir`` (a folder holding one of ``rpm_lib.run_folder.RUN_RECORDS``), sorted by
    path.

    One folder never stops the others: a folder whose records cannot be read is returned with the status
    ``damaged`` (``problem`` says which file and why); a symbolic link to a run folder (links in a shared folder may
    lead anywhere, or loop) and a folder that cannot be listed (its permissions) with the status ``skipped``, so
    that tables name them instead of losing them (``Path.rglob`` passes both over without a word).
    """
    batch_dir = Path(batch_dir)
    if not batch_dir.is_dir():
        raise FileNotFoundError(f"batch folder {batch_dir} does not exist")
    found = find_run_folders(batch_dir)  # links are not followed
    skipped: dict[Path, str] = dict.fromkeys(found.links, SYMLINK_PROBLEM)
    for folder, why in found.unlisted.items():
        skipped[folder] = f"skipped: {folder}: cannot be listed ({why}); no run below it is counted"
    records = []
    for run_dir in sorted(set(found.runs) | set(skipped)):
        shown = clean_text(run_dir.relative_to(batch_dir).as_posix()) if run_dir != batch_dir else "."
        if run_dir in skipped:
            records.append(RunRecord(run_dir, clean_text(run_dir.name), "?", {}, {},
                                     problem=clean_text(skipped[run_dir]), folder=shown))
            continue
        try:
            record = load_run(run_dir)
        except (ValueError, OSError) as exc:
            grid = read_object_or_empty(run_dir / RUN_RECORD).get("grid", "?")
            message = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.strerror else str(exc)
            record = RunRecord(run_dir, clean_text(run_dir.name), clean_text(grid), {}, {},
                               problem=clean_text(f"damaged: {message}"))
        record.folder = shown
        records.append(record)
    return records
