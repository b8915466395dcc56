"""What a batch is: its YAML read and checked (:func:`load_batch_config`), and the runs its grids expand to
(:func:`expand_grid`), each checked against the template's parameters (:func:`check_parameters`).

``rpm_lib.batch`` (``rpm-batch``) executes them. A batch is described by a YAML file (see ``configs/table1.yaml``
and ``configs/demo.yaml``)::

    name: demo                          # optional, informative
    template: notebooks/03_train.ipynb  # executed once per grid point
    then:                               # optional notebooks executed afterwards in the same run folder
      - notebooks/04_evaluate.ipynb
    report: notebooks/06_results_table.ipynb   # optional, executed once at the end with batch_dir=<out>
    out: runs/demo                      # batch folder; one sub-folder per grid, one per run
    kernel: python3                     # optional (default python3)
    execution_timeout: null             # optional seconds per cell; default none: cells run to their end
    prepare:                            # optional commands run in order before any run; a step with
      - creates: data/iraven/manifest.json   # `creates` is skipped when that path exists. `python` means
        run: [rpm-generate, --out, data/iraven, --num-per-config, "100"]   # this interpreter; console
                                        #   scripts are also looked up beside it (venv not activated)
      - creates: data/iraven/manifest.json   # steps sharing `creates`: skipped together; the last one
        run: [rpm-data, prepare, ...]   #   of them must have made it (else the batch stops)
    fixed: {epochs: 1, interactive: false}   # parameters shared by every run
    grids:                              # or a single grid given as top-level `axes:`
      - name: main
        default: true                   # run when no --grid is given (default true)
        fixed: {}                       # extra parameters for this grid
        axes:                           # Cartesian product, in this order
          encoder: [scl, wren]          #   list: parameter `encoder` takes each value
          setup:                        #   mapping: label -> parameters (or label -> value of `setup`)
            CE: {setup: ce}
            MLCL+AUG: {setup: mlcl, augment: official}
          train:                        #   labels keep folder names readable when values are paths / lists
            A/Color: {data_root: data/a-color, test_data_roots: [data/a-size]}
          seed: [0, 1]

Relative paths in the YAML (template, out, prepare) and relative paths passed to notebooks are relative
to the current working directory (run from the repository root); kernels run in that directory.
"""
from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


#: Notebook parameter that receives ``<run folder>/<notebook stem>`` (figures, tables).
OUTPUT_DIR_PARAMETER = "output_dir"
#: Notebook parameter that receives the run folder (training writes it; evaluation notebooks read it).
RUN_DIR_PARAMETER = "run_dir"


class BatchConfigError(ValueError):
    """The batch YAML is malformed; the message names the file and the offending entry."""


@dataclass(frozen=True)
class PrepareStep:
    """A command run once before the grid, skipped when ``creates`` already exists."""

    command: tuple[str, ...]
    creates: str | None = None


@dataclass(frozen=True)
class Grid:
    """One named Cartesian grid. ``axes`` maps axis -> ``{label: parameters}`` (insertion order kept)."""

    name: str
    axes: dict[str, dict[str, dict[str, Any]]]
    fixed: dict[str, Any]
    default: bool = True


@dataclass(frozen=True)
class BatchConfig:
    """A parsed batch YAML (see the module docstring)."""

    path: Path
    name: str
    template: Path
    then: tuple[Path, ...]
    out: Path
    report: Path | None
    kernel: str
    execution_timeout: int | None
    fixed: dict[str, Any]
    grids: tuple[Grid, ...]
    prepare: tuple[PrepareStep, ...] = ()
    slurm: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunSpec:
    """One grid point.

    Attributes:
        name: folder name built from the labels, e.g. ``encoder-scl__setup-MLCL_AUG__seed-0``.
        grid: grid name.
        labels: axis -> label of the chosen value (strings; what tables group by).
        parameters: notebook parameters (batch ``fixed`` < grid ``fixed`` < axis values), without ``run_dir``
            and ``output_dir`` (set per run by the runner).
    """

    name: str
    grid: str
    labels: dict[str, str]
    parameters: dict[str, Any]


# ----------------------------------------------------------------------------------------------
# Config parsing
# ----------------------------------------------------------------------------------------------


def _fail(path: Path, message: str) -> BatchConfigError:
    return BatchConfigError(f"{path}: {message}")


def _mapping(value: Any, path: Path, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(path, f"'{where}' must be a mapping, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


def _parse_axis(values: Any, axis: str, path: Path, grid: str) -> dict[str, dict[str, Any]]:
    where = f"grids[{grid}].axes.{axis}"
    if isinstance(values, Mapping):
        if not values:
            raise _fail(path, f"'{where}' is empty")
        out = {}
        for label, params in values.items():
            out[str(label)] = dict(params) if isinstance(params, Mapping) else {axis: params}
        return out
    if isinstance(values, Sequence) and not isinstance(values, str):
        if not values:
            raise _fail(path, f"'{where}' is empty")
        out = {}
        for v in values:
            if isinstance(v, (Mapping, list)):
                raise _fail(path, f"'{where}': list values must be scalars; use a mapping label -> parameters")
            label = str(v)
            if label in out:
                raise _fail(path, f"'{where}': duplicate value {v!r}")
            out[label] = {axis: v}
        return out
    raise _fail(path, f"'{where}' must be a list of values or a mapping label -> parameters, got {values!r}")


def _parse_grid(raw: Any, path: Path, index: int) -> Grid:
    if not isinstance(raw, Mapping):
        raise _fail(path, f"grids[{index}] must be a mapping")
    unknown = set(raw) - {"name", "axes", "fixed", "default"}
    if unknown:
        raise _fail(path, f"grids[{index}]: unknown key(s) {sorted(unknown)}")
    name = str(raw.get("name", "main"))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise _fail(path, f"grids[{index}]: name {name!r} must use letters, digits, '_', '.', '-'")
    axes_raw = _mapping(raw.get("axes"), path, f"grids[{name}].axes")
    axes = {axis: _parse_axis(values, axis, path, name) for axis, values in axes_raw.items()}
    return Grid(name=name, axes=axes, fixed=_mapping(raw.get("fixed"), path, f"grids[{name}].fixed"),
                default=bool(raw.get("default", True)))


def _parse_prepare(raw: Any, path: Path) -> tuple[PrepareStep, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _fail(path, "'prepare' must be a list of {run: [...], creates: path}")
    steps = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or "run" not in item:
            raise _fail(path, f"prepare[{i}] must be a mapping with a 'run' command list")
        cmd = item["run"]
        if isinstance(cmd, str) or not isinstance(cmd, list) or not cmd:
            raise _fail(path, f"prepare[{i}].run must be a non-empty list of arguments (no shell string)")
        creates = item.get("creates")
        steps.append(PrepareStep(tuple(str(c) for c in cmd), None if creates is None else str(creates)))
    return tuple(steps)


def load_batch_config(path: str | Path) -> BatchConfig:
    """Parse and validate a batch YAML file (format in the module docstring).

    Raises:
        FileNotFoundError: the YAML or its template notebook is missing.
        BatchConfigError: anything malformed, naming the file and the entry.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"batch config {path} not found")
    from rpm_lib.typed_values import load_yaml_file_text, yaml_problem

    try:
        raw = load_yaml_file_text(path.read_text())
    except yaml.YAMLError as exc:
        raise _fail(path, yaml_problem(exc)) from None
    except UnicodeDecodeError as exc:
        raise _fail(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not isinstance(raw, Mapping):
        raise _fail(path, "top level must be a mapping")
    known = {"name", "template", "then", "report", "out", "kernel", "execution_timeout", "fixed", "grids", "axes",
             "prepare", "slurm"}
    unknown = set(raw) - known
    if unknown:
        raise _fail(path, f"unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    if "template" not in raw:
        raise _fail(path, "missing 'template' (the notebook to execute per run)")
    template = Path(str(raw["template"]))
    if not template.is_file():
        raise FileNotFoundError(f"{path}: template notebook {template} not found (relative to {Path.cwd()})")
    then_raw = raw.get("then") or []
    if not isinstance(then_raw, list):
        raise _fail(path, "'then' must be a list of notebook paths")
    then = tuple(Path(str(p)) for p in then_raw)
    for p in then:
        if not p.is_file():
            raise FileNotFoundError(f"{path}: notebook {p} in 'then' not found (relative to {Path.cwd()})")
    report = None if raw.get("report") is None else Path(str(raw["report"]))
    if report is not None and not report.is_file():
        raise FileNotFoundError(f"{path}: report notebook {report} not found (relative to {Path.cwd()})")
    if ("grids" in raw) == ("axes" in raw):
        raise _fail(path, "give exactly one of 'grids' (a list) or 'axes' (a single grid)")
    if "grids" in raw:
        if not isinstance(raw["grids"], list) or not raw["grids"]:
            raise _fail(path, "'grids' must be a non-empty list")
        grids = tuple(_parse_grid(g, path, i) for i, g in enumerate(raw["grids"]))
    else:
        grids = (_parse_grid({"name": "main", "axes": raw["axes"]}, path, 0),)
    names = [g.name for g in grids]
    if len(set(names)) != len(names):
        raise _fail(path, f"grid names must be unique, got {names}")
    timeout = raw.get("execution_timeout")
    if timeout is not None and (not isinstance(timeout, int) or timeout <= 0):
        raise _fail(path, f"'execution_timeout' must be a positive integer (seconds) or null, got {timeout!r}")
    fixed = _mapping(raw.get("fixed"), path, "fixed")
    for reserved in (OUTPUT_DIR_PARAMETER, RUN_DIR_PARAMETER):
        if reserved in fixed or any(reserved in g.fixed for g in grids) or any(
                reserved in values for g in grids for axis in g.axes.values() for values in axis.values()):
            raise _fail(path, f"'{reserved}' is set by rpm-batch (the run folder); remove it from 'fixed'")
    return BatchConfig(
        path=path,
        name=str(raw.get("name", path.stem)),
        template=template,
        then=then,
        out=Path(str(raw.get("out", Path("runs") / path.stem))),
        report=report,
        kernel=str(raw.get("kernel", "python3")),
        execution_timeout=timeout,
        fixed=fixed,
        grids=grids,
        prepare=_parse_prepare(raw.get("prepare"), path),
        slurm=_slurm_mapping(raw.get("slurm"), path),
    )


def _slurm_mapping(raw: Any, path: Path) -> dict[str, Any] | None:
    """The YAML's ``slurm:`` settings, checked now (``rpm_lib.slurm.parse_settings``) so a typo fails at once."""
    if raw is None:
        return None
    from rpm_lib.slurm import parse_settings

    parse_settings(raw, source=str(path))
    return dict(raw)


# ----------------------------------------------------------------------------------------------
# Grid expansion
# ----------------------------------------------------------------------------------------------


def slug(text: str) -> str:
    """A file-name-safe form of a label: ``"MLCL+AUG"`` -> ``"MLCL_AUG"``, ``"0.5"`` -> ``"0.5"``."""
    s = re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")
    if not s:
        raise ValueError(f"label {text!r} has no letters or digits to name a folder with")
    return s


def run_name(labels: Mapping[str, str]) -> str:
    """Folder name of a run: ``axis-label`` pairs joined by ``__`` in axis order (``"run"`` for no axes)."""
    return "__".join(f"{slug(axis)}-{slug(label)}" for axis, label in labels.items()) or "run"


def expand_grid(config: BatchConfig, grids: Sequence[str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> list[RunSpec]:
    """All runs of the selected grids (``None``: those with ``default: true``), in axis order.

    Parameter precedence (later wins): batch ``fixed``, grid ``fixed``, axis values, ``overrides``.
    An override of an axis's own parameter (e.g. ``seed`` on a ``seed`` axis) also replaces that axis's
    label, so the run folder is named after the value the run really uses.

    Raises:
        BatchConfigError: unknown grid name, or two runs of one grid with the same folder name.
    """
    known = {g.name: g for g in config.grids}
    if grids:
        missing = [g for g in grids if g not in known]
        if missing:
            raise _fail(config.path, f"unknown grid(s) {missing}; defined: {list(known)}")
        selected = [known[g] for g in grids]
    else:
        selected = [g for g in config.grids if g.default]
        if not selected:
            raise _fail(config.path, f"no grid has 'default: true'; name one with --grid ({', '.join(known)})")
    specs: list[RunSpec] = []
    for grid in selected:
        axis_names = list(grid.axes)
        seen: set[str] = set()
        for choice in itertools.product(*(grid.axes[a].items() for a in axis_names)):
            labels = {axis: label for axis, (label, _) in zip(axis_names, choice)}
            params = {**config.fixed, **grid.fixed}
            for _, (_, values) in zip(axis_names, choice):
                params.update(values)
            params.update(overrides or {})
            for axis in axis_names:
                if overrides and axis in overrides:
                    labels[axis] = str(overrides[axis])
            name = run_name(labels)
            if name in seen:
                raise _fail(config.path, f"grid {grid.name}: two runs would share the folder {name!r}")
            seen.add(name)
            specs.append(RunSpec(name=name, grid=grid.name, labels=labels, parameters=params))
    return specs


def notebook_parameters(path: Path) -> dict[str, Any]:
    """The parameters papermill can set in ``path`` (its cell tagged ``parameters``), each with the annotation the
    notebook holds its values to: for a template that checks them (``rpm_lib.notebook.check_parameters``), what
    :func:`rpm_lib.typed_values.annotation_from_text` reads; otherwise (and for annotations it does not read)
    None, since the notebook takes whatever it is given.

    Raises:
        BatchConfigError: the notebook has no such cell.
    """
    import nbformat
    import papermill

    from rpm_lib.typed_values import annotation_from_text

    found = papermill.inspect_notebook(str(path))
    if not found:
        raise BatchConfigError(f"{path}: no cell tagged 'parameters', so no parameter can be set")
    checked = any("check_parameters(globals()" in cell.source for cell in nbformat.read(path, as_version=4).cells
                  if cell.cell_type == "code")
    return {name: annotation_from_text(str(info.get("inferred_type_name") or "")) if checked else None
            for name, info in found.items()}


def check_parameters(config: BatchConfig, specs: Sequence[RunSpec]) -> None:
    """Every parameter a run sets must be a parameter of the template, of the type its ``parameters`` cell
    declares: a misspelling would otherwise run with the default silently, and a wrong type would fail each run
    only after its kernel started.

    Raises:
        BatchConfigError: naming the YAML, the grid, the parameter, the likely intended name and the template.
    """
    from rpm_lib.typed_values import coerce

    known = notebook_parameters(config.template)
    for spec in specs:
        for name, value in spec.parameters.items():
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise _fail(config.path, f"grid {spec.grid}: {name!r} is not a parameter of {config.template}{hint}")
            if known[name] is not None:
                try:
                    # non-finite floats: the template's own call decides (its non_finite=...)
                    coerce(name, value, known[name], what="parameter", allow_non_finite=True)
                except ValueError as error:
                    raise _fail(config.path, f"grid {spec.grid}, run {spec.name}: {error}") from None


def run_dir_of(out: Path, spec: RunSpec) -> Path:
    """The run folder: ``<out>/<grid>/<name>``."""
    return out / spec.grid / spec.name


