"""In-memory data model of a generated RAVEN / I-RAVEN problem.

Everything is stored as *levels* (indices into the value tables of ``constants.py``), exactly as the
reference generators serialise them into the .xml. This module is shared by the sampler
(``sampling``/``rows``/``candidates``), the renderer (``render``) and the writers (``io``).

An I-RAVEN-Mesh problem (docs/generator.md, "Mesh") is the same model with one more component, the Mesh,
last in every panel (layout ``"Mesh_Layout"``; its entities are lines: Type 6, Size/Color/Angle 0) and 4
more rules on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rpm_lib.generator.constants import LINE_TYPE_LEVEL, has_mesh


@dataclass(slots=True)  # slots: the candidate trees copy entities by the hundred per problem
class Entity:
    """One shape. All fields are levels (ints): type 1..5, size 0..5, color 0..9, angle 0..7; a Mesh line is
    type 6 with size, color and angle 0."""

    type: int
    size: int
    color: int
    angle: int

    def copy(self) -> "Entity":
        """A new entity with the same levels; a Mesh line is returned itself: lines never change in place
        (the Mesh's Type/Size/Color are always Constant and never perturbed), and sharing them spares the
        candidate tree most of its copies."""
        if self.type == LINE_TYPE_LEVEL:
            return self
        return Entity(self.type, self.size, self.color, self.angle)


@dataclass
class ComponentPanel:
    """One component of one panel.

    Attributes:
        layout: layout name, e.g. ``"Distribute_Four"`` (see ``constants.LAYOUTS``).
        uniformity: Uniformity level 0..3 (3 = uniform); fixed for the whole problem.
        slots: occupied slot indices into the layout's slot list, in *entity order*;
            ``len(slots) == len(entities)`` and Number level == ``len(slots) - 1`` (Mesh: 0..11).
        entities: the entities, ``entities[i]`` sits in slot ``slots[i]``.
    """

    layout: str
    uniformity: int
    slots: list[int]
    entities: list[Entity]

    @property
    def number(self) -> int:
        """Number level (count - 1)."""
        return len(self.entities) - 1

    def copy(self) -> "ComponentPanel":
        return ComponentPanel(self.layout, self.uniformity, list(self.slots), [e.copy() for e in self.entities])


@dataclass
class Panel:
    """One 160x160 panel: one ComponentPanel per component of the configuration (1 or 2), plus the Mesh last
    in a Mesh problem."""

    components: list[ComponentPanel]

    def copy(self) -> "Panel":
        return Panel([c.copy() for c in self.components])

    @property
    def has_mesh(self) -> bool:
        """Whether the last component is the Mesh."""
        return has_mesh(c.layout for c in self.components)


@dataclass(frozen=True)
class Rule:
    """One rule on one component.

    Attributes:
        component: component index 0 or 1 (2: the Mesh of a two-component configuration).
        name: ``"Constant" | "Progression" | "Arithmetic" | "Distribute_Three"``.
        attr: ``"Number" | "Position" | "Number/Position" | "Type" | "Size" | "Color"``.
        value: Progression step (+-1, +-2), Arithmetic sign (+1 add/union, -1 sub/difference), else 0.
    """

    component: int
    name: str
    attr: str
    value: int = 0


@dataclass
class Problem:
    """A complete RPM.

    Attributes:
        configuration: folder name, e.g. ``"center_single"``.
        context: 8 panels, row-major (P11, P12, P13, P21, P22, P23, P31, P32).
        candidates: 8 panels; ``candidates[target]`` is the answer P33.
        target: index 0..7 of the answer among the candidates.
        rules: 4 rules per component, ordered (component, group N/P, Type, Size, Color); the Mesh's last.
        modified: per candidate, the (component, attribute name) pairs changed on its way from the
            answer (I-RAVEN ``Modified_attributes``; empty list for the answer). ``None`` in original and fair mode
            (their files do not say; a fair problem's tree is in ``extra["fair_tree"]``).
        mode: ``"balanced"`` (I-RAVEN), ``"original"`` (RAVEN), ``"fair"`` (RAVEN-FAIR) or ``"mesh-faithful"``
            (Mesh, raven-datasets' draws). A problem read from a file without ``Modified_attributes`` is
            ``"original"``: RAVEN's and RAVEN-FAIR's files have the same form.
    """

    configuration: str
    context: list[Panel]
    candidates: list[Panel]
    target: int
    rules: list[Rule]
    modified: list[list[tuple[int, str]]] | None = None
    mode: str = "balanced"
    extra: dict = field(default_factory=dict)

    @property
    def panels(self) -> list[Panel]:
        """The 16 panels in file order: 8 context then 8 candidates."""
        return list(self.context) + list(self.candidates)

    @property
    def answer(self) -> Panel:
        return self.candidates[self.target]

    @property
    def has_mesh(self) -> bool:
        """Whether this is an I-RAVEN-Mesh problem (its panels end with the Mesh component)."""
        return bool(self.context) and self.context[0].has_mesh
