"""What notebook 08 shows about a regime: rule mixes, shifted configurations, example pairs, in vs out."""
from __future__ import annotations

import pytest

from rpm_lib import regime_report, viz


def test_a_position_shifts_only_the_grids_and_a_color_shifts_every_configuration() -> None:
    assert regime_report.shifted_configurations("A/Position") == ["2x2Grid", "3x3Grid", "O-IG"]
    assert len(regime_report.shifted_configurations("A/Color")) == 7
    assert regime_report.shifted_configurations("I-RAVEN") == []
    assert regime_report.shifted_configurations("I-RAVEN-Mesh") == []


def test_rule_mix_gives_the_exact_tables() -> None:
    mix = regime_report.rule_mix("A/Position")
    assert set(mix) == {"train / val", "test"}
    assert mix["train / val"]["2x2Grid · Grid"] == {"Constant": 1.0}
    test = mix["test"]["2x2Grid · Grid"]
    assert test["Progression on Number"] == pytest.approx(0.1) and test["Arithmetic on Position"] == pytest.approx(0.2)
    assert mix["test"]["Center · Grid"] == {"Constant": 1.0}  # A/Position's caveat: Center is not shifted
    out_size = regime_report.rule_mix("A/Size")["test"]["O-IC · Out"]
    assert out_size == {"Progression": pytest.approx(1 / 3), "Distribute_Three": pytest.approx(2 / 3)}
    header, rows = regime_report.rule_mix_table(mix)
    assert header == ["configuration · component", "train / val", "test"] and rows[0][0] == "Center · Grid"
    assert viz.plot_rule_mix(mix).axes[1].images[0].get_array().shape == (11, 7)  # 11 components, 7 rules


def test_regime_examples_mark_the_held_out_rule_train_then_test() -> None:
    train, test = regime_report.regime_examples("A/Color", "Center", seed=3)
    assert train["title"] == "A/Color · Center · train / val" and test["title"] == "A/Color · Center · test"
    held = [[line for line in item["rule_lines"] if line.endswith("(held out)")] for item in (train, test)]
    assert held[0] == ["Grid: Constant on Color (held out)"]
    assert len(held[1]) == 1 and "on Color" in held[1][0] and "Constant" not in held[1][0]
    # The other rules are drawn alike from the same seed.
    assert [line for line in train["rule_lines"] if "held out" not in line] == \
        [line for line in test["rule_lines"] if "held out" not in line]
    assert train["panels"].shape == (16, 160, 160)


def test_distribution_accuracies_and_unshifted_configurations_from_metrics() -> None:
    metrics = {"test_sets": [
        {"name": "val", "distribution": "in-distribution", "accuracy": 0.5,
         "accuracy_per_configuration": {"center_single": 0.6}},
        {"name": "test", "distribution": "out-of-distribution", "accuracy": 0.25,
         "accuracy_per_configuration": {"center_single": 0.3},
         "configurations_in_distribution": ["center_single"]},
        {"name": "other", "distribution": "unknown", "accuracy": 0.9},
    ]}
    accuracy = regime_report.distribution_accuracies(metrics)
    assert accuracy == {"in-distribution": {"Average": 50.0, "Center": 60.0},
                        "out-of-distribution": {"Average": 25.0, "Center": 30.0}}
    assert regime_report.unshifted_in(metrics) == ["Center"]
    fig = viz.plot_in_vs_out(accuracy["in-distribution"], accuracy["out-of-distribution"], ["Center"])
    hatched = [bar.get_hatch() for bar in fig.axes[0].patches[:4]]
    assert hatched == [None, None, None, "//"]  # the Center OOD bar is hatched: not really shifted
