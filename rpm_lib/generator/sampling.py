"""Rule sampling and constraint pruning, plus the buffered random stream the sampler uses.

See docs/generator.md, "Rule sampling and pruning".

The reference generator draws a whole rule set (number of components, then one menu entry and parameter per
component and rule group) and rejects it when the component count is wrong or a rule cannot be executed
from the layout's ranges. Feasibility factorises over (component, rule group), so the accepted distribution
is: independently per (component, group), the menu weight ``1/len(entries) * 1/len(params)`` restricted to
feasible entries and renormalised. :func:`rule_table` derives exactly that table from the pruning rules
(:func:`prune_range`, docs/generator.md "Pruning table") -- no rejection loop at sampling time.

Deliberate deviation: the reference consumes numpy's legacy global RNG in a particular call order; here every
draw comes from the caller's ``np.random.Generator`` through :class:`RandomStream` (blocks of uniform floats
turned into integers), so outputs are distribution-identical, not bit-identical, to the reference files.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from rpm_lib.generator.constants import CONFIG_SPECS, LAYOUTS, RULE_MENU, LayoutSpec
from rpm_lib.generator.problem import Rule

__all__ = [
    "RandomStream",
    "ComponentRanges",
    "RuleOption",
    "prune_range",
    "pruned_ranges",
    "rule_table",
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
        for i in range(k):
            j = i + int(self.random() * (n - i))
            pool[i], pool[j] = pool[j], pool[i]
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


@lru_cache(maxsize=None)
def rule_table(layout_name: str, group: int) -> tuple[RuleOption, ...]:
    """The conditional distribution of rule group ``group`` (0 N/P, 1 Type, 2 Size, 3 Color) on a layout.

    Exact probabilities (``Fraction``), derived from the menu (``constants.RULE_MENU``) and
    :func:`prune_range`: infeasible options are dropped and the rest renormalised.
    """
    if layout_name not in LAYOUTS:
        raise ValueError(f"unknown layout {layout_name!r}; expected one of {sorted(LAYOUTS)}")
    spec = LAYOUTS[layout_name]
    low, high = getattr(spec, _GROUP_RANGE_FIELD[group])
    menu = RULE_MENU[group]
    options: list[tuple[str, str, int, Fraction, tuple[int, int]]] = []
    for name, attr, params in menu:
        weight = Fraction(1, len(menu))
        for value in params or (0,):
            start = prune_range(name, attr, value, low, high)
            if start[0] <= start[1]:
                options.append((name, attr, value, weight / max(len(params), 1), start))
    total = sum(option[3] for option in options)
    return tuple(RuleOption(n, a, v, p / total, s) for n, a, v, p, s in options)


@lru_cache(maxsize=None)
def _cumulative(layout_name: str, group: int) -> tuple[tuple[float, ...], tuple[RuleOption, ...]]:
    table = rule_table(layout_name, group)
    bounds, acc = [], Fraction(0)
    for option in table:
        acc += option.probability
        bounds.append(float(acc))
    bounds[-1] = 2.0  # guard against float rounding at the top end
    return tuple(bounds), table


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
    configuration: str, rng: "np.random.Generator | RandomStream"
) -> tuple[list[Rule], list[ComponentRanges]]:
    """Sample the 4 rules of every component of ``configuration`` and their pruned first-panel ranges.

    Returns ``(rules, ranges)``: ``rules`` ordered (component, group N/P, Type, Size, Color), ``ranges``
    one :class:`ComponentRanges` per component.
    """
    if configuration not in CONFIG_SPECS:
        raise ValueError(f"unknown configuration {configuration!r}; expected one of {list(CONFIG_SPECS)}")
    stream = RandomStream.of(rng)
    rules: list[Rule] = []
    ranges: list[ComponentRanges] = []
    for component, (_, layout_name) in enumerate(CONFIG_SPECS[configuration].components):
        starts = []
        for group in range(4):
            bounds, table = _cumulative(layout_name, group)
            u = stream.random()
            k = 0
            while u >= bounds[k]:
                k += 1
            option = table[k]
            rules.append(Rule(component, option.name, option.attr, option.value))
            starts.append(option.start)
        ranges.append(ComponentRanges(LAYOUTS[layout_name], *starts))
    return rules, ranges
