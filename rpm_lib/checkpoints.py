"""Reading checkpoints from run folders that people share: plain tensors only, one line when a file is not one.

``torch.load(weights_only=True)`` never runs code from the file; its own error message, however, suggests
turning that safety off, which would. The messages here say what is wrong without that advice.
"""
from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any


def load_plain(path: Path, error: type[Exception], advice: str = "") -> dict[str, Any]:
    """The checkpoint in ``path`` (a mapping with a ``state_dict``), loaded on the CPU as plain tensors.

    Raises:
        error: ``checkpoint <path>: not loadable as plain weights (<why>)[; advice]``.
    """
    import torch

    suffix = f"; {advice}" if advice else ""
    try:
        with warnings.catch_warnings():
            # A raw pickle makes torch warn ("Detected pickle protocol ..., please file an issue") before the
            # refusal below: two lines of advice that do not apply.
            warnings.simplefilter("ignore")
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as problem:  # noqa: BLE001 - whatever the file is, the user gets one line
        raise error(f"checkpoint {path}: not loadable as plain weights ({_why(problem)}){suffix}") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise error(f"checkpoint {path}: not loadable as plain weights (no 'state_dict' mapping in it){suffix}")
    return checkpoint


def _why(problem: Exception) -> str:
    text = str(problem)
    if isinstance(problem, pickle.UnpicklingError) or "Weights only load failed" in text:
        return "it holds Python objects other than tensors and plain containers, or is not a checkpoint at all"
    if isinstance(problem, EOFError) or (isinstance(problem, RuntimeError)
                                         and ("zip" in text.lower() or "central directory" in text)):
        return "truncated or damaged file"
    return type(problem).__name__
