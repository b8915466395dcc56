"""Package-level consistency: the vocabularies that several modules rely on agree with each other."""
from rpm_lib import rules
from rpm_lib.generator import constants


def test_every_configuration_has_a_generator_spec_and_a_short_name():
    assert set(rules.CONFIGURATIONS) == set(constants.CONFIG_SPECS)
    assert set(rules.SHORT_NAMES) == set(rules.CONFIGURATIONS)
    assert len(set(rules.SHORT_NAMES.values())) == 7


def test_every_layout_used_by_a_configuration_is_defined():
    for spec in constants.CONFIG_SPECS.values():
        for _component, layout in spec.components:
            assert layout in constants.LAYOUTS
            assert layout in constants.META_STRUCTURE_FORMAT


def test_meta_target_format_is_relations_then_attributes():
    assert rules.META_TARGET_FORMAT[:4] == ("Constant", "Progression", "Arithmetic", "Distribute_Three")
    assert rules.META_TARGET_FORMAT[4:] == ("Number", "Position", "Type", "Size", "Color")


def _module_level_imports(path, modules: set[str]) -> set[str]:
    """rpm_lib modules imported at module level by ``path`` (``if TYPE_CHECKING:`` blocks excluded)."""
    import ast

    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found & modules


def test_rpm_lib_has_no_import_cycle():
    from pathlib import Path

    root = Path(rules.__file__).parent
    paths = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        paths[name] = path
    graph = {name: _module_level_imports(path, set(paths)) - {name} for name, path in paths.items()}

    def cycle_from(start: str, node: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for child in graph[node]:
            if child == start:
                return seen + (child,)
            if child not in seen and child > start:  # each cycle is found from its smallest member
                found = cycle_from(start, child, seen + (child,))
                if found:
                    return found
        return None

    cycles = [c for c in (cycle_from(name, name, (name,)) for name in sorted(graph)) if c]
    assert not cycles, f"import cycles: {cycles}"
    assert graph["rpm_lib.training.config"] >= {"rpm_lib.training.setups", "rpm_lib.rule_encodings"}


def test_every_folder_of_test_files_is_collected():
    # pytest skips every folder whose basename matches a norecursedirs pattern, at any depth: "data" (meant for a
    # top-level dataset folder) once hid tests/data, and its 135 tests never ran in `make test`.
    import fnmatch
    import tomllib
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    options = tomllib.loads((tests.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    hidden = {folder.relative_to(tests.parent).as_posix() for folder in {path.parent for path in tests.rglob("test_*.py")}
              if any(fnmatch.fnmatch(part, pattern) for part in folder.relative_to(tests.parent).parts
                     for pattern in options["norecursedirs"])}
    assert not hidden, f"test folders that pytest never collects (pyproject.toml norecursedirs): {sorted(hidden)}"
