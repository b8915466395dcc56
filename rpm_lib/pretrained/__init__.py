"""Trained models that ship with rpm_lib, and what is needed to evaluate and inspect them on a laptop.

    from rpm_lib.pretrained import load_pretrained, read_registry
    read_registry()                                   # name -> PretrainedModel (what, how trained, what it scored)
    model = load_pretrained("scl-ce-aux-sparse-cpu48")  # eval mode, hash checked, weights_only loading

``rpm-pretrained list`` prints the table; ``rpm-pretrained evaluate NAME`` scores a model on freshly generated
problems beside its recorded test accuracy; ``notebooks/09_pretrained.ipynb`` draws the rest.
"""
from __future__ import annotations

from rpm_lib.pretrained.load import load_pretrained, verify
from rpm_lib.pretrained.registry import PretrainedError, PretrainedModel, model_entry, read_registry

__all__ = ["load_pretrained", "verify", "read_registry", "model_entry", "PretrainedModel", "PretrainedError"]
