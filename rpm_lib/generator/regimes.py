"""Generalisation regimes of the built-in generator: plain I-RAVEN and the Attributeless-I-RAVEN (A-I-RAVEN)
regimes (docs/generator.md, "Generalisation regimes").

A regime holds out one or more *rule groups* (0 Number/Position, 1 Type, 2 Size, 3 Color, the rows of a
component's ``meta_matrix`` block, ``rpm_lib.rules.RULE_GROUPS``), each with a *train-set rule* ``R``
(a relation of ``rpm_lib.rules.RELATIONS``, default Constant). In the train-like splits (``train`` and
``val``) a held-out group is governed by ``R`` wherever ``R`` is applicable to the component; in the
``test`` split it is governed by a rule *other than* ``R`` wherever that is applicable
(:func:`do_enforce_train_set_rule` decides, per configuration, component and group). Nothing else changes:
the other groups keep I-RAVEN's rule table, and rows, candidates, rendering and files are I-RAVEN's.

This module only decides *which menu entries* a (component, group) may use (:func:`restricted_menu`); the
exact probability tables and the draws are in ``sampling`` (``regime_rule_table``, ``sample_rules``).

Refused on purpose (one-line ``ValueError``):

* a held-out Type with train rule Arithmetic -- there is no Arithmetic on Type (the reference generator
  meant to refuse it too, but its check never fired and the run died later);
* the I-RAVEN-Mesh component together with held-out groups -- the reference generator loops forever in
  the test split there (the Mesh's fixed Type/Size/Color admit no non-Constant rule).

The Mesh component itself (``Regime.mesh``, the registered ``I-RAVEN-Mesh``) adds the I-RAVEN-Mesh line
lattice as a last component (docs/generator.md, "Mesh"); it has balanced candidates only.
"""
from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from typing import Iterable, Mapping

from rpm_lib.data.raw_files import SPLITS
from rpm_lib.generator.constants import CONFIG_SPECS, RULE_MENU
from rpm_lib.rules import CONFIGURATIONS, RELATIONS, RULE_GROUPS

__all__ = [
    "Regime",
    "REGIMES",
    "PRIMARY_REGIMES",
    "EXTENDED_REGIMES",
    "IRAVEN",
    "TEST_SPLIT",
    "ATTRIBUTE_GROUPS",
    "parse_held_out",
    "regime_from_options",
    "resolve_regime",
    "do_enforce_train_set_rule",
    "restricted_menu",
    "check_split",
    "is_test_split",
    "check_split_proportions",
    "split_of",
]

#: The one out-of-distribution split; every other split of ``rpm_lib.data.raw_files.SPLITS`` is train-like.
TEST_SPLIT: str = "test"

#: ``--held-out`` attribute names -> rule group index (0 Number/Position, 1 Type, 2 Size, 3 Color). Holding
#: out "position" or "number" holds out the whole Number/Position group, as the reference does.
ATTRIBUTE_GROUPS: dict[str, int] = {"position": 0, "number": 0, "number/position": 0, "type": 1, "size": 2,
                                    "color": 3}

# The configurations whose component 0 is the Out shape (Size 3..5, Color fixed to white).
_OUT_IN = frozenset(name for name, spec in CONFIG_SPECS.items() if spec.structure == "Out_In")
# (configuration, component) pairs whose Number/Position can change (a layout with several slots).
_GRID_COMPONENTS = frozenset((name, c) for name, spec in CONFIG_SPECS.items()
                             for c, (_, layout) in enumerate(spec.components)
                             if layout in ("Distribute_Four", "Distribute_Nine", "In_Distribute_Four"))


def _relation(text: str, what: str) -> str:
    """The relation of ``RELATIONS`` named by ``text`` (case-insensitive; '_' and '-' optional)."""
    key = text.strip().lower().replace("_", "").replace("-", "")
    for relation in RELATIONS:
        if relation.lower().replace("_", "") == key:
            return relation
    raise ValueError(f"{what}: unknown rule {text!r}; expected one of {', '.join(RELATIONS)}")


def _group(text: str, what: str) -> int:
    key = text.strip().lower()
    if key not in ATTRIBUTE_GROUPS:
        raise ValueError(f"{what}: unknown attribute {text!r}; expected one of position, number, type, size, color")
    return ATTRIBUTE_GROUPS[key]


@dataclass(frozen=True)
class Regime:
    """A generalisation regime.

    Attributes:
        name: e.g. ``"A/Color"``; the registered names are the keys of :data:`REGIMES`.
        held_out: ``(group, train rule)`` pairs, group 0 Number/Position, 1 Type, 2 Size, 3 Color, rule one
            of ``rpm_lib.rules.RELATIONS``; stored sorted by group, at most one rule per group. Empty for
            plain I-RAVEN.
        mesh: add the I-RAVEN-Mesh component (docs/generator.md, "Mesh").

    Raises ``ValueError`` (one line) for an unknown group or rule, a group given twice, Arithmetic on Type,
    and Mesh together with held-out groups.
    """

    name: str
    held_out: tuple[tuple[int, str], ...] = ()
    mesh: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"regime name must be a non-empty string, got {self.name!r}")
        pairs = []
        for item in self.held_out:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError(f"regime {self.name}: held_out entries are (group, rule) pairs, got {item!r}")
            group, rule = item
            if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < len(RULE_GROUPS):
                raise ValueError(f"regime {self.name}: held-out group must be 0..3 (Number/Position, Type, Size, "
                                 f"Color), got {group!r}")
            if rule not in RELATIONS:
                raise ValueError(f"regime {self.name}: unknown train rule {rule!r} for {RULE_GROUPS[group]}; "
                                 f"expected one of {', '.join(RELATIONS)}")
            pairs.append((group, rule))
        groups = [g for g, _ in pairs]
        if len(set(groups)) != len(groups):
            raise ValueError(f"regime {self.name}: a rule group is held out twice ({sorted(groups)})")
        if (1, "Arithmetic") in pairs:
            raise ValueError(f"regime {self.name}: Type cannot be held out with train rule Arithmetic (there is "
                             "no Arithmetic on Type)")
        if not isinstance(self.mesh, bool):
            raise ValueError(f"regime {self.name}: mesh must be True or False, got {self.mesh!r}")
        if self.mesh and pairs:
            raise ValueError(f"regime {self.name}: the Mesh component cannot be combined with held-out groups (the "
                             "Mesh's Type/Size/Color admit only Constant, so its test split would have no rule)")
        object.__setattr__(self, "held_out", tuple(sorted(pairs)))

    @property
    def held_out_rules(self) -> dict[int, str]:
        """``{group: train rule}``."""
        return dict(self.held_out)

    @property
    def description(self) -> str:
        """One line: what the regime holds out."""
        if not self.held_out:
            return "I-RAVEN with the Mesh component (rule-governed line lattice)" if self.mesh else \
                "plain I-RAVEN: every rule group follows I-RAVEN's rule distribution in every split"
        rules = {r for _, r in self.held_out}
        if len(rules) == 1:
            held = ", ".join(RULE_GROUPS[g] for g, _ in self.held_out) + f" (train/val: {rules.pop()})"
        else:
            held = ", ".join(f"{RULE_GROUPS[g]} (train/val: {r})" for g, r in self.held_out)
        return f"held out: {held}; test: any other rule where one applies"

    def to_json(self) -> dict:
        """A JSON-ready dict: ``{"regime", "description", "held_out": {group name: train rule}, "mesh"}``
        (the part of ``regime.json`` that names the regime)."""
        return {
            "regime": self.name,
            "description": self.description,
            "held_out": {RULE_GROUPS[g]: r for g, r in self.held_out},
            "mesh": self.mesh,
        }

    @classmethod
    def from_json(cls, data: "Mapping | str") -> "Regime":
        """The regime of a :meth:`to_json` dict (or its JSON text); other keys (seed, mode, ...) are ignored.

        A registered name must come with its registered held-out groups and mesh flag."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as error:
                raise ValueError(f"regime JSON: not valid JSON ({error})") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"regime JSON: expected an object, got {type(data).__name__}")
        for key in ("regime", "held_out", "mesh"):
            if key not in data:
                raise ValueError(f"regime JSON: missing key {key!r}")
        held = data["held_out"]
        if not isinstance(held, Mapping):
            raise ValueError(f"regime JSON: held_out must be an object {{group: rule}}, got {held!r}")
        pairs = []
        for group, rule in held.items():
            index = RULE_GROUPS.index(group) if group in RULE_GROUPS else _group(str(group), "regime JSON held_out")
            pairs.append((index, _relation(str(rule), f"regime JSON held_out {group}")))
        regime = cls(str(data["regime"]), tuple(pairs), data["mesh"])
        known = REGIMES.get(regime.name)
        if known is not None and (known.held_out, known.mesh) != (regime.held_out, regime.mesh):
            raise ValueError(f"regime JSON: {regime.name!r} is a registered regime with held_out "
                             f"{known.to_json()['held_out']} and mesh {known.mesh}, but the file says "
                             f"{regime.to_json()['held_out']} and mesh {regime.mesh}")
        return regime


def _attributeless(name: str, *held: tuple[int, str]) -> Regime:
    return Regime(name, tuple(held))


#: Plain I-RAVEN: nothing held out.
IRAVEN = Regime("I-RAVEN")

#: Every named regime. The A-I-RAVEN names are the paper's (arXiv 2406.11061); each is one raven-datasets
#: command (``--color``, ``--color --size``, ``--color --color-train-set-rule Progression``, ...).
REGIMES: dict[str, Regime] = {
    regime.name: regime
    for regime in (
        IRAVEN,
        _attributeless("A/Color", (3, "Constant")),
        _attributeless("A/Position", (0, "Constant")),
        _attributeless("A/Size", (2, "Constant")),
        _attributeless("A/Type", (1, "Constant")),
        _attributeless("A/ColorSize", (3, "Constant"), (2, "Constant")),
        _attributeless("A/ColorType", (3, "Constant"), (1, "Constant")),
        _attributeless("A/SizeType", (2, "Constant"), (1, "Constant")),
        _attributeless("A/Color-Progression", (3, "Progression")),
        _attributeless("A/Color-Arithmetic", (3, "Arithmetic")),
        _attributeless("A/Color-DistributeThree", (3, "Distribute_Three")),
        Regime("I-RAVEN-Mesh", mesh=True),
    )
}

#: The 4 primary A-I-RAVEN regimes (the ones published on Hugging Face).
PRIMARY_REGIMES: tuple[str, ...] = ("A/Color", "A/Position", "A/Size", "A/Type")
#: The 6 extended A-I-RAVEN regimes.
EXTENDED_REGIMES: tuple[str, ...] = ("A/ColorSize", "A/ColorType", "A/SizeType", "A/Color-Progression",
                                     "A/Color-Arithmetic", "A/Color-DistributeThree")


def parse_held_out(text: str) -> tuple[int, str]:
    """``"ATTR[:RULE]"`` -> ``(group, train rule)``.

    ATTR: position | number (both: group 0 Number/Position), type, size, color; RULE: Constant (default),
    Progression, Arithmetic, Distribute_Three. Case-insensitive. ``"color:Progression"`` -> ``(3, "Progression")``.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"--held-out: expected ATTR[:RULE], e.g. color or size:Progression, got {text!r}")
    attr, _, rule = text.partition(":")
    group = _group(attr, f"--held-out {text}")
    relation = _relation(rule, f"--held-out {text}") if rule.strip() else "Constant"
    if (group, relation) == (1, "Arithmetic"):
        raise ValueError(f"--held-out {text}: there is no Arithmetic on Type")
    return group, relation


def _matching_name(held_out: tuple[tuple[int, str], ...], mesh: bool) -> str:
    for regime in REGIMES.values():
        if (regime.held_out, regime.mesh) == (held_out, mesh):
            return regime.name
    return "A/custom(" + ",".join(f"{RULE_GROUPS[g]}:{r}" for g, r in held_out) + ")"


def regime_from_options(regime: str | None = None, held_out: Iterable[str] | None = None,
                        mesh: bool = False) -> Regime:
    """The regime of the ``rpm-generate`` options ``--regime NAME``, ``--held-out ATTR[:RULE]`` (repeatable) and
    ``--mesh``.

    ``--regime`` and ``--held-out`` exclude each other. Held-out groups that equal a registered regime give
    that regime (``["color"]`` -> ``A/Color``); others get the name ``A/custom(<group>:<rule>,...)``.
    """
    held = list(held_out or [])
    if regime is not None and held:
        raise ValueError("--regime and --held-out exclude each other: name a regime or list held-out attributes")
    if regime is not None:
        base = resolve_regime(regime)
        if mesh and not base.mesh:
            if base.held_out:
                raise ValueError(f"--mesh cannot be combined with the held-out regime {base.name} (the reference "
                                 "generator never finishes the test split there)")
            return REGIMES["I-RAVEN-Mesh"]
        return base
    pairs = [parse_held_out(text) for text in held]
    groups = [g for g, _ in pairs]
    for g in set(groups):
        if groups.count(g) > 1:
            raise ValueError(f"--held-out: {RULE_GROUPS[g]} given {groups.count(g)} times")
    if mesh and pairs:
        raise ValueError("--mesh cannot be combined with --held-out (the reference generator never finishes the "
                         "test split there)")
    key = tuple(sorted(pairs))
    return Regime(_matching_name(key, mesh), key, mesh)


def resolve_regime(regime: "Regime | str | None") -> Regime:
    """``None`` -> plain I-RAVEN, a registered name -> its :class:`Regime`, a ``Regime`` -> itself."""
    if regime is None:
        return IRAVEN
    if isinstance(regime, Regime):
        return regime
    if isinstance(regime, str):
        if regime in REGIMES:
            return REGIMES[regime]
        raise ValueError(f"unknown regime {regime!r}; expected one of {', '.join(REGIMES)}")
    raise ValueError(f"regime must be a Regime, a registered name or None, got {type(regime).__name__}")


def check_split(split: str) -> str:
    """``split`` if it is one of ``rpm_lib.data.raw_files.SPLITS``, else a one-line ``ValueError``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return split


def is_test_split(split: str) -> bool:
    """Whether ``split`` is the out-of-distribution one (``"test"``); ``"train"`` and ``"val"`` are train-like."""
    return check_split(split) == TEST_SPLIT


def do_enforce_train_set_rule(split_kind: str, configuration: str, component: int, group: int, rule: str) -> bool:
    """Whether held-out ``group`` of ``component`` must follow the train rule ``rule`` (True) or any other rule
    (False), exactly as raven-datasets decides it (docs/generator.md, "Generalisation regimes").

    * Number/Position (group 0) can change only in multi-slot layouts (2x2Grid, 3x3Grid, the In grid of
      O-IG): there a Constant train rule is enforced in train/val and refused in test; a non-Constant train
      rule is enforced only in train/val. Elsewhere the group is Constant in every split.
    * Color (group 3) of the Out shape (O-IC / O-IG component 0) has a single level, so only Constant fits:
      same pattern as group 0 with "can change" = "not the Out shape".
    * Size with train rule Arithmetic is not enforced on the Out shape (its 3 levels admit no Arithmetic).
    * Otherwise (Type; Size): enforced in train/val, refused in test.
    """
    trainlike = not is_test_split(split_kind)
    if configuration not in CONFIG_SPECS:
        raise ValueError(f"unknown configuration {configuration!r}; expected one of {list(CONFIGURATIONS)}")
    n_components = len(CONFIG_SPECS[configuration].components)
    if isinstance(component, bool) or not isinstance(component, int) or not 0 <= component < n_components:
        raise ValueError(f"component of {configuration} must be 0..{n_components - 1}, got {component!r}")
    if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < len(RULE_GROUPS):
        raise ValueError(f"group must be 0..3 (Number/Position, Type, Size, Color), got {group!r}")
    if rule not in RELATIONS:
        raise ValueError(f"unknown rule {rule!r}; expected one of {', '.join(RELATIONS)}")
    out_shape = configuration in _OUT_IN and component == 0
    if group == 0:
        modifiable = (configuration, component) in _GRID_COMPONENTS
        if rule == "Constant":
            return True if trainlike else not modifiable
        return modifiable if trainlike else False
    if group == 2 and trainlike and rule == "Arithmetic" and out_shape:
        return False
    if group == 3:
        modifiable = not out_shape
        if rule == "Constant":
            return True if trainlike else not modifiable
        return modifiable if trainlike else False
    return trainlike


def restricted_menu(configuration: str, component: int, group: int, split: str, regime: Regime | None = None,
                    mesh_component: bool = False) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """The entries of ``constants.RULE_MENU[group]`` a (component, group) may draw from, before pruning.

    A held-out group keeps the entries whose relation is the train rule when
    :func:`do_enforce_train_set_rule` says so, else the entries whose relation is not. ``mesh_component``
    (hook for the Mesh component) keeps only Constant on Type/Size/Color. Otherwise the whole menu.
    """
    menu = RULE_MENU[group]
    rules = regime.held_out_rules if regime is not None else {}
    if group in rules:
        rule = rules[group]
        if do_enforce_train_set_rule(split, configuration, component, group, rule):
            return tuple(entry for entry in menu if entry[0] == rule)
        return tuple(entry for entry in menu if entry[0] != rule)
    check_split(split)
    if mesh_component and group > 0:
        return tuple(entry for entry in menu if entry[0] == "Constant")
    return menu


def check_split_proportions(val: int, test: int) -> None:
    """``val`` and ``test`` are tenths (ints >= 0) with ``val + test <= 10``; else a one-line ``ValueError``."""
    for name, value in (("val", val), ("test", test)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a whole number of tenths >= 0, got {value!r}")
    if val + test > 10:
        raise ValueError(f"val + test must be at most 10 tenths, got val={val} + test={test} = {val + test}")


def split_of(index: int, val: int = 2, test: int = 2) -> str:
    """The split of problem ``index`` by ``index % 10`` in tenths, as the reference generator assigns it: the
    first ``10 - val - test`` remainders are ``"train"``, the next ``val`` are ``"val"``, the last ``test``
    are ``"test"`` (defaults 2, 2: 0-5 train, 6-7 val, 8-9 test; ``val=0, test=10``: all test)."""
    check_split_proportions(val, test)
    try:
        index = operator.index(index)  # ints and numpy integers; never floats or bools-as-text
    except TypeError:
        raise ValueError(f"problem index must be an int >= 0, got {index!r}") from None
    if index < 0:
        raise ValueError(f"problem index must be >= 0, got {index}")
    remainder = index % 10
    train = 10 - val - test
    return "train" if remainder < train else "val" if remainder < train + val else "test"
