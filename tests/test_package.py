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
