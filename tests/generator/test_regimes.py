"""Attributeless-I-RAVEN regimes (docs/generator.md, "Generalisation regimes"): the train-rule truth table, the
train / test rule sets of every regime, exact tables, chi-square fidelity of draws, refusals, distractors,
files, and the reference A/Color files when available."""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from fractions import Fraction as F

import numpy as np
import pytest
from scipy.stats import chisquare

from rpm_lib.data import records
from rpm_lib.generator import sampling, writer
from rpm_lib.generator.api import generate_problem, generate_problems, problem_rng
from rpm_lib.generator.constants import CONFIG_SPECS
from rpm_lib.generator.regimes import (
    PRIMARY_REGIMES,
    REGIMES,
    Regime,
    do_enforce_train_set_rule,
    parse_held_out,
    regime_from_options,
)
from rpm_lib.generator.sampling import RandomStream, RegimeInfeasibleError, regime_rule_table, rule_table, sample_rules
from rpm_lib.rules import ATTRIBUTES, CONFIGURATIONS, RELATIONS
from conftest import reference_root

O_IC, O_IG = "in_center_single_out_center_single", "in_distribute_four_out_center_single"
GROUP = {"Position": 0, "Type": 1, "Size": 2, "Color": 3}

# ---------------------------------------------------------------------------------------------------------------
# 1. do_enforce_train_set_rule: every row of raven-datasets' tests/test_sampling.py (split, configuration,
#    component, held-out attribute, train rule, expected), plus the Out shape's Size-Arithmetic rows.
# ---------------------------------------------------------------------------------------------------------------

TRUTH_TABLE = [
    ("train", "center_single", 0, "Position", "Constant", True),
    ("test", "center_single", 0, "Position", "Constant", True),
    ("train", "distribute_four", 0, "Position", "Constant", True),
    ("test", "distribute_four", 0, "Position", "Constant", False),
    ("train", O_IG, 0, "Position", "Constant", True),
    ("test", O_IG, 0, "Position", "Constant", True),
    ("train", O_IG, 1, "Position", "Constant", True),
    ("test", O_IG, 1, "Position", "Constant", False),
    ("train", "center_single", 0, "Position", "Progression", False),
    ("test", "center_single", 0, "Position", "Progression", False),
    ("train", "distribute_four", 0, "Position", "Progression", True),
    ("test", "distribute_four", 0, "Position", "Progression", False),
    ("train", O_IG, 0, "Position", "Progression", False),
    ("test", O_IG, 0, "Position", "Progression", False),
    ("train", O_IG, 1, "Position", "Progression", True),
    ("test", O_IG, 1, "Position", "Progression", False),
    ("train", "center_single", 0, "Type", "Constant", True),
    ("test", "center_single", 0, "Type", "Constant", False),
    ("train", "distribute_four", 0, "Type", "Constant", True),
    ("test", "distribute_four", 0, "Type", "Constant", False),
    ("train", O_IG, 0, "Type", "Constant", True),
    ("test", O_IG, 0, "Type", "Constant", False),
    ("train", O_IG, 1, "Type", "Constant", True),
    ("test", O_IG, 1, "Type", "Constant", False),
    ("train", "center_single", 0, "Type", "Progression", True),
    ("test", "center_single", 0, "Type", "Progression", False),
    ("train", "distribute_four", 0, "Type", "Progression", True),
    ("test", "distribute_four", 0, "Type", "Progression", False),
    ("train", O_IG, 0, "Type", "Progression", True),
    ("test", O_IG, 0, "Type", "Progression", False),
    ("train", O_IG, 1, "Type", "Progression", True),
    ("test", O_IG, 1, "Type", "Progression", False),
    ("train", "center_single", 0, "Size", "Constant", True),
    ("test", "center_single", 0, "Size", "Constant", False),
    ("train", "distribute_four", 0, "Size", "Constant", True),
    ("test", "distribute_four", 0, "Size", "Constant", False),
    ("train", O_IG, 0, "Size", "Constant", True),
    ("test", O_IG, 0, "Size", "Constant", False),
    ("train", O_IG, 1, "Size", "Constant", True),
    ("test", O_IG, 1, "Size", "Constant", False),
    ("train", "center_single", 0, "Size", "Progression", True),
    ("test", "center_single", 0, "Size", "Progression", False),
    ("train", "distribute_four", 0, "Size", "Progression", True),
    ("test", "distribute_four", 0, "Size", "Progression", False),
    ("train", O_IG, 0, "Size", "Progression", True),
    ("test", O_IG, 0, "Size", "Progression", False),
    ("train", O_IG, 1, "Size", "Progression", True),
    ("test", O_IG, 1, "Size", "Progression", False),
    ("train", O_IG, 0, "Size", "Arithmetic", False),
    ("test", O_IG, 0, "Size", "Arithmetic", False),
    ("train", O_IC, 0, "Size", "Arithmetic", False),
    ("train", O_IC, 1, "Size", "Arithmetic", True),
    ("train", "center_single", 0, "Color", "Constant", True),
    ("test", "center_single", 0, "Color", "Constant", False),
    ("train", "distribute_four", 0, "Color", "Constant", True),
    ("test", "distribute_four", 0, "Color", "Constant", False),
    ("train", O_IG, 0, "Color", "Constant", True),
    ("test", O_IG, 0, "Color", "Constant", True),
    ("train", O_IG, 1, "Color", "Constant", True),
    ("test", O_IG, 1, "Color", "Constant", False),
    ("train", "center_single", 0, "Color", "Progression", True),
    ("test", "center_single", 0, "Color", "Progression", False),
    ("train", "distribute_four", 0, "Color", "Progression", True),
    ("test", "distribute_four", 0, "Color", "Progression", False),
    ("train", O_IG, 0, "Color", "Progression", False),
    ("test", O_IG, 0, "Color", "Progression", False),
    ("train", O_IG, 1, "Color", "Progression", True),
    ("test", O_IG, 1, "Color", "Progression", False),
]


@pytest.mark.parametrize("split, configuration, component, attribute, rule, expected", TRUTH_TABLE)
def test_do_enforce_train_set_rule_truth_table(split, configuration, component, attribute, rule, expected):
    assert do_enforce_train_set_rule(split, configuration, component, GROUP[attribute], rule) is expected
    if split == "train":  # val is train-like: the same answer
        assert do_enforce_train_set_rule("val", configuration, component, GROUP[attribute], rule) is expected


@pytest.mark.parametrize("args, message", [
    (("validation", "center_single", 0, 3, "Constant"), "split must be one of train, val, test"),
    (("train", "centre", 0, 3, "Constant"), "unknown configuration 'centre'"),
    (("train", "center_single", 1, 3, "Constant"), "component of center_single must be 0..0"),
    (("train", "center_single", 0, 4, "Constant"), "group must be 0..3"),
    (("train", "center_single", 0, 3, "XOR"), "unknown rule 'XOR'"),
])
def test_do_enforce_refuses_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        do_enforce_train_set_rule(*args)


# ---------------------------------------------------------------------------------------------------------------
# 2. Rule sets per regime, configuration, component and split kind (the spec's table, written out by hand).
#    Codes: C P A D3 (relation of groups 1-3); for Number/Position "C" or "<relation>-N" / "<relation>-P".
# ---------------------------------------------------------------------------------------------------------------

C, P, A, D3 = "C", "P", "A", "D3"
SIX = {"P-N", "P-P", "A-N", "A-P", "D3-N", "D3-P"}
_CODE = {"Constant": C, "Progression": P, "Arithmetic": A, "Distribute_Three": D3}

# (configuration, component) -> {primary regime: (train/val rule set, test rule set)}
PRIMARY_SPEC: dict[tuple[str, int], dict[str, tuple[set, set]]] = {
    ("center_single", 0): {"A/Color": ({C}, {P, A, D3}), "A/Size": ({C}, {P, A, D3}), "A/Type": ({C}, {P, D3}),
                           "A/Position": ({C}, {C})},
    ("distribute_four", 0): {"A/Color": ({C}, {P, A, D3}), "A/Size": ({C}, {P, A, D3}), "A/Type": ({C}, {P, D3}),
                             "A/Position": ({C}, SIX)},
    ("distribute_nine", 0): {"A/Color": ({C}, {P, A, D3}), "A/Size": ({C}, {P, A, D3}), "A/Type": ({C}, {P, D3}),
                             "A/Position": ({C}, SIX)},
    **{(cfg, c): {"A/Color": ({C}, {P, A, D3}), "A/Size": ({C}, {P, A, D3}), "A/Type": ({C}, {P, D3}),
                  "A/Position": ({C}, {C})}
       for cfg in ("left_center_single_right_center_single", "up_center_single_down_center_single") for c in (0, 1)},
    (O_IC, 0): {"A/Color": ({C}, {C}), "A/Size": ({C}, {P, D3}), "A/Type": ({C}, {P, D3}), "A/Position": ({C}, {C})},
    (O_IC, 1): {"A/Color": ({C}, {P, A, D3}), "A/Size": ({C}, {P, A, D3}), "A/Type": ({C}, {P, D3}),
                "A/Position": ({C}, {C})},
    (O_IG, 0): {"A/Color": ({C}, {C}), "A/Size": ({C}, {P, D3}), "A/Type": ({C}, {P, D3}), "A/Position": ({C}, {C})},
    (O_IG, 1): {"A/Color": ({C}, {P, A, D3}), "A/Size": ({C}, {P, A, D3}), "A/Type": ({C}, {P, D3}),
                "A/Position": ({C}, SIX)},
}
PRIMARY_GROUP = {"A/Position": 0, "A/Type": 1, "A/Size": 2, "A/Color": 3}
# Size progressions restricted to steps +-1 in test (only 3 or 4 Size levels there).
PLUS_MINUS_ONE_ONLY = {(O_IC, 0), (O_IG, 0), (O_IG, 1)}
_OUT_SHAPES = {(O_IC, 0), (O_IG, 0)}


def _expected_sets(regime_name: str, configuration: str, component: int) -> dict[int, tuple[set, set]]:
    """{held-out group: (train set, test set)} of a registered regime, from the hand-written spec table."""
    key = (configuration, component)
    pairs = {"A/ColorSize": ("A/Color", "A/Size"), "A/ColorType": ("A/Color", "A/Type"),
             "A/SizeType": ("A/Size", "A/Type")}
    if regime_name in PRIMARY_GROUP:
        return {PRIMARY_GROUP[regime_name]: PRIMARY_SPEC[key][regime_name]}
    if regime_name in pairs:  # each held-out group independently follows the primary table
        return {PRIMARY_GROUP[r]: PRIMARY_SPEC[key][r] for r in pairs[regime_name]}
    rule = {"A/Color-Progression": P, "A/Color-Arithmetic": A, "A/Color-DistributeThree": D3}[regime_name]
    if key in _OUT_SHAPES:  # the Out shape's single colour: Constant in every split
        return {3: ({C}, {C})}
    return {3: ({rule}, {C, P, A, D3} - {rule})}


ATTRIBUTELESS = [name for name, regime in REGIMES.items() if regime.held_out]
CELLS = [(cfg, c) for cfg in CONFIGURATIONS for c in range(len(CONFIG_SPECS[cfg].components))]


def _code(name: str, attr: str, group: int) -> str:
    code = _CODE[name]
    return code if group > 0 or code == C else f"{code}-{attr[0]}"


def _support(table) -> set:
    return {(o.name, o.attr) for o in table}


def test_the_registry_has_the_ten_named_regimes_and_plain_iraven():
    assert set(ATTRIBUTELESS) == {"A/Color", "A/Position", "A/Size", "A/Type", "A/ColorSize", "A/ColorType",
                                  "A/SizeType", "A/Color-Progression", "A/Color-Arithmetic",
                                  "A/Color-DistributeThree"}
    assert PRIMARY_REGIMES == ("A/Color", "A/Position", "A/Size", "A/Type")
    assert REGIMES["I-RAVEN"].held_out == () and not REGIMES["I-RAVEN"].mesh
    assert REGIMES["A/ColorType"].held_out == ((1, "Constant"), (3, "Constant"))
    assert REGIMES["A/Color-DistributeThree"].held_out == ((3, "Distribute_Three"),)


@pytest.mark.parametrize("regime_name", ATTRIBUTELESS)
def test_table_supports_match_the_spec(regime_name):
    regime = REGIMES[regime_name]
    for configuration, component in CELLS:
        layout = CONFIG_SPECS[configuration].components[component][1]
        expected = _expected_sets(regime_name, configuration, component)
        assert set(expected) == set(regime.held_out_rules)
        for group in range(4):
            for split in ("train", "val", "test"):
                table = regime_rule_table(configuration, component, group, split, regime)
                assert sum(o.probability for o in table) == 1
                if group not in expected:  # not held out: plain I-RAVEN's table, whatever the split
                    assert table == rule_table(layout, group)
                    continue
                codes = {_code(o.name, o.attr, group) for o in table}
                want = expected[group][1 if split == "test" else 0]
                assert codes == want, f"{regime_name} {configuration} c{component} g{group} {split}"
                if group == 2 and split == "test" and (configuration, component) in PLUS_MINUS_ONE_ONLY:
                    assert {o.value for o in table if o.name == "Progression"} == {-1, 1}
        assert regime_rule_table(configuration, component, 0, "val", regime) == \
            regime_rule_table(configuration, component, 0, "train", regime)


def test_a_position_test_split_is_in_distribution_outside_the_grids():
    """The caveat the docs state: A/Position's test rules differ from train only in 2x2, 3x3 and O-IG's grid."""
    ood = {(cfg, c) for cfg, c in CELLS
           if regime_rule_table(cfg, c, 0, "test", "A/Position") != regime_rule_table(cfg, c, 0, "train", "A/Position")}
    assert ood == {("distribute_four", 0), ("distribute_nine", 0), (O_IG, 1)}


# ---------------------------------------------------------------------------------------------------------------
# 3. Exact probabilities (the spec's examples)
# ---------------------------------------------------------------------------------------------------------------


def _by_code(table, group):
    out: dict[str, F] = Counter()
    for o in table:
        out[_code(o.name, o.attr, group)] += o.probability
    return dict(out)


def test_exact_probabilities_of_the_spec_examples():
    assert _by_code(regime_rule_table("distribute_four", 0, 0, "test", "A/Position"), 0) == {
        "P-N": F(1, 10), "P-P": F(1, 10), "A-N": F(1, 5), "A-P": F(1, 5), "D3-N": F(1, 5), "D3-P": F(1, 5)}
    out_size = regime_rule_table(O_IC, 0, 2, "test", "A/Size")
    assert _by_code(out_size, 2) == {D3: F(2, 3), P: F(1, 3)}
    assert {(o.value, o.probability) for o in out_size if o.name == "Progression"} == {(-1, F(1, 6)), (1, F(1, 6))}
    assert _by_code(regime_rule_table("center_single", 0, 3, "test", "A/Color-Progression"), 3) == {
        C: F(1, 3), A: F(1, 3), D3: F(1, 3)}
    assert _by_code(regime_rule_table("center_single", 0, 1, "test", "A/Type"), 1) == {P: F(1, 2), D3: F(1, 2)}
    # train of a Constant regime: Constant with probability 1 and the unpruned start range
    (only,) = regime_rule_table("distribute_nine", 0, 3, "train", "A/Color")
    assert (only.name, only.probability, only.start) == ("Constant", 1, (0, 9))


# ---------------------------------------------------------------------------------------------------------------
# 4. Sampled draws: chi-square against the exact tables (primary regimes, 20,000 draws per configuration and
#    split kind), exact support over >= 2,000 draws for the extended regimes and for val.
# ---------------------------------------------------------------------------------------------------------------

DRAWS = 20_000
SUPPORT_DRAWS = 2_000


def _draw_counts(configuration, regime, split, draws, seed):
    stream = RandomStream(np.random.default_rng(seed))
    counts: Counter = Counter()
    for _ in range(draws):
        rules, _ranges = sample_rules(configuration, stream, regime, split)
        counts.update((i, r.name, r.attr, r.value) for i, r in enumerate(rules))
    return counts


def _check_against_tables(counts, configuration, regime, split, draws, chi_square: bool):
    for component in range(len(CONFIG_SPECS[configuration].components)):
        for group in range(4):
            table = regime_rule_table(configuration, component, group, split, regime)
            slot = 4 * component + group
            seen = {(n, a, v): k for (i, n, a, v), k in counts.items() if i == slot}
            keys = [(o.name, o.attr, o.value) for o in table]
            where = f"{regime} {configuration} c{component} g{group} {split}"
            assert set(seen) == set(keys), f"{where}: sampled support {sorted(seen)} != table {keys}"
            if chi_square and len(keys) > 1:
                observed = [seen[k] for k in keys]
                result = chisquare(observed, [float(o.probability) * draws for o in table])
                assert result.pvalue > 1e-3, f"{where}: {dict(zip(keys, observed))}"


@pytest.mark.parametrize("regime_name", PRIMARY_REGIMES)
@pytest.mark.parametrize("split", ["train", "test"])
def test_primary_regime_draws_follow_the_exact_tables(regime_name, split):
    """Chi-square per (configuration, component, group), fixed seeds (cannot flake); the non-held-out groups
    are checked against plain I-RAVEN's table in the same draws."""
    for index, configuration in enumerate(CONFIGURATIONS):
        seed = 1000 * PRIMARY_REGIMES.index(regime_name) + 10 * index + (split == "test")
        counts = _draw_counts(configuration, regime_name, split, DRAWS, seed)
        _check_against_tables(counts, configuration, regime_name, split, DRAWS, chi_square=True)


@pytest.mark.parametrize("regime_name", ATTRIBUTELESS)
def test_every_regime_samples_exactly_the_table_support_in_every_split(regime_name):
    for index, configuration in enumerate(CONFIGURATIONS):
        for split in ("train", "val", "test"):
            counts = _draw_counts(configuration, regime_name, split, SUPPORT_DRAWS, 77 + index)
            _check_against_tables(counts, configuration, regime_name, split, SUPPORT_DRAWS, chi_square=False)


def test_non_held_out_groups_draw_the_same_rules_as_plain_iraven():
    """One uniform per (component, group) in every regime: with the same stream, the groups a regime does not
    hold out get exactly the rules plain I-RAVEN gets."""
    for configuration in CONFIGURATIONS:
        for k in range(200):
            plain, _ = sample_rules(configuration, problem_rng(3, configuration, k))
            for regime_name in ("A/Color", "A/SizeType"):
                held = REGIMES[regime_name].held_out_rules
                ruled, _ = sample_rules(configuration, problem_rng(3, configuration, k), regime_name, "test")
                for i, (a, b) in enumerate(zip(plain, ruled)):
                    if i % 4 not in held:
                        assert a == b


# Digest of 20 balanced problems per configuration (seed 2024) made by the generator before regimes existed
# (commit 01e3582): plain I-RAVEN must stay bit-identical, in every split.
PLAIN_IRAVEN_DIGEST = "5d498e4111fe4a2f8be9e418d6a99e7bcf12a061403c95b7c39040209ff3c2fe"


def _digest(**kwargs) -> str:
    h = hashlib.sha256()
    for configuration in CONFIGURATIONS:
        for p in generate_problems(configuration, 20, seed=2024, **kwargs):
            h.update(repr((p.context, p.candidates, p.target, p.rules, p.modified)).encode())
    return h.hexdigest()


def test_plain_iraven_is_bit_identical_to_the_generator_before_regimes():
    assert _digest() == PLAIN_IRAVEN_DIGEST
    assert _digest(regime="I-RAVEN", split="test") == PLAIN_IRAVEN_DIGEST
    assert _digest(regime=Regime("mine"), val=0, test=10) == PLAIN_IRAVEN_DIGEST
    assert _digest(regime="A/Color") != PLAIN_IRAVEN_DIGEST  # the digest does see the rules


# ---------------------------------------------------------------------------------------------------------------
# 5. Building regimes; refusals
# ---------------------------------------------------------------------------------------------------------------


def test_parse_held_out_and_regime_from_options():
    assert parse_held_out("color") == (3, "Constant")
    assert parse_held_out("Color:progression") == (3, "Progression")
    assert parse_held_out("NUMBER:distribute_three") == (0, "Distribute_Three")
    assert parse_held_out("size:DistributeThree") == (2, "Distribute_Three")
    assert regime_from_options() == REGIMES["I-RAVEN"]
    assert regime_from_options(held_out=["color"]) == REGIMES["A/Color"]
    assert regime_from_options(held_out=["type", "color"]) == REGIMES["A/ColorType"]
    assert regime_from_options(held_out=["color:Arithmetic"]) == REGIMES["A/Color-Arithmetic"]
    assert regime_from_options(regime="A/Size") is REGIMES["A/Size"]
    assert regime_from_options(mesh=True) == REGIMES["I-RAVEN-Mesh"]
    custom = regime_from_options(held_out=["size:Progression", "position"])
    assert custom.held_out == ((0, "Constant"), (2, "Progression"))
    assert custom.name == "A/custom(Number/Position:Constant,Size:Progression)"
    assert Regime.from_json(json.dumps(custom.to_json())) == custom


@pytest.mark.parametrize("call, message", [
    (lambda: parse_held_out("type:Arithmetic"), "there is no Arithmetic on Type"),
    (lambda: parse_held_out("shape"), "unknown attribute 'shape'"),
    (lambda: parse_held_out("color:XOR"), "unknown rule 'XOR'"),
    (lambda: parse_held_out(""), "expected ATTR"),
    (lambda: Regime("x", ((1, "Arithmetic"),)), "no Arithmetic on Type"),
    (lambda: Regime("x", ((3, "Constant"),), mesh=True), "Mesh component cannot be combined"),
    (lambda: Regime("x", ((3, "Constant"), (3, "Progression"))), "held out twice"),
    (lambda: Regime("x", ((4, "Constant"),)), "group must be 0..3"),
    (lambda: regime_from_options(held_out=["color"], mesh=True), "--mesh cannot be combined with --held-out"),
    (lambda: regime_from_options(regime="A/Color", mesh=True), "--mesh cannot be combined"),
    (lambda: regime_from_options(regime="A/Color", held_out=["size"]), "exclude each other"),
    (lambda: regime_from_options(held_out=["position", "number"]), "Number/Position given 2 times"),
    (lambda: regime_from_options(regime="A/Colour"), "unknown regime 'A/Colour'"),
    (lambda: sample_rules("center_single", np.random.default_rng(0), "A/Color", "validation"), "split must be"),
    (lambda: generate_problem("center_single", np.random.default_rng(0), split="dev"), "split must be"),
    (lambda: regime_rule_table("center_single", 1, 3, "test", "A/Color"), "component of center_single"),
    (lambda: Regime.from_json({"regime": "A/Color", "held_out": {"Size": "Constant"}, "mesh": False}),
     "registered regime"),
    (lambda: Regime.from_json("{"), "not valid JSON"),
])
def test_invalid_combinations_raise_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message) as error:
        call()
    assert "\n" not in str(error.value)


def test_the_mesh_has_no_original_candidates(tmp_path):
    # The Mesh itself is tested in test_mesh.py; RAVEN (original) candidates never had one.
    with pytest.raises(ValueError, match="not defined for a Mesh problem"):
        generate_problem("center_single", np.random.default_rng(0), "original", regime="I-RAVEN-Mesh")
    with pytest.raises(ValueError, match="not defined for a Mesh problem"):
        writer.write_dataset(tmp_path / "mesh", ["center_single"], count=1, mode="original", regime="I-RAVEN-Mesh",
                             progress=False)
    assert not (tmp_path / "mesh").exists(), "refused before anything is written"


def test_a_restricted_menu_without_feasible_option_raises_naming_where(monkeypatch):
    # No public regime reaches this (type:Arithmetic and Mesh + held-out are refused when the regime is built),
    # so stand in a menu that cannot run on the Out shape: Arithmetic on its single Color level.
    monkeypatch.setattr(sampling, "restricted_menu", lambda *args: (("Arithmetic", "Color", (1, -1)),))
    sampling._held_out_table.cache_clear()
    sampling._sampling_plan.cache_clear()
    try:
        with pytest.raises(RegimeInfeasibleError, match=rf"no feasible rule for {O_IC} component 0 "
                                                        r"\(Out_Center_Single\), group 3 \(Color\), in the test split"):
            sample_rules(O_IC, np.random.default_rng(0), "A/Color", "test")
    finally:
        sampling._held_out_table.cache_clear()
        sampling._sampling_plan.cache_clear()


def test_regime_json_round_trips_for_every_registered_regime():
    for regime in REGIMES.values():
        data = regime.to_json()
        assert json.loads(json.dumps(data)) == data
        assert Regime.from_json(data) == regime
    assert REGIMES["A/Color"].to_json()["held_out"] == {"Color": "Constant"}
    assert REGIMES["A/Position"].to_json()["held_out"] == {"Number/Position": "Constant"}


# ---------------------------------------------------------------------------------------------------------------
# 6. Problems: the held-out attribute still varies among distractors; the rules follow the split
# ---------------------------------------------------------------------------------------------------------------


def test_the_held_out_attribute_is_still_varied_among_distractors_in_train():
    problems = list(generate_problems("center_single", 300, seed=8, regime="A/Color", split="train"))
    assert all(p.rules[3].name == "Constant" for p in problems)
    varied = sum(any((0, "Color") in mods for mods in p.modified) for p in problems)
    assert varied >= 150, f"Color modified among the candidates in only {varied} of 300 problems"
    # and it is not a giveaway: some distractors keep the answer's colour in every such problem
    for p in problems[:50]:
        colors = [panel.components[0].entities[0].color for panel in p.candidates]
        assert colors.count(p.answer.components[0].entities[0].color) >= 2


def test_generated_problems_follow_their_split():
    for configuration in ("distribute_four", O_IG):
        for p in generate_problems(configuration, 60, seed=4, regime="A/Position"):
            split = p.extra["split"]
            assert split == writer.split_of(p.extra["index"])
            for component in range(len(CONFIG_SPECS[configuration].components)):
                rule = p.rules[4 * component]
                allowed = regime_rule_table(configuration, component, 0, split, "A/Position")
                assert (rule.name, rule.attr, rule.value) in {(o.name, o.attr, o.value) for o in allowed}


# ---------------------------------------------------------------------------------------------------------------
# 7. Files: an all-test folder, regime.json, refused resumes
# ---------------------------------------------------------------------------------------------------------------


def _meta_rules(meta_matrix: np.ndarray) -> dict[int, str]:
    """{meta_matrix row: relation} of the non-empty rows."""
    return {row: RELATIONS[int(np.argmax(meta_matrix[row, :4]))] for row in range(meta_matrix.shape[0])
            if meta_matrix[row].any()}


def test_an_all_test_folder_and_its_regime_json(tmp_path):
    configurations = ["center_single", O_IG]
    summary = writer.write_dataset(tmp_path, configurations, count=12, seed=3, regime="A/Color", val=0, test=10,
                                   progress=False)
    assert summary == {"total": 24, "skipped": 0, "written": 24}
    for configuration in configurations:
        names = sorted(p.name for p in (tmp_path / configuration).iterdir())
        assert names == sorted(f"RAVEN_{k}_test.{ext}" for k in range(12) for ext in ("npz", "xml"))
        for k in range(12):
            with np.load(tmp_path / configuration / f"RAVEN_{k}_test.npz") as data:
                assert data["meta_matrix"].shape == (8, 9)  # I-RAVEN's format in every Attributeless regime
                rules = _meta_rules(data["meta_matrix"])
            if configuration == O_IG:
                assert rules[3] == "Constant"      # the Out shape's colour cannot change
                assert rules[7] != "Constant"      # the In grid's colour must
            else:
                assert rules[3] != "Constant"
    record = json.loads((tmp_path / records.REGIME_FILE).read_text())
    assert {k: record[k] for k in ("regime", "held_out", "mesh", "seed", "mode", "val", "test")} == {
        "regime": "A/Color", "held_out": {"Color": "Constant"}, "mesh": False, "seed": 3, "mode": "balanced",
        "val": 0, "test": 10}
    assert record["description"] == REGIMES["A/Color"].description and record["version"]
    assert Regime.from_json(record) == REGIMES["A/Color"]


def test_a_resumed_write_with_other_regime_or_splits_is_refused(tmp_path):
    writer.write_dataset(tmp_path, ["center_single"], count=2, seed=5, regime="A/Color", progress=False)
    with pytest.raises(records.GeneratorSettingsError, match=r"regime 'A/Color' there, 'A/Size' asked"):
        writer.write_dataset(tmp_path, ["center_single"], count=3, seed=5, regime="A/Size", progress=False)
    with pytest.raises(records.GeneratorSettingsError, match=r"test 2 there, 3 asked"):
        writer.write_dataset(tmp_path, ["center_single"], count=3, seed=5, regime="A/Color", test=3, progress=False)
    with pytest.raises(records.GeneratorSettingsError, match=r"regime 'A/Color' there, 'I-RAVEN' asked"):
        writer.write_dataset(tmp_path, ["center_single"], count=3, seed=5, progress=False)
    assert writer.write_dataset(tmp_path, ["center_single"], count=3, seed=5, regime="A/Color",
                                progress=False)["written"] == 1


def test_a_settings_record_from_before_regimes_reads_as_plain_iraven(tmp_path):
    writer.write_dataset(tmp_path, ["center_single"], count=1, seed=5, progress=False)
    (tmp_path / records.SETTINGS_FILE).write_text(json.dumps({"seed": 5, "mode": "balanced", "version": "0.1.0"}))
    (tmp_path / records.REGIME_FILE).unlink()
    with pytest.raises(records.GeneratorSettingsError, match="regime 'I-RAVEN' there, 'A/Type' asked"):
        writer.write_dataset(tmp_path, ["center_single"], count=2, seed=5, regime="A/Type", progress=False)
    assert writer.write_dataset(tmp_path, ["center_single"], count=2, seed=5, progress=False)["written"] == 1
    assert json.loads((tmp_path / records.REGIME_FILE).read_text())["regime"] == "I-RAVEN"


# ---------------------------------------------------------------------------------------------------------------
# 8. The reference A/Color files (raven-datasets, seed 42): every Color rule obeys its split's rule set
# ---------------------------------------------------------------------------------------------------------------


def test_reference_a_color_files_obey_the_a_color_rule_sets():
    root = reference_root("A-I-RAVEN-Color")
    files = sorted(root.glob("*/RAVEN_*_*.npz"))
    assert files, f"no .npz under {root}"
    seen_splits = Counter()
    for path in files:
        configuration = path.parent.name
        _, index, split = path.stem.split("_")
        assert split == writer.split_of(int(index)), path.name
        seen_splits[split] += 1
        with np.load(path) as data:
            meta = data["meta_matrix"]
        assert meta.shape == (12, 9) and not meta[8:].any(), f"{path.name}: no Mesh rows expected"
        rules = _meta_rules(meta)
        for component, (_, layout) in enumerate(CONFIG_SPECS[configuration].components):
            for group in range(4):
                row = 4 * component + group
                attrs = {ATTRIBUTES[j] for j in np.nonzero(meta[row, 4:])[0]}
                table = regime_rule_table(configuration, component, group, split, "A/Color")
                allowed = {o.name for o in table if attrs == ({"Number", "Position"} if o.attr == "Number/Position"
                                                               else {o.attr})}
                assert rules[row] in allowed, f"{configuration}/{path.name}: component {component} group {group} " \
                                              f"{rules[row]} on {sorted(attrs)} not in {sorted(allowed)}"
    assert set(seen_splits) == {"train", "val", "test"}
