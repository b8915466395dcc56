"""Notebook hygiene: templates are committed clean and parameterised; regression notebooks are executed.

Templates (``notebooks/*.ipynb``): no outputs, no execution counts, kernel ``python3``, exactly one cell
tagged ``parameters`` whose every assignment papermill recognises, the first code cell sets
``NO_ALBUMENTATIONS_UPDATE=1``, widget cells are guarded by ``interactive`` and come after a static figure,
and ``03_train`` exposes every ``TrainConfig`` field with its default. Regression notebooks
(``tests/notebooks/*.ipynb``): every code cell executed (nbval needs stored counts), no image payloads, no
machine paths in outputs.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import nbformat
import papermill
import pytest

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = sorted((REPO / "notebooks").glob("*.ipynb"))
REGRESSION = sorted((REPO / "tests" / "notebooks").glob("*.ipynb"))


def _code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


def _parameters_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"expected exactly one cell tagged 'parameters', found {len(tagged)}"
    return tagged[0]


def _assigned_names(source: str) -> dict[str, ast.AnnAssign | ast.Assign]:
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign):
            out[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                out[target.id] = node
    return out


def test_there_are_six_templates_and_three_regression_notebooks():
    assert [p.stem[:2] for p in TEMPLATES] == ["01", "02", "03", "04", "05", "06", "07", "08", "09"]
    assert len(REGRESSION) >= 3


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_template_is_clean_and_parameterised(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in _code_cells(nb):
        assert cell.outputs == [], f"{path.name}: a cell carries outputs (commit templates without outputs)"
        assert cell.execution_count is None, f"{path.name}: a cell carries an execution count"
    assert "widgets" not in nb.metadata, f"{path.name}: stored widget state"
    first = _code_cells(nb)[0]
    assert 'os.environ["NO_ALBUMENTATIONS_UPDATE"] = "1"' in first.source

    cell = _parameters_cell(nb)
    assigned = _assigned_names(cell.source)
    assert all(isinstance(n, ast.AnnAssign) for n in assigned.values()), f"{path.name}: untyped parameter"
    assert "output_dir" in assigned
    # The cell after the parameters reads parameters given as text (papermill -p) as their declared types.
    after = _code_cells(nb)[_code_cells(nb).index(cell) + 1]
    assert "notebook.check_parameters(globals())" in after.source, f"{path.name}: parameters are not type-checked"
    inspected = papermill.inspect_notebook(str(path))
    assert set(inspected) == set(assigned), (
        f"{path.name}: papermill does not parse {sorted(set(assigned) - set(inspected))} "
        "(one '=' per line, annotations like Optional[int], not 'int | None')")


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_widgets_are_optional_and_after_a_static_figure(path):
    nb = nbformat.read(path, as_version=4)
    cells = _code_cells(nb)
    widget_cells = [i for i, c in enumerate(cells) if "ipywidgets" in c.source]
    if not widget_cells:
        return
    assert "interactive" in _assigned_names(_parameters_cell(nb).source)
    first_figure = min(i for i, c in enumerate(cells) if "notebook.show(" in c.source)
    for i in widget_cells:
        source = cells[i].source
        assert source.startswith("# NBVAL_IGNORE_OUTPUT"), "widget output is not comparable (docs/notebooks.md)"
        assert "if interactive" in source, "widgets must be behind the `interactive` parameter"
        assert i > first_figure, "draw a static figure before any widget so headless runs show it"


def test_train_template_exposes_every_config_field():
    from rpm_lib.training.config import TrainConfig

    nb = nbformat.read(REPO / "notebooks" / "03_train.ipynb", as_version=4)
    assigned = _assigned_names(_parameters_cell(nb).source)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    fix = "run `python tools/regen_notebooks.py --sync-train-parameters`"
    assert set(assigned) - {"output_dir"} == set(fields), f"03_train parameters differ from TrainConfig: {fix}"
    for name, field in fields.items():
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        assert ast.literal_eval(assigned[name].value) == default, f"03_train default of {name} differs: {fix}"


@pytest.mark.parametrize("path", REGRESSION, ids=lambda p: p.stem)
def test_regression_notebook_is_executed_and_portable(path):
    nb = nbformat.read(path, as_version=4)
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    for cell in _code_cells(nb):
        assert cell.execution_count is not None, f"{path.name}: unexecuted cell (run tools/regen_notebooks.py)"
    assert any(c.outputs for c in _code_cells(nb))
    assert "image/png" not in text, "image payloads are not compared by nbval; regen_notebooks drops them"
    for machine_specific in ("/tmp/", "/work/", "/home/", "0x7f"):
        assert machine_specific not in text, f"{path.name}: output contains {machine_specific!r}"
    assert '"output_type": "error"' not in text


def test_runs_and_data_are_git_ignored():
    """Executed notebooks, run folders and generated data sets must never be committed."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["runs/table1/main/x/03_train.ipynb", "data/notebook-sample/center_single/RAVEN_0_train.npz"]
    result = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
    assert result.stdout.split() == paths


def test_sync_tool_writes_parameters_papermill_parses(tmp_path):
    """tools/regen_notebooks.py --sync-train-parameters: every TrainConfig field comes out typed and parseable."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("regen_notebooks", REPO / "tools" / "regen_notebooks.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]})]
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    assert tool.sync_train_parameters(path) is True and tool.sync_train_parameters(path) is False
    from rpm_lib.training.config import TrainConfig

    source = _parameters_cell(nbformat.read(path, as_version=4)).source
    assert set(papermill.inspect_notebook(str(path))) == set(TrainConfig.field_names()) | {"output_dir"}
    assert "int | None" not in source and "Optional[int]" in source
