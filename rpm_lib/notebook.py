"""What notebooks share beyond figures: showing and saving figures and tables into ``output_dir``, paths
relative to the project, percent formatting, loading (or generating) the data a notebook explores, and the
reports that set a run's or a shipped model's accuracies beside their references (a table and its bar chart).

Notebooks are thin drivers: a typed ``parameters`` cell, then calls into this module, :mod:`rpm_lib.viz` and
the library; :func:`show` saves a PNG when ``output_dir`` is set, displays the figure and closes it.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from rpm_lib import rules
from rpm_lib.json_files import read_object, shown_value
from rpm_lib.results import markdown_table, write_csv
from rpm_lib.run_folder import CONFIG, METRICS, PREDICTIONS


def save_figure(fig: Figure, output_dir: str | Path | None, name: str, dpi: int = 100) -> Path | None:
    """Write ``fig`` as ``<output_dir>/<name>.png`` (folder created); nothing when ``output_dir`` is empty."""
    if not output_dir:
        return None
    path = Path(output_dir) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def show(fig: Figure, output_dir: str | Path | None = None, name: str | None = None) -> None:
    """Save (when ``output_dir`` and ``name`` are given), display inline and close ``fig``.

    Closing matters: the inline backend would otherwise display a pyplot-managed figure a second time.
    Returns nothing, so a notebook cell ending with ``show(...)`` prints no path.
    """
    from IPython.display import display

    if name:
        save_figure(fig, output_dir, name)
    display(fig)
    plt.close(fig)


def save_table(header: Sequence[str], rows: Iterable[Sequence[Any]], output_dir: str | Path | None,
               name: str) -> tuple[Path, Path] | None:
    """Write ``<name>.csv`` and ``<name>.md`` into ``output_dir`` (nothing when it is empty)."""
    if not output_dir:
        return None
    rows = [list(r) for r in rows]
    csv_path = write_csv(header, rows, Path(output_dir) / f"{name}.csv")
    md_path = csv_path.with_suffix(".md")
    md_path.write_text(markdown_table(header, rows))
    return csv_path, md_path


def project_root(start: str | Path | None = None) -> Path:
    """The first folder at or above ``start`` (default: the working directory) holding ``pyproject.toml``.

    Notebooks opened from ``notebooks/`` run with that folder as working directory; resolving relative paths
    against the project root makes ``data/…`` and ``runs/…`` mean the same thing there, under papermill and
    in ``rpm-batch``. Falls back to ``start`` itself when no ancestor has ``pyproject.toml``.
    """
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return here


def resolve_path(path: str | Path, root: str | Path | None = None) -> Path:
    """``path`` if absolute, else ``project_root(root) / path``."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else project_root(root) / p


def format_percent(value: float | None, digits: int = 1) -> str:
    """``87.25 -> "87.2"``; ``None``/NaN -> ``"–"``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def load_or_generate(data_root: str, split: str, *, sample_root: str = "data/notebook-sample",
                     sample_per_config: int = 20, sample_seed: int = 0, sample_mode: str = "balanced",
                     configurations: Sequence[str] | None = None, image_size: int = 160,
                     answer_order: str = "none", progress: bool = True) -> Any:
    """A ``RavenDataset`` of ``data_root``; when ``data_root`` is empty, of a small generated sample set.

    The sample set (``sample_per_config`` problems per configuration, split by ``k % 10``) is written to
    ``sample_root`` with ``rpm_lib.generator.writer.write_dataset`` — resumable and deterministic (problem
    ``k`` depends only on the seed, the configuration and ``k``), so a second call reuses the files. Relative
    paths are relative to the project root (``resolve_path``). ``answer_order="none"`` keeps file order.
    """
    from rpm_lib.data import RavenDataset

    if data_root:
        root = resolve_path(data_root)
    else:
        from rpm_lib.generator.writer import write_dataset

        root = resolve_path(sample_root)
        # A progress bar while generating (seconds of silence otherwise); none when the sample exists.
        write_dataset(root, list(rules.CONFIGURATIONS), count=sample_per_config, seed=sample_seed,
                      mode=sample_mode, write_xml=False, progress=progress)
    return RavenDataset(root, split, configurations=configurations or None, image_size=image_size,
                        answer_order=answer_order)


# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------


@dataclass
class RunFiles:
    """What one finished training run folder holds, loaded.

    Attributes:
        path: the run folder.
        config: its ``config.yaml`` as a ``TrainConfig``.
        metrics: its ``metrics.json``.
        predictions: its ``predictions.npz`` as ``{key: array}`` (``target``, ``predicted``, ``index``, ``scores``,
            ``rules`` / ``rule_logits`` when the run has a rule head, ...), or ``None`` when it was not saved.
    """

    path: Path
    config: Any
    metrics: dict[str, Any]
    predictions: dict[str, Any] | None


#: The types of the ``metrics.json`` fields the notebooks read, where present (``rpm_lib.training`` writes them so).
METRICS_TYPES: dict[str, type | tuple[type, ...]] = {
    "encoder": str, "setup": str, "setup_label": str, "dataset": str, "config": dict, "stages": list,
    "test_sets": list,
    **{f"{split}_{name}": kind for split in ("val", "test") for name, kind in (
        ("accuracy", (int, float)), ("loss", (int, float)), ("num_samples", int), ("accuracy_per_configuration", dict),
        ("accuracy_per_configuration_short", dict), ("num_samples_per_configuration", dict),
        ("accuracy_per_regime", dict), ("rules", dict))},
}


def _check_metric_tables(metrics: dict[str, Any], path: Path) -> None:
    """Refuse a per-configuration or per-regime table of ``metrics`` whose keys are not the group names or whose
    values are not numbers (they are plotted and summed: a text "0.5" would print as a 50-fold repetition)."""
    names = {"accuracy_per_configuration": rules.CONFIGURATIONS, "num_samples_per_configuration": rules.CONFIGURATIONS,
             "accuracy_per_configuration_short": tuple(rules.SHORT_NAMES.values()),
             "accuracy_per_regime": rules.PGM_REGIMES}
    for split in ("val", "test"):
        for name, known in names.items():
            field = f"{split}_{name}"
            for key, value in metrics.get(field, {}).items():
                if key not in known or isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{path}: field {field!r}: entry {shown_value(key)} must be one of "
                                     f"{list(known)} with a number, got {shown_value(value, 40)}")


def open_run(run_dir: str | Path) -> RunFiles:
    """Load a finished run folder (``run_dir`` relative to the project root or absolute).

    Raises:
        FileNotFoundError: the folder, its ``config.yaml`` or its ``metrics.json`` (the run has not finished)
        is missing; the message names the file.
        ValueError: a ``metrics.json`` that is not a JSON object of the fields training writes (over
            ``rpm_lib.json_files.MAX_BYTES``, nested deeper than a record, a field of another type: one line
            naming the file and the field).
    """
    import numpy as np

    from rpm_lib.training import TrainConfig

    path = resolve_path(run_dir)
    for name in (CONFIG, METRICS):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path / name}: missing (is {path} a finished run folder?)")
    predictions_path = path / PREDICTIONS
    predictions = None
    if predictions_path.is_file():
        with np.load(predictions_path, allow_pickle=False) as data:
            predictions = {key: data[key] for key in data.files}
    metrics = read_object(path / METRICS, ValueError, fields=METRICS_TYPES)
    _check_metric_tables(metrics, path / METRICS)
    return RunFiles(path, TrainConfig.from_yaml(path / CONFIG), metrics, predictions)


def accuracy_report(metrics: dict[str, Any], config: Any, output_dir: str | Path | None = None,
                    name: str = "accuracy") -> None:
    """Show a run's test accuracy per configuration beside the paper's row (table and bar chart, both saved into
    ``output_dir`` as ``<name>.csv/.md/.png``), or per regime for PGM."""
    from IPython.display import Markdown, display

    from rpm_lib import results
    from rpm_lib.viz import plot_accuracy_bars

    if config.dataset != "iraven":
        rows = [[k, format_percent(100 * v)] for k, v in metrics.get("test_accuracy_per_regime", {}).items()]
        save_table(["regime", "accuracy (%)"], rows, output_dir, name)
        display(Markdown(markdown_table(["regime", "accuracy (%)"], rows)))
        return
    accuracy = results.run_accuracies(metrics)
    counts = {rules.SHORT_NAMES[k]: n for k, n in metrics.get("test_num_samples_per_configuration", {}).items()}
    counts["Average"] = metrics.get("test_num_samples", "?")
    paper = results.paper_row(config.encoder, config.setup)
    reference = {"Average": paper.average, **paper.per_configuration} if paper else {}
    header = ["configuration", "problems", "accuracy (%)", "paper (%)"]
    rows = [[k, counts.get(k, "?"), format_percent(v), format_percent(reference.get(k))] for k, v in accuracy.items()]
    save_table(header, rows, output_dir, name)
    display(Markdown(markdown_table(header, rows)))
    show(plot_accuracy_bars(accuracy, reference or None, title=f"{config.encoder} · {config.setup}"), output_dir, name)


# ----------------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------------


#: Names papermill itself may inject besides the notebook's parameters (``--inject-paths`` and friends).
PAPERMILL_NAMES = frozenset({"PAPERMILL_INPUT_PATH", "PAPERMILL_OUTPUT_PATH"})


def check_parameters(namespace: dict[str, Any], non_finite: Collection[str] = ()) -> None:
    """Give every parameter of a notebook the type its line in the ``parameters`` cell declares, and refuse
    parameters the notebook does not declare.

    papermill's ``-p name value`` passes a list or ``None`` as text: ``-p recipes '[official]'`` arrives as the
    string ``"[official]"``, which a loop would read letter by letter. Text given to a parameter that is not
    declared ``str`` is read as YAML (a comma-separated list for ``list[...]``); anything that still does not fit
    stops the notebook with one line naming the parameter and its type: text that is not YAML (``[a, b``), a
    YAML tag (``!foo bar``), or a non-finite float (``nan``, ``inf``) unless the parameter is named in
    ``non_finite``. Call it with ``globals()`` right after the parameters (``__annotations__`` holds the declared
    types), in the cell that follows the ``parameters`` cell.

    Misspelled names: papermill warns about an unknown ``-p`` name only in its log and assigns it anyway, in the
    cell it injects (tagged ``injected-parameters``, source ``# Parameters`` then one ``name = value`` line per
    parameter) between the ``parameters`` cell and this call. IPython keeps every executed cell's source in
    ``In`` (``_ih``), so the cell before the current one is that injected cell exactly when papermill injected
    one; every name it assigns must be declared (or be one of ``PAPERMILL_NAMES``).

    Args:
        non_finite: parameters (declared ``float`` or holding floats) that accept ``nan`` / ``inf``, e.g.
            ``check_parameters(globals(), non_finite={"time_limit"})`` where ``inf`` means "no limit".

    Raises:
        ParameterError: a ``ValueError`` that a kernel shows as its one line, without a traceback, e.g.
            ``parameter 'ablations': expected list[str], got 3 (int)``;
            ``parameter 'threshold': must be a finite number, got nan``;
            ``parameter 'treshold' (did you mean 'threshold'?): not a parameter of this notebook, whose
            parameters are: ...`` (one line).
    """
    try:
        _check_parameters(namespace, non_finite)
    except ValueError as error:
        raise ParameterError(str(error)) from None


class ParameterError(ValueError):
    """A notebook parameter that does not fit its declaration. IPython shows it as its one line, not as a traceback
    into this module: the mistake is the user's and the line says all there is (papermill prints what the kernel
    shows above its own error)."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook for an exception's own traceback text
        return [f"ValueError: {self}"]


def _check_parameters(namespace: dict[str, Any], non_finite: Collection[str]) -> None:
    from rpm_lib import typed_values

    annotations = namespace.get("__annotations__", {})
    undeclared = sorted(set(non_finite) - set(annotations))
    if undeclared:
        raise ValueError(f"check_parameters(non_finite=...): {', '.join(map(repr, undeclared))} "
                         f"{'is' if len(undeclared) == 1 else 'are'} not declared in the parameters cell")
    unknown = [name for name in _injected_names(namespace) if name not in annotations and name not in PAPERMILL_NAMES]
    if unknown:
        known = sorted(annotations)
        shown = ", ".join(f"{name!r}{_did_you_mean(name, known)}" for name in unknown)
        what = "a parameter" if len(unknown) == 1 else "parameters"
        raise ValueError(f"parameter{'s' if len(unknown) > 1 else ''} {shown}: not {what} of this notebook, "
                         f"whose parameters are: {', '.join(known)}")
    for name, annotation in annotations.items():
        if name not in namespace:
            continue
        value = namespace[name]
        if isinstance(value, str) and annotation is not str:
            value = typed_values.from_text(value)
        namespace[name] = typed_values.coerce(name, value, annotation, what="parameter",
                                              allow_non_finite=name in non_finite)


def _injected_names(namespace: dict[str, Any]) -> list[str]:
    """Names papermill's injected-parameters cell assigned, when the cell run before the current one is it.

    The kernel does not see cell tags, so the cell is recognised by what papermill writes (its translator's
    ``# Parameters`` comment, then only ``name = value`` assignments); a ``parameters`` cell of a template has
    annotated assignments (``name: type = value``), so it never matches. Empty outside IPython (no ``In``).
    """
    import ast

    history = namespace.get("_ih") or namespace.get("In")
    if not isinstance(history, list) or len(history) < 2 or not isinstance(history[-2], str):
        return []
    source = history[-2]
    if not source.lstrip().startswith("# Parameters"):
        return []
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return []
    names: list[str] = []
    for node in body:
        if not (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets)):
            return []
        names.extend(t.id for t in node.targets if t.id not in names)
    return names


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ----------------------------------------------------------------------------------------------
# Shipped models
# ----------------------------------------------------------------------------------------------


def pretrained_summary(entry: Any) -> tuple[list[str], list[list[str]]]:
    """A shipped model's registry entry (``rpm_lib.pretrained.PretrainedModel``) as a two-column table: what it is,
    the data it was trained on, what trained it and what it scored."""
    regime = entry.data.get("regime", {})
    # the generator's split proportions are in tenths (train, val, test)
    parts = [regime.get(k) for k in ("train", "val", "test")]
    split = "/".join(str(10 * p) for p in parts) + " % train/val/test" if None not in parts else "split unknown"
    rows = [
        ["model", f"{entry.encoder} · {entry.setup_label} ({entry.protocol}), {entry.parameters:,} parameters"],
        ["panels", f"{entry.image_size} × {entry.image_size} px"],
        ["training data", f"{entry.data.get('generator')}: {regime.get('regime')}, {regime.get('mode')} mode, seed "
                          f"{regime.get('seed')}, {entry.data.get('num_problems')} problems "
                          f"({entry.data.get('num_per_config')} per configuration; {split})"],
        ["epochs", ", ".join(f"{stage} {n}" for stage, n in entry.epochs.items())],
        ["trained on", entry.device],
        ["recorded val accuracy", f"{format_percent(100 * entry.val_accuracy)} %"],
        ["recorded test accuracy",
         f"{format_percent(100 * entry.test_accuracy)} % ({entry.test_num_samples} problems)"],
        ["weights", f"{entry.file} ({entry.bytes / 1e6:.2f} MB, SHA-256 {entry.sha256[:12]}…)"],
        ["trained by", f"`{entry.command}`"],
    ]
    return ["field", "value"], rows


def pretrained_accuracy_report(rows: Sequence[dict[str, Any]], output_dir: str | Path | None = None,
                               name: str = "fresh_accuracy", title: str | None = None) -> None:
    """Show ``accuracy_rows`` of a shipped model as a Markdown table and as
    ``rpm_lib.viz.evaluation.plot_accuracy_intervals`` (both saved into ``output_dir`` as ``<name>.csv/.md/.png``)."""
    from rpm_lib.pretrained.evaluate import ACCURACY_COLUMNS, CONFIDENCE
    from rpm_lib.viz.evaluation import plot_accuracy_intervals

    _rows_report(rows, ACCURACY_COLUMNS, output_dir, name)
    show(plot_accuracy_intervals(rows, title, CONFIDENCE), output_dir, name)


def pretrained_regime_report(rows: Sequence[dict[str, Any]], output_dir: str | Path | None = None,
                             name: str = "regimes") -> None:
    """Show ``regime_rows`` of a shipped model as a Markdown table (saved into ``output_dir`` as
    ``<name>.csv/.md``), with why each split is in or out of the training distribution."""
    from rpm_lib.pretrained.evaluate import REGIME_COLUMNS

    _rows_report(rows, (*REGIME_COLUMNS, ("why", "why")), output_dir, name)


def _rows_report(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
                 output_dir: str | Path | None, name: str) -> None:
    """Display rows of ``rpm_lib.pretrained.evaluate`` as a Markdown table, saved by :func:`save_table`."""
    from IPython.display import Markdown, display

    from rpm_lib.pretrained.evaluate import table_cells

    header, cells = table_cells(rows, columns)
    save_table(header, cells, output_dir, name)
    display(Markdown(markdown_table(header, cells)))
