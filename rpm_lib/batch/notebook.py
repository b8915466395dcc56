"""A batch's template notebook: the parameters papermill can set in it (:func:`notebook_parameters`) and the check
of every run's parameters against them (:func:`check_parameters`), before any kernel starts.

papermill and nbformat (the ``notebooks`` extra) are imported inside the functions, so that ``rpm-batch --help``
works without them."""
from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rpm_lib.batch.config import BatchConfig, BatchConfigError, RunSpec, fail
from rpm_lib.typed_values import annotation_from_text, coerce


def notebook_parameters(path: Path) -> dict[str, Any]:
    """The parameters papermill can set in ``path`` (its cell tagged ``parameters``), each with the annotation the
    notebook holds its values to: for a template that checks them (``rpm_lib.notebook.check_parameters``), what
    :func:`rpm_lib.typed_values.annotation_from_text` reads; otherwise (and for annotations it does not read)
    None, since the notebook takes whatever it is given.

    Raises:
        BatchConfigError: the notebook has no such cell.
    """
    import nbformat
    import papermill

    found = papermill.inspect_notebook(str(path))
    if not found:
        raise BatchConfigError(f"{path}: no cell tagged 'parameters', so no parameter can be set")
    checked = any("check_parameters(globals()" in cell.source for cell in nbformat.read(path, as_version=4).cells
                  if cell.cell_type == "code")
    return {name: annotation_from_text(str(info.get("inferred_type_name") or "")) if checked else None
            for name, info in found.items()}


def check_parameters(config: BatchConfig, specs: Sequence[RunSpec]) -> None:
    """Every parameter a run sets must be a parameter of the template, of the type its ``parameters`` cell
    declares: a misspelling would otherwise run with the default silently, and a wrong type would fail each run
    only after its kernel started.

    Raises:
        BatchConfigError: naming the YAML, the grid, the parameter, the likely intended name and the template.
    """
    known = notebook_parameters(config.template)
    for spec in specs:
        for name, value in spec.parameters.items():
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise fail(config.path, f"grid {spec.grid}: {name!r} is not a parameter of {config.template}{hint}")
            if known[name] is not None:
                try:
                    # non-finite floats: the template's own call decides (its non_finite=...)
                    coerce(name, value, known[name], what="parameter", allow_non_finite=True)
                except ValueError as error:
                    raise fail(config.path, f"grid {spec.grid}, run {spec.name}: {error}") from None
