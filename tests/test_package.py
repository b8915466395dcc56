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
