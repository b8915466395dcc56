"""The weights a finished run's test scored, kept small and safe to share: ``final_weights.pt``.

A finished run writes ``<run_dir>/final_weights.pt`` beside ``metrics.json``: every tensor of the model that was
evaluated (encoder, scoring head, and the rule / projection head where the setup has one) in bfloat16 -- 2 bytes a
parameter, about 1 MB for SCL -- together with the run's config (what the model is and how it was trained), so that
the file alone rebuilds the model.
``metrics.json`` records the file's SHA-256 under ``final_weights``. The run's full-precision checkpoints stay in
``checkpoints/``; this file is what travels (``rpm-batch pack`` keeps it) and what ``rpm_lib.pretrained`` ships.

The file holds plain tensors and plain containers only, and is read with ``torch.load(weights_only=True)``: a file
from elsewhere cannot run code. Rounding to bfloat16 changes the scores of a model by far less than the sampling
error of any test set here (the shipped models' accuracies on freshly generated problems are tested against the
recorded ones).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import warnings
from pathlib import Path
from typing import Any

import torch

from rpm_lib.atomic_files import write_atomically
from rpm_lib.run_folder import FINAL_WEIGHTS
from rpm_lib.training.config import NOT_COMPARED, ConfigError, TrainConfig
from rpm_lib.training.module import RpmModule

#: What the file says it is (``format`` and ``version`` keys).
FORMAT = "rpm_lib-final-weights"
VERSION = 1


class WeightsError(ValueError):
    """A weights file that cannot be used: unreadable, of another format, altered (SHA-256), or not this model's."""


def sha256_of(path: Path) -> str:
    """The SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def weights_payload(module: RpmModule, config: TrainConfig) -> dict[str, Any]:
    """What ``final_weights.pt`` holds: format, version, the config (plain values), R and the bfloat16 tensors.

    Floating-point tensors (weights, BatchNorm statistics) are stored in bfloat16; integer buffers (BatchNorm's
    batch counters) as they are.
    """
    state = {name: (tensor.detach().to("cpu", torch.bfloat16) if tensor.is_floating_point()
                    else tensor.detach().to("cpu")).clone()
             for name, tensor in module.state_dict().items()}
    return {"format": FORMAT, "version": VERSION, "config": model_config(config), "num_rules": int(module.num_rules),
            "dtype": "bfloat16", "state_dict": state}


def model_config(config: TrainConfig) -> dict[str, Any]:
    """The config fields that say what the model is and how it was trained (and its seed), as plain values.

    Where and how it ran (folders, machine, workers, logging, run control: ``NOT_COMPARED``) is left out: the file
    describes the model, not the machine, and an interrupted and resumed run writes the bytes an uninterrupted one
    does.
    """
    fields = {name: value for name, value in config.to_dict().items() if name not in NOT_COMPARED or name == "seed"}
    # Through JSON text: pickle writes a value once per object, so two configs of equal values built differently (one
    # read back from config.yaml) would pickle to different bytes; fresh objects make the file a function of the
    # values alone, and the same weights give the same SHA-256.
    return json.loads(json.dumps(fields))


def write_final_weights(module: RpmModule, config: TrainConfig, run_dir: Path) -> dict[str, Any]:
    """Write ``run_dir/final_weights.pt`` (atomically) and return its record for ``metrics.json``.

    Returns:
        ``{"file", "sha256", "bytes", "dtype", "parameters"}``: the file name (relative to the run folder), the
        SHA-256 of its bytes, its size, the stored dtype and the number of parameters of the model.
    """
    buffer = io.BytesIO()
    torch.save(weights_payload(module, config), buffer)
    data = buffer.getvalue()
    write_atomically(run_dir / FINAL_WEIGHTS, lambda handle: handle.write(data), fsync=True)
    return {"file": FINAL_WEIGHTS, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
            "dtype": "bfloat16", "parameters": sum(p.numel() for p in module.parameters())}


def read_final_weights(path: str | Path, sha256: str | None = None) -> dict[str, Any]:
    """The payload of a ``final_weights.pt``, checked: SHA-256 (when given) first, then format and contents.

    Raises:
        WeightsError: one line naming the file: missing, a hash that differs from ``sha256``, not loadable as plain
            tensors, or not a final-weights file.
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such weights file")
    if sha256 is not None:
        found = sha256_of(path)
        if found != sha256:
            raise WeightsError(f"{path}: SHA-256 {found[:16]}… differs from the recorded {sha256[:16]}…; the file "
                               "was altered or is another one (download or copy it again)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as problem:  # noqa: BLE001 - whatever the file is, the user gets one line
        raise WeightsError(f"{path}: not loadable as plain tensors ({type(problem).__name__}); it is not a "
                           "final_weights.pt written by rpm_lib") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise WeightsError(f"{path}: not a final-weights file (format {FORMAT!r} expected)")
    if payload.get("version") != VERSION:
        raise WeightsError(f"{path}: final-weights version {payload.get('version')!r}; this rpm_lib reads "
                           f"version {VERSION}")
    for key, kind in (("config", dict), ("state_dict", dict), ("num_rules", int)):
        if not isinstance(payload.get(key), kind):
            raise WeightsError(f"{path}: field {key!r} is missing or not a {kind.__name__}")
    return payload


def model_from_payload(payload: dict[str, Any], source: str = "weights") -> RpmModule:
    """The model a payload describes, in float32, in eval mode, on the CPU, ready to score problems.

    ``model(panels)`` with panels ``(N, 16, S, S)`` uint8 (or float in [0, 1]) at the config's ``image_size`` S
    returns ``scores`` ``(N, 8)``, ``embeddings`` ``(N, 8, D)`` and, where the model has a rule head,
    ``rule_logits`` ``(N, R)``.

    Raises:
        WeightsError: the config is not valid for this rpm_lib, or the tensors do not fit the model it describes.
    """
    try:
        # compilation and the accelerator are choices of the machine that trained it, not part of the model
        config = dataclasses.replace(TrainConfig.from_dict(dict(payload["config"]), source=f"{source}: config"),
                                     compile=False, accelerator="cpu")
    except (ConfigError, TypeError, ValueError) as error:
        raise WeightsError(f"{source}: its config does not describe a model this rpm_lib builds ({error})") from None
    model = RpmModule(config, payload["num_rules"])
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except (RuntimeError, KeyError, TypeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WeightsError(f"{source}: the tensors do not fit a {config.encoder} model of setup {config.setup} "
                           f"({first})") from None
    return model.float().eval()


def load_final_weights(path: str | Path, sha256: str | None = None) -> RpmModule:
    """The model of a ``final_weights.pt`` (see :func:`model_from_payload`), its SHA-256 checked when given."""
    return model_from_payload(read_final_weights(path, sha256), source=str(path))
