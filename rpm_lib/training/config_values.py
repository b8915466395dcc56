"""What a training configuration is read from, and the checks of single values: the layer under ``TrainConfig``.

:class:`ConfigError` (every configuration problem, naming its field or file), ``key=value`` overrides
(:func:`parse_overrides`), a YAML file's mapping of fields (:func:`read_yaml_mapping`), close-match suggestions,
and the checks of values that need other rpm_lib modules (configurations, extra test sets, generator regimes,
names from a registry). :mod:`rpm_lib.training.config` builds :class:`TrainConfig` on them.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rpm_lib import typed_values
from rpm_lib.rule_encodings import ENCODING_NAMES


class ConfigError(ValueError):
    """A configuration value, key or file is invalid; the message names the field (or file)."""


#: Rule encodings (:mod:`rpm_lib.rule_encodings`): ``auto`` picks dense for ``ce_aux_dense`` and the dataset's
#: sparse code otherwise.
RULE_ENCODINGS: tuple[str, ...] = ("auto", *ENCODING_NAMES)
#: Encoder tensor layouts (``auto`` resolves in :func:`resolve_memory_format_for`).
MEMORY_FORMATS: tuple[str, ...] = ("auto", "channels_last", "contiguous")
DATASETS: tuple[str, ...] = ("iraven", "pgm")
#: What a resumed run demands of its data (``data_check``;
#: ``rpm_lib.training.progress_record.ProgressRecord.check_data``).
DATA_CHECKS: tuple[str, ...] = ("exact", "problems")
#: Learning-rate schedules within a stage (``lr_schedule``); the optimiser and schedule restart with every stage.
LR_SCHEDULES: tuple[str, ...] = ("constant", "plateau")
#: Mode of the frozen encoder in linear evaluation (``linear_eval_encoder_mode``).
ENCODER_MODES: tuple[str, ...] = ("eval", "train")
#: Training views of the stages after pre-training (``head_views``).
HEAD_VIEWS: tuple[str, ...] = ("single", "pretrain")
#: Lightning precision strings accepted by the ``precision`` field (``auto``: bf16/fp16 mixed on GPU, fp32 on CPU).
PRECISIONS: tuple[str, ...] = ("auto", "32-true", "32", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")
#: ``torch.set_float32_matmul_precision`` values (``matmul_precision``); ``auto`` leaves the process's own setting.
MATMUL_PRECISIONS: tuple[str, ...] = ("auto", "highest", "high", "medium")
#: What ``compile=true`` compiles (``compile_scope``): the encoder in place, or the whole forward of a step.
COMPILE_SCOPES: tuple[str, ...] = ("encoder", "step")
#: ``torch.compile`` modes (``compile_mode``); ``reduce-overhead`` replays the compiled kernels as CUDA graphs.
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead")


@dataclasses.dataclass(frozen=True)
class FieldRole:
    """How a TrainConfig field relates to a run's identity; every field names one (its metadata holds the three).

    Attributes:
        resumable: may change between an interrupted run and its resumption (:data:`RESUMABLE_CHANGES`).
        finished_run_ignores: would change how much a run trains: set on a finished run it changes nothing
            but a note (:data:`FINISHED_RUN_IGNORES`).
        compared: says what a run trained: two runs that differ in it are not one Table 1 row, and ``run.json``
            must agree with ``metrics.json`` on it (the others are :data:`NOT_COMPARED`).
    """

    resumable: bool
    finished_run_ignores: bool
    compared: bool


#: What the run trains and how: fixed for its life, separates Table 1 rows.
TRAINED = FieldRole(resumable=False, finished_run_ignores=False, compared=True)
#: How long it trains: may change when it resumes (not once it finished), separates rows.
LENGTH = FieldRole(resumable=True, finished_run_ignores=True, compared=True)
#: How much of the final test it evaluates: may change when it resumes, separates rows.
EVALUATION = FieldRole(resumable=True, finished_run_ignores=False, compared=True)
#: How or where it runs (folders, machine, workers, logging, run control, extra test sets): may change when it
#: resumes (``data_root`` may move: the data's fingerprint, not its path, says whether it is the same data),
#: separates no rows.
RUN_CONTROL = FieldRole(resumable=True, finished_run_ignores=False, compared=False)
#: Fixed for a run's life but separates no rows: the seed (a row's runs differ in it) and numerics of the machine.
FIXED_SETTING = FieldRole(resumable=False, finished_run_ignores=False, compared=False)


def field(default: Any, help: str, group: str, role: FieldRole, **constraints: Any) -> Any:
    """A dataclass field with ``help`` / ``group`` / role / constraint metadata; list/dict defaults are copied."""
    metadata = {"help": help, "group": group, **dataclasses.asdict(role), **constraints}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_field_constraints(name: str, value: Any, metadata: Mapping[str, Any]) -> None:
    """Raise ConfigError naming field ``name`` when ``value`` breaks its ``choices`` / ``minimum`` /
    ``exclusive_minimum`` metadata, or is a number that is not finite."""
    if "choices" in metadata and value not in metadata["choices"]:
        raise ConfigError(
            f"config field {name!r}: {value!r} is not one of {', '.join(map(str, metadata['choices']))}"
            f"{suggest(str(value), [str(c) for c in metadata['choices']])}"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):  # nan passes every comparison below; inf is never meant
            raise ConfigError(f"config field {name!r}: must be a finite number, got {value!r}")
        if "minimum" in metadata and value < metadata["minimum"]:
            raise ConfigError(f"config field {name!r}: must be >= {metadata['minimum']}, got {value!r}")
        if "exclusive_minimum" in metadata and value <= metadata["exclusive_minimum"]:
            raise ConfigError(f"config field {name!r}: must be > {metadata['exclusive_minimum']}, got {value!r}")


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping of fields in a YAML config file.

    Raises:
        ConfigError: the file is missing, a folder, not UTF-8, not YAML, or not a mapping.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        values = typed_values.load_yaml_file_text(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path}: {typed_values.yaml_problem(error)}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path}: expected a mapping of field: value, got {type(values).__name__}")
    return values


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["lr=0.001", "configurations=[Center, L-R]"]`` -> ``{"lr": 0.001, ...}`` (values parsed as YAML).

    Raises:
        ConfigError: an item without ``=`` or with an empty key.
    """
    values: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key=value")
        # The raw text is kept beside the YAML value; coercion decides per field type which one fits.
        values[key] = typed_values.from_text(raw)
    return values


def plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def normalise_configurations(names: list[str]) -> list[str]:
    """Map short names (``Center``, ``2x2Grid``, ...) and folder names to folder names; keep order.

    Raises:
        ConfigError: an unknown name or a duplicate.
    """
    from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES, resolve_configuration, resolve_configurations

    for name in names:
        try:
            resolve_configuration(name)
        except ValueError:
            options = list(CONFIGURATIONS) + list(SHORT_NAMES.values())
            raise ConfigError(f"config field 'configurations': unknown configuration {name!r}{suggest(name, options)}"
                              f"; known: {', '.join(SHORT_NAMES.values())}") from None
    try:
        return resolve_configurations(names, allow_duplicates=False)
    except ValueError as error:
        raise ConfigError(f"config field 'configurations': {error}") from None


def normalise_test_data_roots(roots: list[str]) -> list[str] | None:
    """``test_data_roots`` checked: non-empty path strings, each once; an empty list means none (``None``).

    Existence is checked by ``train`` (before training), not here: a config may be written before its data.

    Raises:
        ConfigError: an empty entry or a duplicate.
    """
    seen: set[str] = set()
    for root in roots:
        if not root.strip():
            raise ConfigError("config field 'test_data_roots': an entry is empty; give a dataset folder or cache")
        key = str(Path(root))
        if key in seen:
            raise ConfigError(f"config field 'test_data_roots': {root} is listed twice")
        seen.add(key)
    return list(roots) or None


def check_generate_regime(name: str, generate: bool) -> None:
    """``generate_regime`` must name a known regime, and a non-default one only makes sense with ``generate``."""
    from rpm_lib.generator.regimes import IRAVEN, REGIMES

    check_known("generate_regime", "regime", name, list(REGIMES))
    if name != IRAVEN.name and not generate:
        raise ConfigError(f"config field 'generate_regime': {name} has no effect without generate=true (data_root "
                          "is used as it is); set generate=true or leave generate_regime at its default")


def check_known(field: str, what: str, value: str, known: list[str], extra: str = "") -> None:
    """Raise ConfigError naming ``field`` when ``value`` is not one of ``known`` (with a close match)."""
    if value not in known:
        raise ConfigError(f"config field '{field}': unknown {what} {value!r}{suggest(value, known)}; "
                          f"known: {extra}{', '.join(known)}")


def resolve_memory_format_for(memory_format: str) -> str:
    """``memory_format`` (``auto`` / ``channels_last`` / ``contiguous``) with ``auto`` resolved.

    ``auto`` is ``channels_last`` on CPUs and GPUs alike: cuDNN's fast convolutions want NHWC, and on the CPU oneDNN ran every
    encoder's forward + backward 1.09-1.46x faster in NHWC than NCHW (``bench/bench_models.py --side-by-side``,
    docs/performance.md).
    """
    if memory_format != "auto":
        return memory_format
    return "channels_last"
