"""What a batch is: its YAML read and checked (:func:`load_batch_config`), the vocabulary of its pieces (a grid,
a prepare step, one run's :class:`RunSpec`) and its SLURM settings (:func:`parse_settings`).

How its grids expand into runs is ``rpm_lib.batch.grid``; the template's parameters they are checked against,
``rpm_lib.batch.notebook``; ``rpm_lib.batch`` (``rpm-batch``) executes them. A batch is described by a YAML file
(see ``configs/table1.yaml`` and ``configs/demo.yaml``)::

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

import re
from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rpm_lib.typed_values import load_yaml_file_text, yaml_problem

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


def fail(path: Path, message: str) -> BatchConfigError:
    """The error for the batch YAML ``path``: its name, then ``message``."""
    return BatchConfigError(f"{path}: {message}")


def _mapping(value: Any, path: Path, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(path, f"'{where}' must be a mapping, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


def _parse_axis(values: Any, axis: str, path: Path, grid: str) -> dict[str, dict[str, Any]]:
    where = f"grids[{grid}].axes.{axis}"
    if isinstance(values, Mapping):
        if not values:
            raise fail(path, f"'{where}' is empty")
        out = {}
        for label, params in values.items():
            out[str(label)] = dict(params) if isinstance(params, Mapping) else {axis: params}
        return out
    if isinstance(values, Sequence) and not isinstance(values, str):
        if not values:
            raise fail(path, f"'{where}' is empty")
        out = {}
        for v in values:
            if isinstance(v, (Mapping, list)):
                raise fail(path, f"'{where}': list values must be scalars; use a mapping label -> parameters")
            label = str(v)
            if label in out:
                raise fail(path, f"'{where}': duplicate value {v!r}")
            out[label] = {axis: v}
        return out
    raise fail(path, f"'{where}' must be a list of values or a mapping label -> parameters, got {values!r}")


def _parse_grid(raw: Any, path: Path, index: int) -> Grid:
    if not isinstance(raw, Mapping):
        raise fail(path, f"grids[{index}] must be a mapping")
    unknown = set(raw) - {"name", "axes", "fixed", "default"}
    if unknown:
        raise fail(path, f"grids[{index}]: unknown key(s) {sorted(unknown)}")
    name = str(raw.get("name", "main"))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise fail(path, f"grids[{index}]: name {name!r} must use letters, digits, '_', '.', '-'")
    axes_raw = _mapping(raw.get("axes"), path, f"grids[{name}].axes")
    axes = {axis: _parse_axis(values, axis, path, name) for axis, values in axes_raw.items()}
    return Grid(name=name, axes=axes, fixed=_mapping(raw.get("fixed"), path, f"grids[{name}].fixed"),
                default=bool(raw.get("default", True)))


def _parse_prepare(raw: Any, path: Path) -> tuple[PrepareStep, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise fail(path, "'prepare' must be a list of {run: [...], creates: path}")
    steps = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or "run" not in item:
            raise fail(path, f"prepare[{i}] must be a mapping with a 'run' command list")
        cmd = item["run"]
        if isinstance(cmd, str) or not isinstance(cmd, list) or not cmd:
            raise fail(path, f"prepare[{i}].run must be a non-empty list of arguments (no shell string)")
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
    try:
        raw = load_yaml_file_text(path.read_text())
    except yaml.YAMLError as exc:
        raise fail(path, yaml_problem(exc)) from None
    except UnicodeDecodeError as exc:
        raise fail(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not isinstance(raw, Mapping):
        raise fail(path, "top level must be a mapping")
    known = {"name", "template", "then", "report", "out", "kernel", "execution_timeout", "fixed", "grids", "axes",
             "prepare", "slurm"}
    unknown = set(raw) - known
    if unknown:
        raise fail(path, f"unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    if "template" not in raw:
        raise fail(path, "missing 'template' (the notebook to execute per run)")
    template = Path(str(raw["template"]))
    if not template.is_file():
        raise FileNotFoundError(f"{path}: template notebook {template} not found (relative to {Path.cwd()})")
    then_raw = raw.get("then") or []
    if not isinstance(then_raw, list):
        raise fail(path, "'then' must be a list of notebook paths")
    then = tuple(Path(str(p)) for p in then_raw)
    for p in then:
        if not p.is_file():
            raise FileNotFoundError(f"{path}: notebook {p} in 'then' not found (relative to {Path.cwd()})")
    report = None if raw.get("report") is None else Path(str(raw["report"]))
    if report is not None and not report.is_file():
        raise FileNotFoundError(f"{path}: report notebook {report} not found (relative to {Path.cwd()})")
    if ("grids" in raw) == ("axes" in raw):
        raise fail(path, "give exactly one of 'grids' (a list) or 'axes' (a single grid)")
    if "grids" in raw:
        if not isinstance(raw["grids"], list) or not raw["grids"]:
            raise fail(path, "'grids' must be a non-empty list")
        grids = tuple(_parse_grid(g, path, i) for i, g in enumerate(raw["grids"]))
    else:
        grids = (_parse_grid({"name": "main", "axes": raw["axes"]}, path, 0),)
    names = [g.name for g in grids]
    if len(set(names)) != len(names):
        raise fail(path, f"grid names must be unique, got {names}")
    timeout = raw.get("execution_timeout")
    if timeout is not None and (not isinstance(timeout, int) or timeout <= 0):
        raise fail(path, f"'execution_timeout' must be a positive integer (seconds) or null, got {timeout!r}")
    fixed = _mapping(raw.get("fixed"), path, "fixed")
    for reserved in (OUTPUT_DIR_PARAMETER, RUN_DIR_PARAMETER):
        if reserved in fixed or any(reserved in g.fixed for g in grids) or any(
                reserved in values for g in grids for axis in g.axes.values() for values in axis.values()):
            raise fail(path, f"'{reserved}' is set by rpm-batch (the run folder); remove it from 'fixed'")
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
    """The YAML's ``slurm:`` settings, checked now (:func:`parse_settings`) so a typo fails at once."""
    if raw is None:
        return None
    parse_settings(raw, source=str(path))
    return dict(raw)



# ----------------------------------------------------------------------------------------------
# SLURM settings (``slurm:`` in the YAML, ``--slurm KEY=VALUE``)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmSettings:
    """What every task of the array asks SLURM for (``slurm:`` in the batch YAML, ``--slurm KEY=VALUE``).

    Attributes:
        partition: ``--partition`` (None: the cluster's default).
        account: ``--account`` (None: the user's default).
        time_min: time limit per task, minutes (``--time``); a run longer than that is requeued and resumed.
        cpus_per_task: ``--cpus-per-task`` (the run's loader workers and threads share them).
        gpus_per_task: GPUs per task (``--gpus-per-node``; 0 for CPU runs).
        mem_gb: ``--mem`` in GB (None: the cluster's default).
        signal_delay_s: seconds before the time limit at which SLURM signals the task (``--signal=USR2@N``); the
            run's own budget ends this much before the limit.
        max_requeues: how many times an unfinished cell requeues itself before it gives up.
        array_parallelism: tasks of the array running at once (``--array=...%N``).
        extra: further sbatch options, e.g. ``{qos: high, constraint: a100}`` (submitit's additional parameters).
        setup: shell lines run before each task (``module load ...``, activating an environment).
    """

    partition: str | None = None
    account: str | None = None
    time_min: int = 24 * 60
    cpus_per_task: int = 4
    gpus_per_task: int = 0
    mem_gb: float | None = None
    signal_delay_s: int = 120
    max_requeues: int = 10
    array_parallelism: int = 64
    extra: Mapping[str, Any] = field(default_factory=dict)
    setup: tuple[str, ...] = ()


def parse_settings(raw: Any, overrides: Mapping[str, Any] = (), source: str = "slurm") -> SlurmSettings:
    """:class:`SlurmSettings` from the YAML's ``slurm:`` mapping, then ``overrides`` (``--slurm KEY=VALUE``).

    Raises:
        BatchConfigError: not a mapping, an unknown key, or a value of the wrong type / range; names the key.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise BatchConfigError(f"{source}: 'slurm' must be a mapping of settings, got {type(raw).__name__}")
    values = {**raw, **dict(overrides)}
    fields = {f.name: f for f in dataclasses.fields(SlurmSettings)}
    checked: dict[str, Any] = {}
    for key, value in values.items():
        if key not in fields:
            raise BatchConfigError(f"{source}: unknown slurm setting {key!r}; known: {', '.join(fields)}")
        checked[key] = _check_setting(key, value, source)
    return SlurmSettings(**checked)


def _check_setting(key: str, value: Any, source: str) -> Any:
    where = f"{source}: slurm setting {key!r}"
    if key in ("partition", "account"):
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise BatchConfigError(f"{where}: expected a name, got {value!r}")
        return value
    if key in ("time_min", "cpus_per_task", "gpus_per_task", "signal_delay_s", "max_requeues", "array_parallelism"):
        minimum = 0 if key in ("gpus_per_task", "signal_delay_s", "max_requeues") else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise BatchConfigError(f"{where}: expected a whole number >= {minimum}, got {value!r}")
        return value
    if key == "mem_gb":
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise BatchConfigError(f"{where}: expected a positive number of GB, got {value!r}")
        return value
    if key == "extra":
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise BatchConfigError(f"{where}: expected a mapping of sbatch option -> value, got {value!r}")
        return dict(value)
    if key == "setup":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, Sequence) or not all(isinstance(line, str) for line in value):
            raise BatchConfigError(f"{where}: expected a list of shell lines, got {value!r}")
        return tuple(value)
    raise AssertionError(key)
