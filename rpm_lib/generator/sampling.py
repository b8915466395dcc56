"""Rule sampling and constraint pruning, plus the buffered random stream the sampler uses.

See docs/generator.md, "Rule sampling and pruning".

The reference generator draws a whole rule set (number of components, then one menu entry and parameter per
component and rule group) and rejects it when the component count is wrong or a rule cannot be executed
from the layout's ranges. Feasibility factorises over (component, rule group), so the accepted distribution
is: independently per (component, group), the menu weight ``1/len(entries) * 1/len(params)`` restricted to
feasible entries and renormalised. :func:`rule_table` derives exactly that table from the pruning rules
(:func:`prune_range`, docs/generator.md "Pruning table") -- no rejection loop at sampling time.

Generalisation regimes (``regimes.py``, docs/generator.md "Generalisation regimes"): a held-out rule group
draws from a *restricted* menu (``regimes.restricted_menu``: the entries of the train rule, or of every other
rule) with the same weights ``1/len(restricted) * 1/len(params)``, the same pruning and the same
renormalisation (:func:`regime_rule_table`). The draw consumes exactly one uniform per (component, group) in
every regime, and plain I-RAVEN (``regime=None``) uses the very tables of :func:`rule_table`, so its draws are
bit-identical to those of the I-RAVEN-only sampler. A restricted menu without a feasible option raises
:class:`RegimeInfeasibleError` (the reference generator loops forever there). A Mesh regime
(docs/generator.md, "Mesh") appends the Mesh component, whose table is built the same way on its 12-slot
layout (``_mesh_plan``).

Deliberate deviation: the reference consumes numpy's legacy global RNG in a particular call order; here every
draw comes from the caller's ``np.random.Generator`` through :class:`RandomStream` (blocks of uniform floats
turned into integers), so outputs are distribution-identical, not bit-identical, to the reference files.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from rpm_lib.generator.constants import (
    CONFIG_SPECS,
    LAYOUTS,
    MESH_LAYOUT,
    RULE_MENU,
    LayoutSpec,
    configuration_components,
    mesh_component_index,
)
from rpm_lib.generator.problem import Rule
from rpm_lib.generator.regimes import Regime, is_test_split, resolve_regime, restricted_menu
from rpm_lib.rules import RULE_GROUPS

__all__ = [
    "RandomStream",
    "ComponentRanges",
    "RuleOption",
    "prune_range",
    "pruned_ranges",
    "rule_table",
    "regime_rule_table",
    "configurations_drawn_alike",
    "RegimeInfeasibleError",
    "sample_rules",
]


class RandomStream:
    """Fast scalar draws from one ``np.random.Generator``.

    Calling the Generator once per scalar costs ~1-3 us; the sampler needs hundreds of scalars per problem,
    so uniforms are fetched in blocks (``rng.random(block)``) and consumed from a Python list. Every draw is
    a deterministic function of the Generator's state, so the same seed gives the same problems.
    """

    __slots__ = ("_rng", "_block", "_buffer", "_pos")

    def __init__(self, rng: np.random.Generator, block: int = 512) -> None:
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"RandomStream needs a numpy.random.Generator, got {type(rng).__name__}")
        self._rng = rng
        self._block = block
        self._buffer: list[float] = []
        self._pos = 0

    @classmethod
    def of(cls, rng: "np.random.Generator | RandomStream") -> "RandomStream":
        """Wrap a Generator (or pass an existing stream through)."""
        return rng if isinstance(rng, RandomStream) else cls(rng)

    def random(self) -> float:
        """One uniform float in [0, 1)."""
        pos = self._pos
        if pos >= len(self._buffer):
            self._buffer = self._rng.random(self._block).tolist()
            pos = 0
        self._pos = pos + 1
        return self._buffer[pos]

    def integer(self, low: int, high: int) -> int:
        """Uniform integer in the inclusive range [low, high]."""
        return low + int(self.random() * (high - low + 1))

    def choice(self, items):
        """One uniformly chosen element of a non-empty sequence."""
        return items[int(self.random() * len(items))]

    def coin(self) -> bool:
        """True with probability 1/2."""
        return self.random() < 0.5

    def sample(self, n: int, k: int) -> list[int]:
        """``k`` distinct integers from ``range(n)`` in uniformly random order (like ``choice(n, k, False)``)."""
        pool = list(range(n))
        # random() inlined (the hottest loop of the generator): the same uniforms in the same order.
        buffer, pos = self._buffer, self._pos
        for i in range(k):
            if pos >= len(buffer):
                buffer = self._buffer = self._rng.random(self._block).tolist()
                pos = 0
            j = i + int(buffer[pos] * (n - i))
            pos += 1
            pool[i], pool[j] = pool[j], pool[i]
        self._pos = pos
        return pool[:k]

    def shuffle(self, items: list) -> None:
        """In-place uniform shuffle (Fisher-Yates)."""
        for i in range(len(items) - 1, 0, -1):
            j = int(self.random() * (i + 1))
            items[i], items[j] = items[j], items[i]


@dataclass(frozen=True)
class ComponentRanges:
    """Pruned, inclusive level ranges of one component's first panel (the "start" ranges of docs/generator.md,
    "Resulting rule distributions").

    ``layout`` keeps the unpruned ranges (``constants.LAYOUTS``); Arithmetic rules and the candidate
    generators need both.
    """

    layout: LayoutSpec
    number: tuple[int, int]
    type: tuple[int, int]
    size: tuple[int, int]
    color: tuple[int, int]

    @property
    def n_slots(self) -> int:
        return len(self.layout.slots)


@dataclass(frozen=True)
class RuleOption:
    """One row of a conditional rule table: the rule (component left 0), its probability, and the pruned
    range (levels, inclusive) of the attribute it governs -- Number for the Number/Position group."""

    name: str
    attr: str
    value: int
    probability: Fraction
    start: tuple[int, int]


def prune_range(name: str, attr: str, value: int, low: int, high: int) -> tuple[int, int]:
    """Narrow a first-panel level range so that rule ``(name, attr, value)`` can be executed.

    ``attr`` is the governed attribute (``"Number"``/``"Position"`` act on the Number range). Returns the new
    ``(low, high)``; the rule is infeasible when ``low > high``. Implements docs/generator.md, "Pruning table"
    (Python 2 ``/`` on ints is floor division, hence ``//``).
    """
    if name == "Constant":
        return low, high
    if name == "Progression":
        if attr == "Position":
            return low, high - 2 * abs(value)
        if value > 0:
            return low, high - 2 * value
        return low - 2 * value, high
    if name == "Arithmetic":
        if attr == "Position":
            if value > 0:
                return low, high - 1
            return (high + 2) // 2 - 1, high - 1
        if attr == "Color":
            if high - low < 1:
                return low, low - 1
            return (low, high - low) if value > 0 else (2 * low, high)
        # Number and Size: the third column is L1 + L2 + 1 (add) or L1 - L2 - 1 (sub) on levels
        if value > 0:
            return low, high - low - 1
        return 2 * low + 1, high
    if name == "Distribute_Three":
        if attr == "Position":
            # needs >= 3 distinct position sets: C(n_slots, k) >= 3 holds for 1 <= k <= n_slots - 1
            return (low, low - 1) if high + 1 < 3 else (low, high - 1)
        return (low, low - 1) if high - low + 1 < 3 else (low, high)
    raise ValueError(f"unknown rule name {name!r}")


_GROUP_RANGE_FIELD = ("number", "type", "size", "color")


MenuEntry = tuple[str, str, tuple[int, ...]]


class RegimeInfeasibleError(ValueError):
    """A (configuration, component, rule group, split) whose restricted rule menu has no feasible option."""


@lru_cache(maxsize=None)
def _menu_table(layout_name: str, group: int, entries: tuple[MenuEntry, ...]) -> tuple[RuleOption, ...]:
    """The conditional table of menu ``entries`` of ``group`` on a layout: entry weight ``1/len(entries)``, then
    ``1/len(params)``; infeasible options dropped, the rest renormalised. Empty when nothing is feasible."""
    spec = LAYOUTS[layout_name]
    low, high = getattr(spec, _GROUP_RANGE_FIELD[group])
    options: list[tuple[str, str, int, Fraction, tuple[int, int]]] = []
    for name, attr, params in entries:
        weight = Fraction(1, len(entries))
        for value in params or (0,):
            start = prune_range(name, attr, value, low, high)
            if start[0] <= start[1]:
                options.append((name, attr, value, weight / max(len(params), 1), start))
    total = sum(option[3] for option in options)
    return tuple(RuleOption(n, a, v, p / total, s) for n, a, v, p, s in options)


@lru_cache(maxsize=None)
def rule_table(layout_name: str, group: int) -> tuple[RuleOption, ...]:
    """The conditional distribution of rule group ``group`` (0 N/P, 1 Type, 2 Size, 3 Color) on a layout.

    Exact probabilities (``Fraction``), derived from the menu (``constants.RULE_MENU``) and
    :func:`prune_range`: infeasible options are dropped and the rest renormalised. This is plain I-RAVEN's
    table; :func:`regime_rule_table` is the regime-aware one.
    """
    if layout_name not in LAYOUTS:
        raise ValueError(f"unknown layout {layout_name!r}; expected one of {sorted(LAYOUTS)}")
    return _menu_table(layout_name, group, RULE_MENU[group])


def _cumulative_of(table: tuple[RuleOption, ...]) -> tuple[float, ...]:
    bounds, acc = [], Fraction(0)
    for option in table:
        acc += option.probability
        bounds.append(float(acc))
    bounds[-1] = 2.0  # guard against float rounding at the top end
    return tuple(bounds)


@lru_cache(maxsize=None)
def _cumulative(layout_name: str, group: int) -> tuple[tuple[float, ...], tuple[RuleOption, ...]]:
    table = rule_table(layout_name, group)
    return _cumulative_of(table), table


@lru_cache(maxsize=None)
def _held_out_table(configuration: str, component: int, group: int, is_test: bool,
                    held_out: tuple[tuple[int, str], ...]) -> tuple[RuleOption, ...]:
    # Keyed by the split *kind* and the held-out pairs (not the regime's name): "train" and "val" share
    # their tables, and regimes with equal held-out groups share theirs.
    layout_name = CONFIG_SPECS[configuration].components[component][1]
    split = "test" if is_test else "train"
    entries = restricted_menu(configuration, component, group, split, Regime("held-out", held_out))
    table = _menu_table(layout_name, group, entries) if entries else ()
    if not table:
        held = ", ".join(f"{RULE_GROUPS[g]}: {r}" for g, r in held_out)
        kind = "test split" if is_test else "train and val splits"
        raise RegimeInfeasibleError(
            f"no feasible rule for {configuration} component {component} ({layout_name}), group {group} "
            f"({RULE_GROUPS[group]}), in the {kind} with held out {{{held}}}: the restricted menu "
            f"{[e[0] + ' ' + e[1] for e in entries]} cannot be executed on this layout")
    return table


def regime_rule_table(configuration: str, component: int, group: int, split: str = "train",
                      regime: "Regime | str | None" = None) -> tuple[RuleOption, ...]:
    """The conditional distribution of rule group ``group`` of ``component`` of ``configuration`` in ``split``
    under ``regime`` (a :class:`~rpm_lib.generator.regimes.Regime`, a registered name, or None = I-RAVEN).

    Exact ``Fraction`` probabilities: the entries of ``regimes.restricted_menu`` with the menu weights, pruned
    and renormalised like :func:`rule_table` (which it returns unchanged for a group that is not held out).
    Raises :class:`RegimeInfeasibleError` (naming configuration, component, group and split) when no option is
    feasible, ``ValueError`` for unknown arguments.
    """
    regime = resolve_regime(regime)
    if configuration not in CONFIG_SPECS:
        raise ValueError(f"unknown configuration {configuration!r}; expected one of {list(CONFIG_SPECS)}")
    components = configuration_components(configuration, regime.mesh)
    if isinstance(component, bool) or not isinstance(component, int) or not 0 <= component < len(components):
        raise ValueError(f"component of {configuration} must be 0..{len(components) - 1}, got {component!r}")
    if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < len(RULE_MENU):
        raise ValueError(f"group must be 0..3 (Number/Position, Type, Size, Color), got {group!r}")
    is_test = is_test_split(split)
    if regime.mesh and component == mesh_component_index(configuration):
        return _mesh_plan(configuration)[1][group][1]
    if group not in regime.held_out_rules:
        return rule_table(components[component][1], group)
    return _held_out_table(configuration, component, group, is_test, regime.held_out)


@lru_cache(maxsize=None)
def _mesh_plan(configuration: str):
    """(layout, ((cumulative bounds, table) for the 4 groups)) of the Mesh component (docs/generator.md,
    "Mesh"): Number/Position from the whole menu (every entry feasible on 12 slots, 1/7 each), Type/Size/Color
    restricted to Constant (``regimes.restricted_menu(mesh_component=True)``). A Mesh never has held-out groups
    (``Regime`` refuses the combination), so the plan does not depend on the split."""
    mesh = mesh_component_index(configuration)
    groups = []
    for group in range(4):
        table = _menu_table(MESH_LAYOUT, group, restricted_menu(configuration, mesh, group, "train",
                                                                mesh_component=True))
        groups.append((_cumulative_of(table), table))
    return MESH_LAYOUT, tuple(groups)


@lru_cache(maxsize=None)
def _sampling_plan(configuration: str, is_test: bool, held_out: tuple[tuple[int, str], ...], mesh: bool = False):
    """Per component: (layout, ((cumulative bounds, table) for the 4 groups)), plus the Mesh last when
    ``mesh``. With nothing held out these are exactly the tables (and floats) of :func:`rule_table`, hence
    bit-identical draws."""
    held = dict(held_out)
    plan = []
    for component, (_, layout_name) in enumerate(CONFIG_SPECS[configuration].components):
        groups = []
        for group in range(4):
            if group in held:
                table = _held_out_table(configuration, component, group, is_test, held_out)
                groups.append((_cumulative_of(table), table))
            else:
                groups.append(_cumulative(layout_name, group))
        plan.append((layout_name, tuple(groups)))
    if mesh:
        plan.append(_mesh_plan(configuration))
    return tuple(plan)


def configurations_drawn_alike(trained: "Regime | str | None", evaluated: "Regime | str | None",
                               split: str = "test") -> list[str]:
    """Configurations (folder names) whose problems in ``split`` of ``evaluated`` draw every rule exactly as the
    training split of ``trained`` does: equal exact tables for every rule group either regime holds out.

    With one regime for both, the complement is where its test split is really out of distribution (A/Position:
    only 2x2Grid, 3x3Grid and O-IG shift; Center, L-R, U-D and O-IC are drawn alike). Mesh components are not
    compared (a Mesh regime holds nothing out).
    """
    trained, evaluated = resolve_regime(trained), resolve_regime(evaluated)
    groups = sorted(set(trained.held_out_rules) | set(evaluated.held_out_rules))
    alike = []
    for configuration, spec in CONFIG_SPECS.items():
        if all(regime_rule_table(configuration, c, g, "train", trained)
               == regime_rule_table(configuration, c, g, split, evaluated)
               for c in range(len(spec.components)) for g in groups):
            alike.append(configuration)
    return alike


def pruned_ranges(layout_name: str, rules: list[Rule]) -> ComponentRanges:
    """First-panel ranges of a layout under its 4 rules (ordered N/P, Type, Size, Color)."""
    spec = LAYOUTS[layout_name]
    ranges = [spec.number, spec.type, spec.size, spec.color]
    for group, rule in enumerate(rules):
        low, high = prune_range(rule.name, rule.attr, rule.value, *ranges[group])
        if low > high:
            raise ValueError(f"rule {rule} cannot be executed on layout {layout_name}")
        ranges[group] = (low, high)
    return ComponentRanges(spec, *ranges)


def sample_rules(
    configuration: str,
    rng: "np.random.Generator | RandomStream",
    regime: "Regime | str | None" = None,
    split: str = "train",
) -> tuple[list[Rule], list[ComponentRanges]]:
    """Sample the 4 rules of every component of ``configuration`` and their pruned first-panel ranges.

    ``regime`` (a ``Regime``, a registered name, or None = plain I-RAVEN) and ``split`` (``"train"``,
    ``"val"`` or ``"test"``; only train-like vs test matters) select the tables (:func:`regime_rule_table`).
    One uniform is consumed per (component, group) whatever the regime; with plain I-RAVEN the draws do not
    depend on ``split``. Returns ``(rules, ranges)``: ``rules`` ordered (component, group N/P, Type, Size,
    Color), ``ranges`` one :class:`ComponentRanges` per component -- with the Mesh last in a Mesh regime
    (its 4 rules drawn after the other components', so those are the rules plain I-RAVEN draws from the same
    stream). Raises :class:`RegimeInfeasibleError` when a restricted menu has no feasible option.
    """
    if configuration not in CONFIG_SPECS:
        raise ValueError(f"unknown configuration {configuration!r}; expected one of {list(CONFIG_SPECS)}")
    regime = resolve_regime(regime)
    plan = _sampling_plan(configuration, is_test_split(split), regime.held_out, regime.mesh)
    stream = RandomStream.of(rng)
    rules: list[Rule] = []
    ranges: list[ComponentRanges] = []
    for component, (layout_name, groups) in enumerate(plan):
        starts = []
        for bounds, table in groups:
            u = stream.random()
            k = 0
            while u >= bounds[k]:
                k += 1
            option = table[k]
            rules.append(Rule(component, option.name, option.attr, option.value))
            starts.append(option.start)
        ranges.append(ComponentRanges(LAYOUTS[layout_name], *starts))
    return rules, ranges
