"""Augmentation showcases: what each transform of a recipe does to one RPM, in words and as images."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rpm_lib.viz.rpm import solved_matrix


def describe_applied(applied: Sequence[Any]) -> str:
    """Caption of ``RpmAugment.last_applied``: ``"hflip + rotate 37°"``; ``"identity"`` when no step changes
    the picture visibly (``rot90 ×0``, a rotation under 1.5°, a roll by (0, 0) are left out)."""
    return " + ".join(_visible_steps(applied)) or "identity"


def _visible_steps(applied: Sequence[Any]) -> list[str]:
    parts = []
    for t in applied:
        if t.name == "rotate":
            if abs(float(t.params["angle"])) >= 1.5:  # below that, no pixel of an 80 px panel moves visibly
                parts.append(f"rotate {t.params['angle']:.0f}°")
        elif t.name == "rot90":
            factor = t.params.get("factor")
            if factor is None or int(factor) % 4:
                parts.append(f"rot90 ×{factor if factor is not None else '?'}")
        elif t.name.startswith("roll"):
            dy, dx = t.params.get("dy", 0), t.params.get("dx", 0)
            if dy or dx:
                parts.append(f"{t.name} ({dy}, {dx})")
        else:
            parts.append(t.name)
    return parts


def single_transform_examples(panels: np.ndarray, target: int, preserve_position: bool,
                              names: Sequence[str], seed: int = 0) -> dict[str, np.ndarray]:
    """``{caption: solved matrix}``: the original, then the RPM under each single transform in ``names``.

    Every transform uses ``augment.single_transform(name, seed)``. A grid-shuffle / roll on an RPM with a
    position rule (``preserve_position``) is not applied (it would break the rule); its caption says so.
    """
    from rpm_lib import augment

    out = {"original": solved_matrix(panels, target)}
    for name in names:
        aug = augment.single_transform(name, seed=seed)
        result = aug(np.ascontiguousarray(panels), preserve_position=preserve_position)
        caption = describe_applied(aug.last_applied) if aug.last_applied else f"{name}: skipped (position rule)"
        out[caption if caption not in out else f"{caption} [{name}]"] = solved_matrix(result, target)
    return out


def recipe_examples(panels: np.ndarray, target: int, preserve_position: bool, recipe: str, count: int,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """``{caption: solved matrix}`` of ``count`` draws of ``RpmAugment(recipe, seed, p=1)`` (captions numbered).

    Draws that change nothing visibly (every transform of a recipe has its own probability, so a draw can
    apply none) are drawn again, up to 50 times per tile, so every tile shows an augmentation.
    """
    from rpm_lib import augment

    aug = augment.RpmAugment(recipe, seed=seed, p=1.0)
    out = {}
    for k in range(count):
        for _attempt in range(50):
            result = aug(np.ascontiguousarray(panels), preserve_position=preserve_position)
            if _visible_steps(aug.last_applied):
                break
        out[f"{k + 1}. {describe_applied(aug.last_applied)}"] = solved_matrix(result, target)
    return out
