"""Re-execute the nbval regression notebooks in place, so their stored outputs match the code again.

    .venv/bin/python tools/regen_notebooks.py                 # every tests/notebooks/*.ipynb
    .venv/bin/python tools/regen_notebooks.py tests/notebooks/augmentations.ipynb
    .venv/bin/python tools/regen_notebooks.py --sync-train-parameters   # after TrainConfig changed

Run it after an intended change of behaviour and review the output diff (``git diff tests/notebooks``) before
committing. Each notebook runs top to bottom in a fresh ``python3`` kernel (this interpreter's) with the
repository root as working directory. Image payloads (``image/png``) are dropped afterwards: nbval never
compares them (only the figure's ``text/plain`` repr, which is kept), and they would bloat the repository.
The executed notebook is written only if every cell succeeded.

``--sync-train-parameters`` rewrites the ``parameters`` cell of the template ``notebooks/03_train.ipynb``
from ``rpm_lib.training.TrainConfig`` (every field, its type, default and help), which
``tests/test_notebook_hygiene.py`` requires; the template stays without outputs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import typing
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
REGRESSION_DIR = REPO / "tests" / "notebooks"
TRAIN_TEMPLATE = REPO / "notebooks" / "03_train.ipynb"
#: The one parameter of 03_train that is not a TrainConfig field.
TRAIN_EXTRA_PARAMETERS = ('output_dir: str = ""  # figures (PNG) and tables (CSV, MD) of this notebook; '
                          "empty: <run_dir>/03_train")

#: Output payloads removed after execution (never compared by nbval, large in git).
DROPPED_MIME_TYPES = ("image/png", "image/jpeg", "image/svg+xml")


def strip_payloads(nb: nbformat.NotebookNode) -> int:
    """Drop image payloads and widget state from an executed notebook; returns how many payloads went."""
    dropped = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            for mime in DROPPED_MIME_TYPES:
                if mime in data:
                    del data[mime]
                    dropped += 1
            output.get("metadata", {}).pop("image/png", None)
    nb.metadata.pop("widgets", None)
    return dropped


def regenerate(path: Path, timeout: int = 600) -> None:
    """Execute ``path`` in place (see the module docstring)."""
    nb = nbformat.read(path, as_version=4)
    os.environ["NO_ALBUMENTATIONS_UPDATE"] = "1"
    client = NotebookClient(nb, kernel_name="python3", timeout=timeout, record_timing=False,
                            resources={"metadata": {"path": str(REPO)}})
    client.execute()
    dropped = strip_payloads(nb)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    print(f"{path.relative_to(REPO)}: {len(nb.cells)} cells executed, {dropped} image payloads dropped")


def _annotation(tp: object) -> str:
    """Annotation text papermill can parse: ``Optional[int]`` / ``Union[int, float]``, never ``int | None``."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = typing.get_args(tp)
        if len(args) == 2 and type(None) in args:
            return f"Optional[{_annotation(next(a for a in args if a is not type(None)))}]"
        return f"Union[{', '.join(_annotation(a) for a in args)}]"
    if origin is list:
        return f"list[{_annotation(typing.get_args(tp)[0])}]"
    if origin is dict:
        return "dict"
    return getattr(tp, "__name__", str(tp))


def train_parameters_source() -> str:
    """The ``parameters`` cell of 03_train: one typed line per TrainConfig field, grouped, with its help."""
    from rpm_lib.training.config import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    lines: list[str] = []
    group = None
    for field in dataclasses.fields(TrainConfig):
        if field.metadata.get("group") != group:
            group = field.metadata.get("group")
            lines.append(f"# --- {group} " + "-" * (93 - len(str(group))))
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        # papermill skips a line with a second "=" (its parser splits on it), so help text must have none.
        text = re.sub(r"\s*=\s*", ": ", field.metadata.get("help", ""))
        if "choices" in field.metadata:
            text += f" [{', '.join(map(str, field.metadata['choices']))}]"
        literal = json.dumps(default) if isinstance(default, str) else repr(default)
        lines.append(f"{field.name}: {_annotation(hints[field.name])} = {literal}  # {text}")
    lines.append("# --- notebook " + "-" * 87)
    lines.append(TRAIN_EXTRA_PARAMETERS)
    return "\n".join(lines)


def sync_train_parameters(path: Path = TRAIN_TEMPLATE) -> bool:
    """Rewrite 03_train's ``parameters`` cell from TrainConfig; returns whether it changed."""
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise SystemExit(f"{path}: expected one cell tagged 'parameters', found {len(cells)}")
    source = train_parameters_source()
    if cells[0].source == source:
        return False
    cells[0].source = source
    nbformat.write(nb, path)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: tests/notebooks/*.ipynb")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    parser.add_argument("--sync-train-parameters", action="store_true",
                        help="only rewrite the parameters cell of notebooks/03_train.ipynb from TrainConfig")
    args = parser.parse_args(argv)
    if args.sync_train_parameters:
        changed = sync_train_parameters()
        print(f"{TRAIN_TEMPLATE.relative_to(REPO)}: parameters cell {'rewritten' if changed else 'already in sync'}")
        return 0
    paths = args.notebooks or sorted(REGRESSION_DIR.glob("*.ipynb"))
    if not paths:
        print(f"no notebooks under {REGRESSION_DIR}", file=sys.stderr)
        return 1
    for path in paths:
        regenerate(path.resolve(), args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
