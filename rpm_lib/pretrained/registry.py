"""The registry of trained models that rpm_lib ships: what each is, how it was trained, and what it scored.

The registry is one file, ``rpm_lib/pretrained/models.json``, written by ``rpm-pretrained add RUN_DIR --name NAME``
from a finished run folder (never by hand): every field below comes from the run's own records -- ``metrics.json``
(setup, protocol, accuracies, device, epochs per stage, the SHA-256 of ``final_weights.pt``), ``progress.json``
(the data's fingerprints) and the data folder's manifest (generator, seed, sizes). The weights themselves are
``rpm_lib/pretrained/weights/<name>.pt``: the run's ``final_weights.pt`` (bfloat16, with the config;
``rpm_lib.training.final_weights``), unchanged, so that their SHA-256 is the one the run recorded.

A registry of your own models works the same way: every function takes the registry file (``rpm-pretrained
--registry FILE``), and its weights files lie relative to that file's folder.
"""
from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
from pathlib import Path
from typing import Any

from rpm_lib.data.records import MANIFEST, REGIME_FILE, GeneratorSettingsError, read_regime_file
from rpm_lib.json_files import read_object, write_object
from rpm_lib.rules.vocabulary import CONFIGURATIONS
from rpm_lib.run_folder import FINAL_WEIGHTS, METRICS, PROGRESS, is_finished

#: The registry of the models that ship with rpm_lib; their weights are in ``weights/`` beside it.
REGISTRY_FILE = Path(__file__).resolve().parent / "models.json"
#: What a model measures (``metrics.json`` ``protocol``): the paper's supervised training, linear evaluation of a
#: frozen pre-trained encoder, or pre-training followed by fine-tuning.
PROTOCOLS = ("supervised", "linear_evaluation", "fine_tuned")


class PretrainedError(ValueError):
    """An unknown model name, a registry entry that cannot be read, or a run folder that cannot become one."""


@dataclasses.dataclass(frozen=True)
class PretrainedModel:
    """One shipped model.

    Attributes:
        name: the registry key, e.g. ``"scl-ce-aux-sparse-cpu48"``.
        encoder / setup / setup_label / protocol: as in the run's ``metrics.json``.
        image_size: panel side in pixels the model reads (``(N, 16, S, S)`` panels).
        data: the data recipe: ``generator`` (name and version), ``regime`` (the generator's regime record:
            regime, mode, seed, split proportions in tenths), ``num_per_config``, ``num_problems`` (all splits),
            ``fingerprint`` and ``problems`` (``rpm_lib.data.fingerprint`` of the training data).
        epochs: epochs trained per stage, e.g. ``{"supervised": 12}``.
        device: what trained it (``metrics.json`` ``device``, e.g. ``"NVIDIA H200"`` or ``"cpu"``).
        val_accuracy / test_accuracy: recorded by the run (fractions in [0, 1]); ``test_num_samples`` their size.
        test_accuracy_per_configuration: configuration folder name -> recorded test accuracy.
        file: the weights file, relative to the registry's folder (``weights/<name>.pt``); ``sha256``, ``bytes``:
            of it.
        parameters: the model's parameter count (encoder and heads).
        command: how the run was trained (a command a reader can rerun).
        added: date the entry was written (YYYY-MM-DD).
    """

    name: str
    encoder: str
    setup: str
    setup_label: str
    protocol: str
    image_size: int
    data: dict[str, Any]
    epochs: dict[str, int]
    device: str
    val_accuracy: float
    test_accuracy: float
    test_num_samples: int
    test_accuracy_per_configuration: dict[str, float]
    file: str
    sha256: str
    bytes: int
    parameters: int
    command: str
    added: str

    def weights_path(self, registry: Path = REGISTRY_FILE) -> Path:
        """The weights file on this machine: ``file`` relative to the registry file's folder."""
        return Path(registry).resolve().parent / self.file

    @classmethod
    def from_json(cls, data: Any, source: str) -> "PretrainedModel":
        """An entry from its JSON object; one line naming ``source`` and the field when it does not fit."""
        if not isinstance(data, dict):
            raise PretrainedError(f"{source}: a model entry must be an object, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        missing = [name for name in fields if name not in data]
        unknown = [name for name in data if name not in fields]
        if missing or unknown:
            raise PretrainedError(f"{source}: entry {data.get('name', '?')!r}: "
                                  + (f"missing fields {missing}" if missing else f"unknown fields {unknown}"))
        for name, kind in (("name", str), ("file", str), ("sha256", str), ("image_size", int)):
            if not isinstance(data[name], kind):
                raise PretrainedError(f"{source}: entry {data.get('name', '?')!r}: field {name!r} must be a "
                                      f"{kind.__name__}")
        return cls(**data)


def read_registry(path: Path = REGISTRY_FILE) -> dict[str, PretrainedModel]:
    """name -> :class:`PretrainedModel`, in the file's order (an absent file is an empty registry)."""
    if not path.is_file():
        return {}
    data = read_object(path, PretrainedError)
    models = data.get("models")
    if not isinstance(models, list):
        raise PretrainedError(f"{path}: field 'models' must be a list")
    entries = [PretrainedModel.from_json(item, str(path)) for item in models]
    return {entry.name: entry for entry in entries}


def model_entry(name: str, path: Path = REGISTRY_FILE) -> PretrainedModel:
    """The entry called ``name``; an unknown name is one line listing the known ones (closest first)."""
    registry = read_registry(path)
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(registry) or "none yet"
        raise PretrainedError(f"no shipped model called {name!r}{hint} (shipped: {known}; `rpm-pretrained list`)")
    return registry[name]


def entry_from_run(run_dir: str | Path, name: str, command: str, data_root: str | Path | None = None,
                   file: str | None = None) -> PretrainedModel:
    """The registry entry of a finished run folder: everything read from its records (see the module docstring).

    Args:
        run_dir: a finished run (``metrics.json`` with a ``final_weights`` record, and ``final_weights.pt``).
        name: the entry's name.
        command: how the run was trained.
        data_root: the training data folder (default: the run config's ``data_root``), for the data recipe.
        file: the weights file relative to the registry's folder (default ``weights/<name>.pt``).

    Raises:
        PretrainedError: the run is not finished, has no final weights, or its data folder records no regime.
    """
    run_dir = Path(run_dir)
    if not is_finished(run_dir):
        raise PretrainedError(f"{run_dir}: not a finished run (no {METRICS})")
    metrics = read_object(run_dir / METRICS, PretrainedError)
    weights = metrics.get("final_weights")
    if not isinstance(weights, dict) or not (run_dir / FINAL_WEIGHTS).is_file():
        raise PretrainedError(f"{run_dir}: the run kept no {FINAL_WEIGHTS} (trained before runs kept their weights)")
    config = metrics.get("config") if isinstance(metrics.get("config"), dict) else {}
    progress = read_object(run_dir / PROGRESS, PretrainedError, missing_ok=True)
    root = Path(data_root if data_root is not None else config.get("data_root", ""))
    regime, num_problems = _data_record(root)
    groups = len(config.get("configurations") or CONFIGURATIONS)
    return PretrainedModel(
        name=name, encoder=str(metrics["encoder"]), setup=str(metrics["setup"]),
        setup_label=str(metrics.get("setup_label", metrics["setup"])), protocol=str(metrics.get("protocol")),
        image_size=int(config.get("image_size", 0)),
        data={"generator": f"{regime.get('generator')} {regime.get('version')}", "regime": regime,
              "num_per_config": num_problems // groups if num_problems else None, "num_problems": num_problems,
              "fingerprint": progress.get("data_fingerprint"), "problems": progress.get("data_problems")},
        epochs={stage["name"]: int(stage.get("epochs", 0)) for stage in metrics.get("stages", [])
                if isinstance(stage, dict) and "name" in stage},
        device=str(metrics.get("device")), val_accuracy=float(metrics["val_accuracy"]),
        test_accuracy=float(metrics["test_accuracy"]), test_num_samples=int(metrics["test_num_samples"]),
        test_accuracy_per_configuration={k: float(v) for k, v in
                                         metrics.get("test_accuracy_per_configuration", {}).items()},
        file=file or f"weights/{name}.pt", sha256=str(weights["sha256"]), bytes=int(weights["bytes"]),
        parameters=int(weights.get("parameters", 0)), command=command,
        added=datetime.date.today().isoformat())


def _data_record(root: Path) -> tuple[dict[str, Any], int | None]:
    """The training data's regime record (a cache's manifest, else a generated folder's ``regime.json``) and its
    number of problems (None when only the raw folder's record is there)."""
    manifest = read_object(root / MANIFEST, PretrainedError, missing_ok=True)
    if isinstance(manifest.get("regime"), dict):
        valid = manifest.get("num_valid")
        return manifest["regime"], valid if isinstance(valid, int) else None
    try:
        regime = read_regime_file(root)
    except GeneratorSettingsError as error:
        raise PretrainedError(str(error)) from None
    if regime is None:
        raise PretrainedError(f"{root}: neither a cache manifest nor a {REGIME_FILE} records the training data's "
                              "regime (pass the training data folder with --data)")
    return regime, len(list(root.rglob("*.npz"))) or None


def write_registry(models: dict[str, PretrainedModel], path: Path = REGISTRY_FILE) -> None:
    """Write the registry (atomically), entries in the given order."""
    write_object(path, {"format": "rpm_lib-pretrained", "version": 1,
                        "models": [dataclasses.asdict(model) for model in models.values()]}, indent=1)


def registry_json(models: dict[str, PretrainedModel]) -> str:
    """The registry as JSON text (``rpm-pretrained list --json``)."""
    return json.dumps([dataclasses.asdict(model) for model in models.values()], indent=1)
