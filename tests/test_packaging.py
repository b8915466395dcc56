"""Packaging: pyproject.toml's dependencies cover every import, admit every pin, and its console scripts resolve.

Two places hold versions: ``requirements.txt`` / ``requirements-dev.txt`` pin the tested set exactly (``make install``
installs those, then rpm_lib with ``--no-deps``), and ``pyproject.toml`` declares compatible ranges so that
``pip install .`` / ``pip install -e .`` in an existing environment gives a package that imports. These tests keep
the two consistent with each other and with the code:

* every third-party module imported anywhere in ``rpm_lib/`` (AST walk over every ``.py`` file, imports inside
  functions included) maps to a declared runtime dependency. The one exception is the ``notebooks`` extra: a module
  imported only by the notebook helpers (``NOTEBOOK_HELPERS``: ``notebook_execution.py``, ``notebook.py``,
  ``batch.py``, ``batch_config.py``) may be declared there instead, and must then be imported inside a function, so that
  ``import rpm_lib.batch`` and
  ``rpm-batch --help`` work without the extra (executing a notebook needs ``pip install 'rpm_lib[notebooks]'``);
* every declared runtime dependency is imported somewhere (no stale entries);
* everything the test suite itself imports is declared (runtime, ``notebooks`` or ``dev``);
* every pin in the requirements files satisfies the declared range of that distribution, and every pin is either
  declared or listed in ``TRANSITIVE_PINS`` with its reason; albumentations stays exactly 2.0.8 everywhere;
* the running environment (built from the pins) satisfies every declared range;
* every ``[project.scripts]`` entry names an importable callable whose ``--help`` works;
* (slow) ``pip install -e .`` of a copy of the project into a fresh venv that sees this environment's packages
  resolves every dependency with ``--no-index`` (nothing to download), installs only rpm_lib, and the console
  scripts run.
"""
from __future__ import annotations

import ast
import importlib
import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "rpm_lib"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT_NAME = canonicalize_name(PYPROJECT["project"]["name"])
REQUIREMENT_FILES = ("requirements.txt", "requirements-dev.txt")

#: Import name -> distribution name, where they differ (everything else: the import name is the distribution name).
IMPORT_TO_DIST = {
    "cv2": "opencv-python-headless",
    "yaml": "pyyaml",
    "PIL": "pillow",
    "IPython": "ipython",
    "sklearn": "scikit-learn",
    "skimage": "scikit-image",
    "pytorch_lightning": "pytorch-lightning",
    "lightning": "lightning",
    "albumentations": "albumentations",
}
#: rpm_lib modules whose third-party imports may come from the ``notebooks`` extra (imported inside functions).
NOTEBOOK_HELPERS = frozenset({"notebook_execution.py", "notebook.py", "batch.py", "batch_config.py", "notebook_cli.py"})
#: Modules that may import the ``cluster`` extra (submitit), inside functions: ``rpm-batch --executor slurm``.
CLUSTER_HELPERS = frozenset({"slurm.py", "slurm_task.py", "slurm_start.py"})
#: Pinned in requirements*.txt without being a declared dependency: rpm_lib never imports them directly.
TRANSITIVE_PINS = {
    "torchmetrics": "lightning's own dependency; pinned so the tested set is reproducible",
    "execnet": "pytest-xdist's own dependency (how it talks to its test processes); pinned likewise",
}


def _requirements(entries: list[str]) -> list[Requirement]:
    return [Requirement(entry) for entry in entries]


def runtime_requirements() -> list[Requirement]:
    return _requirements(PYPROJECT["project"].get("dependencies", []))


def extra_requirements(extra: str) -> list[Requirement]:
    """The extra's requirements, with references to this project's own extras (``rpm_lib[notebooks]``) expanded."""
    out: list[Requirement] = []
    for requirement in _requirements(PYPROJECT["project"].get("optional-dependencies", {}).get(extra, [])):
        if canonicalize_name(requirement.name) == PROJECT_NAME:
            for inner in sorted(requirement.extras):
                out += extra_requirements(inner)
        else:
            out.append(requirement)
    return out


def by_name(requirements: list[Requirement]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in requirements}


def all_declared() -> dict[str, list[Requirement]]:
    """Canonical name -> every declared requirement on it (runtime and every extra)."""
    out: dict[str, list[Requirement]] = {}
    extras = PYPROJECT["project"].get("optional-dependencies", {})
    for requirement in runtime_requirements() + [r for extra in extras for r in extra_requirements(extra)]:
        out.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return out


def distribution_of(module: str) -> str:
    return canonicalize_name(IMPORT_TO_DIST.get(module, module))


def imports_in(path: Path) -> list[tuple[str, bool]]:
    """``(top-level module, imported inside a function)`` for every absolute import in ``path``.

    Counts ``import x``, ``from x import y`` and ``importlib.import_module("x")`` / ``__import__("x")`` with a literal.
    """
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name.split(".")[0], in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], in_function))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                found.append((node.args[0].value.split(".")[0], in_function))
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def third_party_imports(root: Path, local: set[str] = frozenset()) -> dict[str, dict[str, bool]]:
    """Module -> {file relative to ``root``: imported only inside functions there}, stdlib and rpm_lib excluded."""
    out: dict[str, dict[str, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        for module, lazy in imports_in(path):
            if module in sys.stdlib_module_names or module == "rpm_lib" or module in local or module == "__future__":
                continue
            files = out.setdefault(module, {})
            relative = path.relative_to(root).as_posix()
            files[relative] = files.get(relative, True) and lazy
    return out


def pins() -> dict[str, tuple[str, str]]:
    """Canonical name -> (version, file) for every ``name==version`` line of the requirements files."""
    out: dict[str, tuple[str, str]] = {}
    for filename in REQUIREMENT_FILES:
        for line in (REPO / filename).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            requirement = Requirement(line)
            (specifier,) = requirement.specifier  # exactly one ==, nothing else
            assert specifier.operator == "==", f"{filename}: {line!r} is not an exact pin"
            out[canonicalize_name(requirement.name)] = (specifier.version, filename)
    return out


def test_import_scanner_sees_eager_lazy_and_dynamic_imports(tmp_path):
    (tmp_path / "mod.py").write_text(
        "import os, numpy.linalg as la\nfrom yaml import safe_load\nfrom . import sibling\nimport importlib\n"
        "class C:\n    import cv2\n"
        "def f():\n    import papermill\n    from PIL import Image\n    return importlib.import_module('scipy.stats')\n"
        "async def g():\n    __import__('tqdm')\n")
    found = third_party_imports(tmp_path)
    assert {m: files["mod.py"] for m, files in found.items()} == {
        "numpy": False, "yaml": False, "cv2": False, "papermill": True, "PIL": True, "scipy": True, "tqdm": True}


def test_every_rpm_lib_import_is_a_declared_dependency():
    runtime = set(by_name(runtime_requirements()))
    notebooks = set(by_name(extra_requirements("notebooks")))
    cluster = set(by_name(extra_requirements("cluster")))
    missing = []
    for module, files in sorted(third_party_imports(PACKAGE).items()):
        dist = distribution_of(module)
        notebook_only = all(Path(f).name in NOTEBOOK_HELPERS for f in files)
        cluster_only = all(Path(f).name in CLUSTER_HELPERS for f in files)
        allowed = runtime | notebooks if notebook_only else runtime | cluster if cluster_only else runtime
        if dist not in allowed:
            where = "runtime dependencies or the notebooks extra" if notebook_only else "runtime dependencies"
            missing.append(f"{module} ({dist}, imported by {', '.join(sorted(files))}) is not in the {where}")
    assert not missing, "\n".join(missing)


def test_notebooks_extra_imports_are_lazy():
    notebooks_only = set(by_name(extra_requirements("notebooks"))) - set(by_name(runtime_requirements()))
    eager = [f"{module} at the top of rpm_lib/{f}"
             for module, files in third_party_imports(PACKAGE).items() if distribution_of(module) in notebooks_only
             for f, lazy in files.items() if not lazy]
    assert not eager, "imports from the notebooks extra must sit inside functions: " + "; ".join(sorted(eager))


def test_every_runtime_dependency_is_imported():
    imported = {distribution_of(module) for module in third_party_imports(PACKAGE)}
    unused = sorted(set(by_name(runtime_requirements())) - imported)
    assert not unused, f"declared but never imported by rpm_lib: {unused} (move to an extra or drop)"


def test_test_suite_imports_are_declared():
    tests = REPO / "tests"
    local = {p.stem for p in tests.rglob("*.py")} | {p.name for p in tests.iterdir() if p.is_dir()}  # helpers, folders
    declared = set(all_declared())
    missing = sorted(f"{module} ({distribution_of(module)}) in {', '.join(sorted(files))}"
                     for module, files in third_party_imports(tests, local).items()
                     if distribution_of(module) not in declared)
    assert not missing, "tests import undeclared distributions (add them to the dev extra): " + "; ".join(missing)


def test_import_name_map_matches_installed_distributions():
    """The explicit IMPORT_TO_DIST agrees with what the installed distributions say they provide."""
    provided = metadata.packages_distributions()
    wrong = []
    for module in third_party_imports(PACKAGE):
        owners = {canonicalize_name(d) for d in provided.get(module, [])}
        if owners and distribution_of(module) not in owners:
            wrong.append(f"{module}: mapped to {distribution_of(module)}, installed by {sorted(owners)}")
    assert not wrong, "; ".join(wrong)


def test_requirement_pins_satisfy_the_declared_ranges():
    declared = all_declared()
    problems = []
    for name, (version, filename) in sorted(pins().items()):
        if name not in declared:
            if name not in TRANSITIVE_PINS:
                problems.append(f"{filename}: {name}=={version} is neither declared in pyproject.toml "
                                f"nor listed in TRANSITIVE_PINS")
            continue
        for requirement in declared[name]:
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{filename}: {name}=={version} is outside pyproject.toml's {requirement}")
    assert not problems, "\n".join(problems)


def test_every_runtime_dependency_is_pinned():
    pinned = pins()
    unpinned = [name for name in by_name(runtime_requirements()) if name not in pinned]
    assert not unpinned, f"runtime dependencies without a pin in requirements.txt: {unpinned}"


def test_albumentations_stays_at_the_last_mit_release():
    runtime = by_name(runtime_requirements())
    assert str(runtime["albumentations"].specifier) == "==2.0.8"
    assert pins()["albumentations"][0] == "2.0.8"
    for name in all_declared() | pins():
        assert name != "albumentationsx", "albumentationsx is AGPL: rpm_lib stays on albumentations 2.0.8"


def test_installed_environment_satisfies_the_declared_ranges():
    """The environment built from the pins (``make install``) meets every range; runtime and notebooks are required."""
    required = set(by_name(runtime_requirements())) | set(by_name(extra_requirements("notebooks")))
    problems = []
    for name, requirements in sorted(all_declared().items()):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name in required:
                problems.append(f"{name} is not installed")
            continue
        for requirement in requirements:
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"installed {name} {version} is outside {requirement}")
    assert not problems, "\n".join(problems)


SCRIPTS = sorted(PYPROJECT["project"].get("scripts", {}).items())


def test_console_scripts_are_declared():
    assert {name for name, _ in SCRIPTS} >= {"rpm-data", "rpm-generate", "rpm-train", "rpm-batch"}


@pytest.mark.parametrize(("script", "target"), SCRIPTS, ids=[name for name, _ in SCRIPTS])
def test_console_script_points_at_an_importable_callable(script, target, capsys):
    module_name, _, attribute = target.partition(":")
    assert attribute, f"{script} = {target!r}: expected 'module:callable'"
    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    assert callable(obj), f"{script}: {target} is not callable"
    with pytest.raises(SystemExit) as exit_info:
        obj(["--help"])
    assert exit_info.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out


def _copy_project(destination: Path) -> Path:
    """What an sdist would hold: pyproject.toml, README.md and the package (no caches)."""
    destination.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, destination / name)
    shutil.copytree(PACKAGE, destination / "rpm_lib", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return destination


@pytest.mark.slow
def test_editable_install_into_an_existing_environment_resolves_offline(tmp_path):
    """``pip install -e .`` in a fresh venv that sees this environment's packages: nothing to fetch, scripts run.

    The "existing environment" is this interpreter's site-packages minus rpm_lib itself, exposed to the fresh venv
    through a ``.pth`` (a folder of symlinks). pip runs with ``--no-index`` and no pip configuration, so a declared
    dependency that the pinned environment lacks, or a range it does not meet, fails the install.
    """
    site = Path(sysconfig.get_paths()["purelib"])
    existing = tmp_path / "existing"
    existing.mkdir()
    for entry in site.iterdir():
        if entry.name.lower().startswith(("rpm_lib", "rpm-lib", "__editable__")) or entry.suffix == ".pth" \
                or entry.name == "__pycache__":
            continue
        (existing / entry.name).symlink_to(entry)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    venv_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                    check=True, capture_output=True, text=True).stdout.strip())
    (venv_site / "existing-environment.pth").write_text(f"{existing}\n")
    project = _copy_project(tmp_path / "project")
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
           "NO_ALBUMENTATIONS_UPDATE": "1", "MPLBACKEND": "Agg"}
    env.pop("PYTHONPATH", None)

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    install = run(str(python), "-m", "pip", "install", "--no-index", "--no-build-isolation", "-e", str(project))
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    installed = [canonicalize_name(name) for line in re.findall(r"^Successfully installed (.*)$", install.stdout,
                                                                re.MULTILINE) for name in line.split()]
    version = PYPROJECT["project"]["version"]
    assert installed == [canonicalize_name(f"{PROJECT_NAME}-{version}")], install.stdout[-3000:]  # nothing else

    probe = run(str(python), "-c",
                "import importlib.metadata as m, rpm_lib, rpm_lib.training, rpm_lib.data, rpm_lib.generator; "
                "print(rpm_lib.__file__); print('\\n'.join(m.requires('rpm_lib') or []))")
    assert probe.returncode == 0, probe.stderr[-3000:]
    lines = probe.stdout.splitlines()
    assert Path(lines[0]).resolve().is_relative_to(project.resolve()), lines[0]
    declared_runtime = {str(r) for r in runtime_requirements()}
    assert declared_runtime <= {str(Requirement(line)) for line in lines[1:]}, lines[1:]

    for script, _ in SCRIPTS:
        result = run(str(venv / "bin" / script), "--help")
        assert result.returncode == 0 and "usage:" in result.stdout, f"{script}: {result.stderr[-2000:]}"
