"""The import graph of rpm_lib: no module imports, directly or through others, a module that imports it back.

Every import statement counts, at module level and inside functions (a function-level import is a circle that only
waits for its first call); blocks under ``if TYPE_CHECKING:`` never run and do not count. Importing a name from a
package runs its ``__init__``, so ``from rpm_lib.batch import x`` inside ``rpm_lib.batch.cli`` is an edge to the package
too. The layers between packages are checked by ``lint-imports`` (the contract in pyproject.toml) in ``make test``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import rpm_lib

ROOT = Path(rpm_lib.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The rpm_lib modules that running ``path`` (module ``name``) may import, with the packages whose
    ``__init__`` those imports run."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found = set()
    for target in targets:
        # the module itself, and every package on the way whose __init__ the import runs
        parts = target.split(".")
        found |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)} & modules
    # a module's own ancestors are initialised before it runs: importing them is no edge back
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return found - ancestors - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in sorted(graph[node]):
            if child not in index:
                connect(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_rpm_lib_has_no_import_cycle_even_through_imports_inside_functions():
    assert _cycles(_graph()) == []


def test_the_graph_sees_imports_inside_functions_and_through_packages():
    graph = _graph()
    # module level
    assert "rpm_lib.rules" in graph["rpm_lib.rule_encodings"]
    # inside a function (rpm-notebook imports papermill's engine only when it executes)
    assert "rpm_lib.notebook_execution" in graph["rpm_lib.notebook_cli"]
    # a circle made on purpose is found
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: Prepended to the scripts below: ``loaded(*packages)`` names the modules of those packages the script has imported.
_LOADED = "import sys\ndef loaded(*packages):\n    return sorted(m for m in sys.modules if m.split('.')[0] in packages)\n"


def _printed_by_a_fresh_interpreter(script: str) -> str:
    """What ``script`` (after :data:`_LOADED`) prints in a new Python process: this one has imported everything."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LOADED + script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_rpm_batch_s_own_processes_read_configs_and_plan_stages_without_torch():
    # rpm-batch's own process reads every run's config for its live progress, and `rpm-batch status` only reads; a
    # SLURM task only starts its cell's kernel. torch cost each of them 2 s of start-up (Lightning 6 s).
    printed = _printed_by_a_fresh_interpreter(
        "from rpm_lib.batch import cli, local, slurm, slurm_task\n"
        "from rpm_lib.training import TrainConfig, stage_plan\n"
        "from rpm_lib.training.plans import trained_objectives\n"
        "config = TrainConfig(setup='mlcl_aug', finetune=True, answer_loss='copinet_contrast')\n"
        "assert [plan.name for plan in stage_plan(config)] == ['pretrain', 'linear', 'finetune']\n"
        "assert 'mlcl' in trained_objectives(config)\n"
        "print(loaded('torch', 'lightning'))\n")
    assert printed == "[]", printed[-2000:]


def test_notebook_figures_load_no_torch_and_their_dataset_reads_no_lightning():
    # Notebooks 06-08 only draw from run records; 04 and 05 read a run's test split. A kernel that imports torch
    # without need spends 2 s of start-up on it, one that imports Lightning 6 s.
    printed = _printed_by_a_fresh_interpreter(
        "from rpm_lib import notebook, results, rules, viz\n"
        "from rpm_lib.results import claims\n"
        "figures = loaded('torch', 'lightning')\n"
        "from rpm_lib.training.samples import make_dataset\n"
        "print(figures, loaded('lightning'))\n")
    assert printed == "[] []", printed[-2000:]
