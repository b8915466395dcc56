"""What a generalisation regime changes, as tables and pictures (notebook ``08_generalisation``).

* :func:`rule_mix`: the exact probability of each rule on the held-out group, per configuration and component,
  in train/val vs test (from the generator's rule tables, no sampling);
* :func:`shifted_configurations`: the configurations whose test split is really out of distribution (in
  A/Position only 2x2Grid, 3x3Grid and O-IG: elsewhere Number/Position can only be Constant);
* :func:`regime_examples`: one generated train problem and one test problem of a configuration, rendered, with
  the held-out rule marked in the rule lines;
* :func:`distribution_accuracies`: a finished run's accuracy per configuration in and out of distribution, from
  ``metrics.json``'s ``test_sets``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpm_lib import rules

#: Split kinds of a regime: train and val follow the train rules, test the held-out ones.
SPLIT_KINDS: tuple[tuple[str, str], ...] = (("train / val", "train"), ("test", "test"))


def _rule_label(group: int, name: str, attr: str) -> str:
    # Number/Position rules differ by attribute (Progression on Number vs on Position); other groups by relation.
    return f"{name} on {attr}" if group == 0 and name != "Constant" else name


def rule_mix(regime: Any, group: int | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """``{split kind: {"<config> · <component>": {rule: probability}}}`` for one rule group of ``regime``.

    Args:
        regime: a ``rpm_lib.generator.regimes.Regime`` or a registered name (e.g. ``"A/Color"``).
        group: the rule group (0 Number/Position, 1 Type, 2 Size, 3 Color); default: the regime's first held-out
            group (Number/Position for a regime without one).
    Returns:
        Exact probabilities (floats) summed over rule parameters, for ``viz.plot_rule_mix``.
    """
    from rpm_lib.generator.constants import configuration_components
    from rpm_lib.generator.regimes import resolve_regime
    from rpm_lib.generator.sampling import regime_rule_table

    regime = resolve_regime(regime)
    if group is None:
        group = regime.held_out[0][0] if regime.held_out else 0
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind, split in SPLIT_KINDS:
        rows: dict[str, dict[str, float]] = {}
        for configuration in rules.CONFIGURATIONS:
            for component, (name, _layout) in enumerate(configuration_components(configuration, regime.mesh)):
                mix: dict[str, float] = {}
                for option in regime_rule_table(configuration, component, group, split, regime):
                    label = _rule_label(group, option.name, option.attr)
                    mix[label] = mix.get(label, 0.0) + float(option.probability)
                rows[f"{rules.SHORT_NAMES[configuration]} · {name}"] = mix
        out[kind] = rows
    return out


def shifted_configurations(regime: Any) -> list[str]:
    """Short names of the configurations where some held-out rule group's test rules differ from its train
    rules (every configuration for A/Color; only 2x2Grid, 3x3Grid and O-IG for A/Position; none for I-RAVEN);
    ``generator.sampling.configurations_drawn_alike`` decides."""
    from rpm_lib.generator.sampling import configurations_drawn_alike

    alike = set(configurations_drawn_alike(regime, regime, "test"))
    return [rules.SHORT_NAMES[c] for c in rules.CONFIGURATIONS if c not in alike]


def _governs(rule_line: str, group: str) -> bool:
    """Whether a rule line ("Left: Progression on Size") is a rule of ``group`` ("Size", "Number/Position")."""
    if group == rules.RULE_GROUPS[0]:
        return rule_line.endswith(("on Number", "on Position", "on Number/Position"))
    return rule_line.endswith(f"on {group}")


def regime_examples(regime: Any, configuration: str, seed: int = 0, index: int = 0) -> list[dict[str, Any]]:
    """One train and one test problem of ``configuration`` under ``regime``, as ``viz.plot_gallery`` items.

    With held-out groups both problems come from the same seeded stream (problem ``index``): the other rules are
    drawn alike, and the held-out group's rule (marked "(held out)" in the rule lines) is the train rule in one
    and a test rule in the other; values drawn after it may differ. Without held-out groups (I-RAVEN,
    I-RAVEN-Mesh) the test example is problem ``index + 1``: the splits do not differ.
    """
    from rpm_lib.generator.api import generate_problem, problem_rng
    from rpm_lib.generator.labels import problem_labels
    from rpm_lib.generator.regimes import resolve_regime
    from rpm_lib.generator.render import render_problem

    regime = resolve_regime(regime)
    configuration = rules.resolve_configuration(configuration)
    held = {rules.RULE_GROUPS[g] for g, _ in regime.held_out}
    items = []
    for k, (kind, split) in enumerate(SPLIT_KINDS):
        rng = problem_rng(seed, configuration, index + (0 if regime.held_out else k))
        problem = generate_problem(configuration, rng, regime=regime, split=split)
        lines = rules.describe_raven_rules(problem_labels(problem)["meta_matrix"], configuration)
        marked = [f"{line} (held out)" if any(_governs(line, g) for g in held) else line for line in lines]
        items.append({"panels": render_problem(problem), "target": int(problem.target), "rule_lines": marked,
                      "title": f"{regime.name} · {rules.SHORT_NAMES[configuration]} · {kind}"})
    return items


def distribution_accuracies(metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{"in-distribution": {configuration: %}, "out-of-distribution": {...}}`` from ``metrics["test_sets"]``.

    Each test set contributes its average (key ``"Average"``) and per-configuration accuracy (short names), in
    percent; when several sets share a distribution, the first one counts (the run's own data comes first).
    Sets whose distribution is unknown are left out.
    """
    out: dict[str, dict[str, float]] = {}
    for entry in metrics.get("test_sets", []):
        kind = entry.get("distribution")
        if kind not in ("in-distribution", "out-of-distribution") or kind in out:
            continue
        values = {"Average": 100 * float(entry["accuracy"])}
        for name, value in (entry.get("accuracy_per_configuration") or {}).items():
            values[rules.SHORT_NAMES.get(name, name)] = 100 * float(value)
        out[kind] = values
    return out


def unshifted_in(metrics: Mapping[str, Any]) -> list[str]:
    """Short names of the configurations that the run's first out-of-distribution test set draws exactly as in
    training (its ``configurations_in_distribution``; e.g. Center, L-R, U-D and O-IC in A/Position)."""
    for entry in metrics.get("test_sets", []):
        if entry.get("distribution") == "out-of-distribution":
            return [rules.SHORT_NAMES.get(c, c) for c in entry.get("configurations_in_distribution") or []]
    return []


def rule_mix_table(mix: Mapping[str, Mapping[str, Mapping[str, float]]]) -> tuple[list[str], list[list[Any]]]:
    """``(header, rows)`` of :func:`rule_mix` for a CSV / Markdown table: one row per configuration · component,
    the rules of each split kind as ``rule p`` lists."""
    kinds = list(mix)
    header = ["configuration · component", *kinds]
    names = list(dict.fromkeys(r for kind in kinds for r in mix[kind]))
    rows = [[name, *("; ".join(f"{rule} {p:.2f}" for rule, p in mix[kind].get(name, {}).items() if p > 0)
                     for kind in kinds)] for name in names]
    return header, rows


__all__ = ["SPLIT_KINDS", "distribution_accuracies", "regime_examples", "rule_mix", "rule_mix_table",
           "shifted_configurations", "unshifted_in"]
