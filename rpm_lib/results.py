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
"""
from __future__ import annotations

import csv
import math
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
    """

    run_dir: Path
    name: str
    grid: str
    labels: dict[str, str]
    parameters: dict[str, Any]
    metrics: dict[str, Any] | None = None
    error: str | None = None

    @property
    def status(self) -> str:
        """``"done"`` (metrics present), ``"failed"`` (error recorded) or ``"pending"``."""
        if self.metrics is not None:
            return "done"
        return "failed" if self.error is not None else "pending"

    @property
    def encoder(self) -> str:
        return str(self.labels.get("encoder", self.parameters.get("encoder", "?")))

    @property
    def setup(self) -> str:
        """The setup label; ``+FT`` appended for a run whose final weights were fine-tuned (metrics.json
        ``protocol``), so a fine-tuned MLCL run never lands in (or is compared with) a linear-evaluation row."""
        name = str(self.labels.get("setup", self.parameters.get("setup", "?")))
        if self.protocol == "fine_tuned" and not canonical_setup(name).endswith("+FT"):
            return f"{name}+FT"
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
        return str(self.labels.get("seed", self.parameters.get("seed", "?")))


def _read_json(path: Path) -> dict[str, Any]:
    from rpm_lib.json_files import read_object

    return read_object(path)


def load_run(run_dir: str | Path) -> RunRecord:
    """Read one run folder (see the module docstring for its files).

    A folder without ``run.json`` (e.g. a single ``rpm-train`` / ``03_train`` run) is accepted: its labels
    are then taken from ``config.yaml`` / ``metrics.json`` when present, else left empty.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    info = _read_json(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    metrics = _read_json(run_dir / "metrics.json") if (run_dir / "metrics.json").is_file() else None
    error = (run_dir / "error.txt").read_text() if (run_dir / "error.txt").is_file() else None
    parameters = dict(info.get("parameters", {}))
    if not parameters and metrics is not None and isinstance(metrics.get("config"), dict):
        parameters = dict(metrics["config"])
    labels = {str(k): str(v) for k, v in info.get("labels", {}).items()}
    return RunRecord(
        run_dir=run_dir,
        name=str(info.get("name", run_dir.name)),
        grid=str(info.get("grid", "main")),
        labels=labels,
        parameters=parameters,
        metrics=metrics,
        error=error,
    )


def load_runs(batch_dir: str | Path) -> list[RunRecord]:
    """Every run folder below ``batch_dir`` (a folder holding ``run.json`` or ``metrics.json``), sorted by path."""
    batch_dir = Path(batch_dir)
    if not batch_dir.is_dir():
        raise FileNotFoundError(f"batch folder {batch_dir} does not exist")
    run_dirs = {p.parent for pattern in ("run.json", "metrics.json") for p in batch_dir.rglob(pattern)}
    return [load_run(d) for d in sorted(run_dirs)]


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
        paper: the published row, when the paper has one and every run is on I-RAVEN (not another regime).
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


def table1(records: Iterable[RunRecord], split: str = "test") -> list[Table1Row]:
    """Aggregate finished runs into Table 1 rows (ordered like the paper: SCL, HriNet, CoPINet, WReN; CE..MLCL+AUG).

    Runs are grouped by encoder, setup and every other label except ``seed``; failed or pending runs are
    skipped (they are listed by ``runs_table``).
    """
    groups: dict[tuple, list[tuple[RunRecord, dict[str, float]]]] = {}
    for rec in records:
        if rec.metrics is None:
            continue
        acc = run_accuracies(rec.metrics, split, where=str(rec.run_dir / "metrics.json"))
        others = tuple(sorted((k, v) for k, v in rec.labels.items() if k not in ("encoder", "setup", "seed")))
        key = (canonical_encoder(rec.encoder), canonical_setup(rec.setup), others)
        groups.setdefault(key, []).append((rec, acc))
    rows = []
    for (encoder, setup, others), members in groups.items():
        averages = [acc["Average"] for _, acc in members]
        mean, std = _mean_std(averages)
        per_config = {}
        for col in CONFIGURATION_COLUMNS:
            vals = [acc[col] for _, acc in members if col in acc]
            if vals:
                per_config[col] = sum(vals) / len(vals)
        rows.append(
            Table1Row(
                encoder=encoder,
                setup=setup,
                group=dict(others),
                seeds=[rec.seed for rec, _ in members],
                average=mean,
                std=std,
                per_configuration=per_config,
                # The published numbers are I-RAVEN's: no comparison for runs trained on another regime.
                paper=paper_row(encoder, setup) if all(_on_iraven(rec.metrics) for rec, _ in members) else None,
                runs=[rec.name for rec, _ in members],
            )
        )
    rows.sort(key=lambda r: (_order_key(r.encoder, r.setup), sorted(r.group.items())))
    return rows


def _on_iraven(metrics: Mapping[str, Any] | None) -> bool:
    """Whether a run's data is (or may be) plain I-RAVEN: its main test set's regime (``test_sets``, from the
    data's ``regime.json``) is I-RAVEN or not recorded."""
    from rpm_lib.generator.regimes import IRAVEN

    for entry in (metrics or {}).get("test_sets") or []:
        if isinstance(entry, Mapping) and entry.get("name") == "test":
            return entry.get("regime") in (None, IRAVEN.name)
    return True


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells are ``str()``-ed, ``|`` escaped."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|")

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
    return note + markdown_table(table1_header(with_paper), table1_cells(rows, with_paper))


def write_table1(rows: Sequence[Table1Row], csv_path: str | Path, with_paper: bool = True) -> Path:
    """Write Table 1 as CSV with numeric columns (ours and, optionally, paper side by side)."""
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    header = ["encoder", "setup", "group", "seeds", "average", "std"]
    if with_paper:
        header += ["paper_average", "paper_std"]
    for col in CONFIGURATION_COLUMNS:
        header += [col] + ([f"paper_{col}"] if with_paper else [])
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
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
            writer.writerow(line)
    return csv_path


def _label_axes(records: Sequence[RunRecord]) -> list[str]:
    """Every grid axis the runs are labelled with, in order of first appearance (the table columns)."""
    return list(dict.fromkeys(k for rec in records for k in rec.labels))


def runs_table(records: Iterable[RunRecord], split: str = "test") -> tuple[list[str], list[list[Any]]]:
    """One row per run (finished, failed or pending): header and rows for CSV / display.

    Columns: ``name, grid, status``, every label axis seen, ``Average`` and the 7 configurations (percent,
    empty when not finished), and the first line of the error for failed runs.
    """
    records = list(records)
    axes = _label_axes(records)
    header = ["name", "grid", "status", *axes, "Average", *CONFIGURATION_COLUMNS, "error"]
    rows = []
    for rec in records:
        acc = run_accuracies(rec.metrics, split, str(rec.run_dir / "metrics.json")) if rec.metrics else {}
        err = (rec.error or "").strip().splitlines()
        rows.append(
            [rec.name, rec.grid, rec.status, *(rec.labels.get(a, "") for a in axes),
             *("" if acc.get(c) is None else round(acc[c], 4) for c in ["Average", *CONFIGURATION_COLUMNS]),
             err[-1] if err else ""]
        )
    return header, rows


def eval_sets_table(records: Iterable[RunRecord]) -> tuple[list[str], list[list[Any]]]:
    """One row per (finished run, evaluated set) from the runs' ``metrics.json`` ``test_sets``
    (``rpm_lib.training.eval_sets``): the "train regime x test set" view of a batch.

    Columns: ``name, grid``, every label axis seen, ``set, split, regime, distribution, num_samples``,
    ``accuracy`` (over all problems of the set), ``Average`` and the 7 configurations (percent; ``Average`` is the
    mean over the configurations present, as in Table 1, and the overall accuracy when the set has no
    per-configuration accuracy). Runs without ``test_sets`` are left out.
    """
    records = [r for r in records if r.metrics is not None and r.metrics.get("test_sets")]
    axes = _label_axes(records)
    header = ["name", "grid", *axes, "set", "split", "regime", "distribution", "num_samples", "accuracy",
              "Average", *CONFIGURATION_COLUMNS]
    rows = []
    for rec in records:
        for entry in rec.metrics["test_sets"]:  # type: ignore[index]
            where = f"{rec.run_dir / 'metrics.json'} [test_sets {entry.get('name')}]"
            per_config = {"test_accuracy_per_configuration": entry.get("accuracy_per_configuration"),
                          "test_accuracy": entry.get("accuracy")}
            acc = run_accuracies({k: v for k, v in per_config.items() if v is not None}, "test", where)
            rows.append([rec.name, rec.grid, *(rec.labels.get(a, "") for a in axes), entry.get("name"),
                         entry.get("split"), entry.get("regime") or "", entry.get("distribution"),
                         entry.get("num_samples"), round(_as_percent(entry.get("accuracy"), where), 4),
                         *("" if acc.get(c) is None else round(acc[c], 4)
                           for c in ["Average", *CONFIGURATION_COLUMNS])])
    return header, rows


def write_csv(header: Sequence[str], rows: Iterable[Sequence[Any]], path: str | Path) -> Path:
    """Write ``header`` + ``rows`` as CSV (creating the parent folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
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
    keyed ``"<Encoder> <Setup>"`` (plus other labels) and sorted by the parameter value.
    """
    buckets: dict[str, dict[float, list[float]]] = {}
    for rec in records:
        if rec.metrics is None or parameter not in rec.labels:
            continue
        if parameter not in rec.parameters:
            raise ValueError(f"{rec.run_dir}: label '{parameter}' has no parameter of that name in run.json")
        value = float(rec.parameters[parameter])
        others = [f"{k}={v}" for k, v in sorted(rec.labels.items()) if k not in ("encoder", "setup", "seed", parameter)]
        key = " ".join([canonical_encoder(rec.encoder), canonical_setup(rec.setup), *others])
        acc = run_accuracies(rec.metrics, split, str(rec.run_dir / "metrics.json"))["Average"]
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


def write_tables(records: Sequence[RunRecord], out_dir: str | Path, main_grid: str | None = "main",
                 with_paper: bool = True) -> dict[str, Path]:
    """Write ``results.csv`` (one row per run), ``table1.csv`` and ``table1.md`` (Table 1 of
    :func:`table1_records`, beside the published numbers when ``with_paper``) into ``out_dir``.

    With runs that report ``test_sets`` (every run of a current ``rpm_lib.training``) also ``test_sets.csv``
    (:func:`eval_sets_table`).

    Returns:
        ``{"results_csv", "table1_csv", "table1_md"}`` (+ ``"test_sets_csv"``) -> the paths written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header, rows = runs_table(records)
    table = table1(table1_records(records, main_grid))
    md = out_dir / "table1.md"
    md.write_text(table1_markdown(table, with_paper=with_paper))
    paths = {"results_csv": write_csv(header, rows, out_dir / "results.csv"),
             "table1_csv": write_table1(table, out_dir / "table1.csv", with_paper=with_paper), "table1_md": md}
    sets_header, sets_rows = eval_sets_table(records)
    if sets_rows:
        paths["test_sets_csv"] = write_csv(sets_header, sets_rows, out_dir / "test_sets.csv")
    return paths
