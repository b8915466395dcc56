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

import math
import re
from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rpm_lib.cli_parser import one_line
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
    except ValueError as exc:  # a number of more digits than int() takes
        raise fail(path, f"unreadable value: {one_line(exc)}"[:200]) from None
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
    name = str(raw.get("name", path.stem))
    if not _one_line(name):
        raise fail(path, f"'name' {shown(name)} must be one line of printable characters")
    return BatchConfig(
        path=path,
        name=name,
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


#: The numeric SLURM settings: (type, smallest, largest, unit). The one definition of their ranges, for the YAML's
#: ``slurm:`` mapping and ``--slurm KEY=VALUE`` alike (:func:`parse_settings`).
SLURM_NUMBERS: dict[str, tuple[type, float, float, str]] = {
    "time_min": (int, 1, 30 * 24 * 60, "minutes"),        # 30 days
    "cpus_per_task": (int, 1, 1024, "CPUs"),
    "gpus_per_task": (int, 0, 64, "GPUs"),
    "mem_gb": (float, 1 / 1024, 64 * 1024, "GB"),           # from 1 MB: SLURM reads --mem=0 as the node's memory
    "signal_delay_s": (int, 0, 30 * 24 * 3600, "seconds"),  # and smaller than time_min * 60
    "max_requeues": (int, 0, 1000, "requeues"),
    "array_parallelism": (int, 1, 100_000, "tasks"),
}
#: sbatch options rpm-batch sets itself: not accepted in ``extra`` (option -> the setting that sets it, or None).
RESERVED_SBATCH_OPTIONS = {"time": "time_min", "partition": "partition", "account": "account",
                           "cpus-per-task": "cpus_per_task", "gpus-per-node": "gpus_per_task", "mem": "mem_gb",
                           "signal": "signal_delay_s", "array": "array_parallelism", "job-name": None,
                           "output": None, "error": None, "open-mode": None, "nodes": None, "ntasks-per-node": None,
                           "requeue": None, "wrap": None}
#: How much of a refused value an error shows.
SHOWN_CHARACTERS = 80


def shown(value: Any, limit: int = SHOWN_CHARACTERS) -> str:
    """``repr(value)`` for an error message: one line (a line break shows as ``\\n``), at most about ``limit``
    characters (a longer one is cut, with the length it had)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 60:
        digits = int(value.bit_length() * math.log10(2)) + 1  # repr() refuses over 4300 digits
        return f"a number of {digits - (abs(value) < 10 ** (digits - 1))} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_settings(raw: Any, overrides: Mapping[str, Any] = (), source: str = "slurm") -> SlurmSettings:
    """:class:`SlurmSettings` from the YAML's ``slurm:`` mapping, then ``overrides`` (``--slurm KEY=VALUE``).

    Every value that reaches the job script is checked here: names and ``extra`` hold no line break or control
    character (the script is shell: a line break would start a command), numbers are finite and within
    :data:`SLURM_NUMBERS`, and ``signal_delay_s`` is smaller than the time limit. ``setup`` is shell by design.

    Raises:
        BatchConfigError: not a mapping, an unknown key, or a value of the wrong type / range; names the key (and
            ``--slurm`` for an override).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise BatchConfigError(f"{source}: 'slurm' must be a mapping of settings, got {type(raw).__name__}")
    overrides = dict(overrides)
    values = {**raw, **overrides}
    fields = {f.name: f for f in dataclasses.fields(SlurmSettings)}
    checked: dict[str, Any] = {}
    for key, value in values.items():
        where = "--slurm" if key in overrides else source
        if key not in fields:
            raise BatchConfigError(f"{where}: unknown slurm setting {shown(key)}; known: {', '.join(fields)}")
        checked[key] = _check_setting(key, value, where)
    settings = SlurmSettings(**checked)
    if settings.signal_delay_s >= settings.time_min * 60:
        where = "--slurm" if {"signal_delay_s", "time_min"} & set(overrides) else source
        raise BatchConfigError(
            f"{where}: slurm setting 'signal_delay_s' ({settings.signal_delay_s} s) must be smaller than 'time_min' "
            f"({settings.time_min} min) x 60 = {settings.time_min * 60} s: the run would get no time")
    return settings


def check_settings(settings: SlurmSettings, source: str = "slurm") -> SlurmSettings:
    """``settings`` checked as :func:`parse_settings` checks the YAML's (e.g. a :class:`SlurmSettings` made in
    code); returns them."""
    return parse_settings({f.name: getattr(settings, f.name) for f in dataclasses.fields(SlurmSettings)},
                          source=source)


def job_settings(config: BatchConfig, out: str | Path, overrides: Mapping[str, Any] = ()) -> SlurmSettings:
    """The settings of ``config``'s SLURM job array (its ``slurm:`` mapping, then ``overrides``), with the other
    values the job script names checked too: the batch ``name`` (the job's name) and the batch folder ``out``
    (submitit's log folder). Called before any work starts.

    Raises:
        BatchConfigError: a setting as :func:`parse_settings` says, or a name / folder with a line break or control
            character.
    """
    settings = parse_settings(config.slurm, overrides, source=str(config.path))
    if not _one_line(config.name):
        raise fail(config.path, f"'name' {shown(config.name)} (the SLURM job's name) must be one line of printable "
                                "characters")
    folder = str(Path(out).resolve())
    if not _one_line(folder):
        raise fail(config.path, f"the batch folder {shown(folder)} ('out' / --out; the job script names it) must "
                                "hold no line break or control character")
    return settings


def _one_line(text: str) -> bool:
    """No line break, tab or other control / format character (what a shell script or an ``#SBATCH`` line may
    hold)."""
    return text.isprintable()


def _check_setting(key: str, value: Any, source: str) -> Any:
    where = f"{source}: slurm setting {key!r}"
    if key in ("partition", "account"):
        if value is not None and not (isinstance(value, str) and value.strip() and _one_line(value)
                                      and not any(c.isspace() for c in value) and len(value) <= 256):
            raise BatchConfigError(f"{where}: expected a name (no spaces, line breaks or control characters), "
                                   f"got {shown(value)}")
        return value
    if key in SLURM_NUMBERS:
        kind, minimum, maximum, unit = SLURM_NUMBERS[key]
        if key == "mem_gb" and value is None:
            return value
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise BatchConfigError(f"{where}: expected a whole number >= {minimum}, got {shown(value)}")
            if value > maximum:
                raise BatchConfigError(f"{where}: expected at most {maximum} {unit}, got {shown(value)}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BatchConfigError(f"{where}: expected a number of {unit}, got {shown(value)}")
        if not math.isfinite(value):
            raise BatchConfigError(f"{where}: expected a finite number of {unit}, got {shown(value)}")
        if key == "mem_gb" and value < minimum:
            raise BatchConfigError(f"{where}: expected at least 1 MB ({minimum:g} GB), got {shown(value)} (SLURM "
                                   "would read --mem=0 as all of the node's memory)")
        if not minimum <= value <= maximum:
            raise BatchConfigError(f"{where}: expected {minimum:g} to {maximum:g} {unit}, got {shown(value)}")
        return value
    if key == "extra":
        if not isinstance(value, Mapping):
            raise BatchConfigError(f"{where}: expected a mapping of sbatch option -> value, got {shown(value)}")
        for option, setting in value.items():
            _check_extra(option, setting, where)
        return dict(value)
    if key == "setup":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, Sequence) or not all(isinstance(line, str) for line in value):
            raise BatchConfigError(f"{where}: expected a list of shell lines, got {shown(value)}")
        return tuple(value)
    raise AssertionError(key)


def _check_extra(option: Any, value: Any, where: str) -> None:
    """One ``extra`` sbatch option: a plain option name rpm-batch does not set itself, and a one-line value."""
    if not (isinstance(option, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,63}", option)):
        raise BatchConfigError(f"{where}: an sbatch option name is letters, digits, '-' and '_', got {shown(option)}")
    if (name := option.replace("_", "-").lower()) in RESERVED_SBATCH_OPTIONS:
        setting = RESERVED_SBATCH_OPTIONS[name]
        raise BatchConfigError(f"{where}: {option!r} is set by rpm-batch" + (
            f"; use the slurm setting {setting!r}" if setting else ""))
    if value is True:  # a flag: #SBATCH --option
        return
    if isinstance(value, bool) or value is None:
        raise BatchConfigError(f"{where}: {option!r}: expected a value, or true for a flag (leave a flag out "
                               f"instead of setting it false), got {shown(value)}")
    if isinstance(value, int):
        if abs(value) > 10 ** 12:
            raise BatchConfigError(f"{where}: {option!r}: expected at most 10^12 in size, got {shown(value)}")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BatchConfigError(f"{where}: {option!r}: expected a finite number, got {shown(value)}")
        return
    if not isinstance(value, str) or not _one_line(value) or len(value) > 1000:
        raise BatchConfigError(f"{where}: {option!r}: expected one line of printable text (up to 1000 characters) "
                               f"or a number, got {shown(value)}")
