"""``load_pretrained(name)``: a shipped model, its file checked against the registry, ready to score problems."""
from __future__ import annotations

from pathlib import Path

from rpm_lib.pretrained.registry import REGISTRY_FILE, PretrainedError, PretrainedModel, model_entry
from rpm_lib.training.final_weights import WeightsError, load_final_weights, sha256_of
from rpm_lib.training.module import RpmModule


def load_pretrained(name: str, device: str = "cpu", registry: Path = REGISTRY_FILE) -> RpmModule:
    """The shipped model ``name`` in eval mode, float32, on ``device``.

    The weights file's SHA-256 must equal the registry's, and it is read with ``torch.load(weights_only=True)``:
    a file that was altered or replaced is refused, and none can run code.

    ``model(panels)``, panels ``(N, 16, S, S)`` uint8 (or float in [0, 1]) with ``S = entry.image_size``, returns
    ``{"scores": (N, 8), "embeddings": (N, 8, D), "rule_logits": (N, R)}`` (the last only for models with a rule
    head); ``model.config`` is the run's config.

    Raises:
        PretrainedError: an unknown name, a missing file, or a file whose hash differs (one line each).
    """
    entry = model_entry(name, registry)
    try:
        model = load_final_weights(entry.weights_path(registry), entry.sha256)
    except WeightsError as error:
        raise PretrainedError(f"shipped model {name!r}: {error}") from None
    return model.to(device)


def verify(entry: PretrainedModel, registry: Path = REGISTRY_FILE) -> str | None:
    """Why ``entry``'s file cannot be used (missing, another SHA-256), or None when it matches the registry."""
    path = entry.weights_path(registry)
    if not path.is_file():
        return f"{path}: missing"
    found = sha256_of(path)
    return None if found == entry.sha256 else f"{path}: SHA-256 {found[:16]}… differs from the registry's"
