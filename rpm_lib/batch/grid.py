"""How a batch's grids expand into runs (:func:`expand_grid`, one :class:`~rpm_lib.batch.config.RunSpec` per grid
point, in axis order) and how each run's folder is named from its labels (:func:`run_name`, :func:`slug`)."""
from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rpm_lib.batch.config import BatchConfig, RunSpec, fail


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
            raise fail(config.path, f"unknown grid(s) {missing}; defined: {list(known)}")
        selected = [known[g] for g in grids]
    else:
        selected = [g for g in config.grids if g.default]
        if not selected:
            raise fail(config.path, f"no grid has 'default: true'; name one with --grid ({', '.join(known)})")
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
                raise fail(config.path, f"grid {grid.name}: two runs would share the folder {name!r}")
            seen.add(name)
            specs.append(RunSpec(name=name, grid=grid.name, labels=labels, parameters=params))
    return specs
