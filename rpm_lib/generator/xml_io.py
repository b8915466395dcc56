"""The RAVEN / I-RAVEN .xml annotation file (docs/data-formats.md, "The .xml annotation file"): write from
and read into a ``Problem``.

The writer produces exactly the bytes of the reference generators (Python 2 ``ElementTree.tostring``:
one line, no declaration, attributes in alphabetical order, ``" />"`` for empty elements); the per-entity
``real_bbox`` and ``mask`` strings come cached from ``render.entity_annotation``.

The reader rebuilds the levels-only ``Problem``. What the .xml does not store is filled as follows:
rule parameters (Progression step, Arithmetic sign) are 0; ``target`` is the candidate with no
``Modified_attributes`` (I-RAVEN), else the ``target`` of the sibling .npz, else the ``target`` argument.

Mesh problems (docs/generator.md, "Mesh") have one more ``<Component name="Mesh">`` last in every panel,
with ``<Layout name="Mesh_Layout">`` (``Position`` lists the 12 line slots), line entities
``Type="6" Size="0" Color="0" Angle="0"``, and one more ``<Rule_Group>``. The writer keeps this module's
(Python 2) byte conventions for them too; the reader also reads raven-datasets' Python 3 files, whose
attributes come in insertion order (XML attribute order carries no meaning), including their occasional
Mesh-problem panel with two entities on one slot (refused in files without the Mesh, as before).
"""
from __future__ import annotations

import io
import json
import os
import xml.etree.ElementTree as ET
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

import numpy as np

from rpm_lib.generator.constants import (
    CONFIG_SPECS,
    LAYOUTS,
    LINE_TYPE_LEVEL,
    configuration_components,
    has_mesh,
)
from rpm_lib.generator.problem import ComponentPanel, Entity, Panel, Problem, Rule
from rpm_lib.generator.render import entity_annotation, layout_position_json

PathOrFile = str | os.PathLike | BinaryIO

_RULE_NAMES = ("Constant", "Progression", "Arithmetic", "Distribute_Three")
_RULE_ATTRS = ("Number", "Position", "Number/Position", "Type", "Size", "Color")
_MODIFIABLE = ("Number", "Position", "Type", "Size", "Color")


class XmlFormatError(ValueError):
    """A .xml annotation file does not follow the RAVEN schema; the message names the file and the problem."""


# ---------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------


def _rule_group(rule: Rule) -> int:
    """Row of the rule inside its component's block: 0 Number/Position, 1 Type, 2 Size, 3 Color."""
    return {"Type": 1, "Size": 2, "Color": 3}.get(rule.attr, 0)


@lru_cache(maxsize=64)
def _line_xml(slot: tuple, type_level: int, size_level: int, color_level: int, angle_level: int) -> str:
    """The ``<Entity>`` element of a Mesh line."""
    if (type_level, size_level, color_level, angle_level) != (LINE_TYPE_LEVEL, 0, 0, 0):
        raise ValueError(f"Mesh slot {list(slot)} holds Type={type_level} Size={size_level} Color={color_level} "
                         f"Angle={angle_level}; a Mesh line is Type={LINE_TYPE_LEVEL} Size=0 Color=0 Angle=0")
    annotation = entity_annotation(slot, type_level, size_level, angle_level)
    return (f'<Entity Angle="{angle_level}" Color="{color_level}" Size="{size_level}" Type="{type_level}" '
            f'{annotation} />')


def _panel_xml(parts: list[str], configuration: str, panel: Panel, mesh: bool) -> None:
    spec = CONFIG_SPECS[configuration]
    parts.append(f'<Panel><Struct name="{spec.structure}">')
    components = configuration_components(configuration, mesh)
    for index, ((component_name, layout_name), component) in enumerate(zip(components, panel.components)):
        if component.layout != layout_name:
            raise ValueError(f"{configuration}: component {index} has layout {component.layout!r}, "
                             f"expected {layout_name!r}")
        layout = LAYOUTS[component.layout]
        parts.append(
            f'<Component id="{index}" name="{component_name}"><Layout Number="{len(component.entities) - 1}" '
            f'Position="{layout_position_json(component.layout)}" Uniformity="{component.uniformity}" '
            f'name="{component.layout}">'
        )
        if len(component.slots) != len(component.entities) or not component.entities:
            raise ValueError(f"{configuration}/{component.layout}: {len(component.slots)} slots for "
                             f"{len(component.entities)} entities")
        for slot, entity in zip(component.slots, component.entities):
            if not 0 <= slot < len(layout.slots):
                raise ValueError(f"{configuration}/{component.layout}: slot {slot} out of range")
            if layout.lines:  # the 12 possible Mesh lines: whole elements cached
                parts.append(_line_xml(layout.slots[slot], entity.type, entity.size, entity.color, entity.angle))
                continue
            annotation = entity_annotation(layout.slots[slot], entity.type, entity.size, entity.angle)
            parts.append(
                f'<Entity Angle="{entity.angle}" Color="{entity.color}" Size="{entity.size}" '
                f'Type="{entity.type}" {annotation} />'
            )
        parts.append("</Layout></Component>")
    parts.append("</Struct></Panel>")


def problem_xml(problem: Problem) -> str:
    """The .xml text of ``problem`` (one line, no trailing newline), as the reference generators write it.

    ``Modified_attributes`` is written when ``problem.modified`` is not None (balanced / I-RAVEN mode).
    """
    spec = CONFIG_SPECS.get(problem.configuration)
    if spec is None:
        raise ValueError(f"unknown configuration {problem.configuration!r}")
    panels = problem.panels
    if len(panels) != 16:
        raise ValueError(f"a problem needs 16 panels (8 context + 8 candidates), got {len(panels)}")
    mesh = problem.has_mesh
    n_components = len(configuration_components(problem.configuration, mesh))
    parts = ["<Data><Panels>"]
    for panel in panels:
        if len(panel.components) != n_components:
            raise ValueError(
                f"{problem.configuration}: every panel needs {n_components} component(s)"
                f"{' (with the Mesh)' if mesh else ''}, got {len(panel.components)}"
            )
        _panel_xml(parts, problem.configuration, panel, mesh)
    parts.append("</Panels><Rules>")
    for component in range(n_components):
        parts.append(f'<Rule_Group id="{component}">')
        for rule in sorted((r for r in problem.rules if r.component == component), key=_rule_group):
            parts.append(f'<Rule attr="{rule.attr}" name="{rule.name}" />')
        parts.append("</Rule_Group>")
    parts.append("</Rules>")
    if problem.modified is not None:
        if len(problem.modified) != 8:
            raise ValueError(f"modified must list 8 candidates, got {len(problem.modified)}")
        parts.append("<Modified_attributes>")
        for index, changes in enumerate(problem.modified):
            if not changes:
                parts.append(f'<Candidate id="{index}" />')
                continue
            parts.append(f'<Candidate id="{index}">')
            for component, name in changes:
                parts.append(f'<Attribute component_id="{component}" name="{name}" />')
            parts.append("</Candidate>")
        parts.append("</Modified_attributes>")
    parts.append("</Data>")
    return "".join(parts)


def write_problem_xml(problem: Problem, path: PathOrFile) -> None:
    """Write ``problem_xml(problem)`` (ASCII) to a path or a binary file object."""
    data = problem_xml(problem).encode("ascii")
    if hasattr(path, "write"):
        path.write(data)
    else:
        with open(path, "wb") as handle:
            handle.write(data)


# ---------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------


def _int_attr(element: ET.Element, name: str, where: str) -> int:
    value = element.get(name)
    if value is None:
        raise XmlFormatError(f"{where}: <{element.tag}> has no {name!r} attribute")
    try:
        return int(value)
    except ValueError:
        raise XmlFormatError(f"{where}: <{element.tag} {name}={value!r}> is not an integer") from None


def _configuration_of(layouts: tuple[str, ...], structure: str, where: str) -> str:
    for name, spec in CONFIG_SPECS.items():
        if spec.structure == structure and tuple(layout for _, layout in spec.components) == layouts:
            return name
    raise XmlFormatError(f"{where}: no configuration has structure {structure!r} with layouts {list(layouts)}")


def _slot_index(layout: str, bbox_text: str | None, where: str) -> int:
    if bbox_text is None:
        raise XmlFormatError(f"{where}: <Entity> has no 'bbox' attribute")
    try:
        bbox = json.loads(bbox_text)
    except json.JSONDecodeError:
        raise XmlFormatError(f"{where}: <Entity bbox={bbox_text!r}> is not a JSON list") from None
    for index, slot in enumerate(LAYOUTS[layout].slots):
        if len(bbox) == 4 and all(abs(float(a) - b) < 1e-9 for a, b in zip(bbox, slot)):
            return index
    raise XmlFormatError(f"{where}: bbox {bbox_text} is not a slot of layout {layout}")


def _parse_panel(panel_element: ET.Element, where: str) -> tuple[tuple[str, bool], Panel]:
    """``((configuration, has the Mesh), panel)`` of one ``<Panel>``."""
    struct = panel_element.find("Struct")
    if struct is None:
        raise XmlFormatError(f"{where}: <Panel> has no <Struct>")
    components: list[ComponentPanel] = []
    layouts: list[str] = []
    shared_slot: str | None = None
    for position, component in enumerate(struct.findall("Component")):
        cwhere = f"{where}, component {position}"
        if _int_attr(component, "id", cwhere) != position:
            raise XmlFormatError(f"{cwhere}: components out of order (id={component.get('id')})")
        layout = component.find("Layout")
        if layout is None:
            raise XmlFormatError(f"{cwhere}: <Component> has no <Layout>")
        layout_name = layout.get("name", "")
        if layout_name not in LAYOUTS:
            raise XmlFormatError(f"{cwhere}: unknown layout {layout_name!r}")
        slots: list[int] = []
        entities: list[Entity] = []
        for number, entity in enumerate(layout.findall("Entity")):
            ewhere = f"{cwhere}, entity {number}"
            slots.append(_slot_index(layout_name, entity.get("bbox"), ewhere))
            entities.append(Entity(*(_int_attr(entity, key, ewhere) for key in ("Type", "Size", "Color", "Angle"))))
        if not entities:
            raise XmlFormatError(f"{cwhere}: layout {layout_name} has no <Entity>")
        if _int_attr(layout, "Number", cwhere) != len(entities) - 1:
            raise XmlFormatError(
                f"{cwhere}: Number={layout.get('Number')} but {len(entities)} entities (Number = count - 1)"
            )
        if len(set(slots)) != len(slots) and shared_slot is None:
            shared_slot = f"{cwhere}: two entities share a slot ({slots})"
        layouts.append(layout_name)
        components.append(ComponentPanel(layout_name, _int_attr(layout, "Uniformity", cwhere), slots, entities))
    try:
        mesh = has_mesh(layouts)
    except ValueError as error:
        raise XmlFormatError(f"{where}: {error}") from None
    # raven-datasets writes two entities on one slot in ~0.2 % of its Mesh files (a distractor whose Number was
    # changed before its Position; docs/generator.md, "Mesh"): those are read as they are.
    if shared_slot is not None and not mesh:
        raise XmlFormatError(shared_slot)
    configuration = _configuration_of(tuple(layouts[:-1] if mesh else layouts), struct.get("name", ""), where)
    names = tuple(name for name, _ in configuration_components(configuration, mesh))
    found = tuple(c.get("name") for c in struct.findall("Component"))
    if found != names:
        raise XmlFormatError(f"{where}: component names {list(found)}, expected {list(names)}")
    return (configuration, mesh), Panel(components)


def _parse_rules(root: ET.Element, where: str) -> list[Rule]:
    rules_element = root.find("Rules")
    if rules_element is None:
        raise XmlFormatError(f"{where}: no <Rules>")
    rules: list[Rule] = []
    for position, group in enumerate(rules_element.findall("Rule_Group")):
        if _int_attr(group, "id", where) != position:
            raise XmlFormatError(f"{where}: <Rule_Group> ids out of order")
        for rule in group.findall("Rule"):
            name, attr = rule.get("name"), rule.get("attr")
            if name not in _RULE_NAMES or attr not in _RULE_ATTRS:
                raise XmlFormatError(f"{where}: unknown rule name={name!r} attr={attr!r} in group {position}")
            rules.append(Rule(position, name, attr, 0))
    return rules


def _parse_modified(root: ET.Element, where: str) -> list[list[tuple[int, str]]] | None:
    element = root.find("Modified_attributes")
    if element is None:
        return None
    candidates = element.findall("Candidate")
    if [_int_attr(c, "id", where) for c in candidates] != list(range(8)):
        raise XmlFormatError(f"{where}: <Modified_attributes> must list candidates 0..7 in order")
    modified: list[list[tuple[int, str]]] = []
    for candidate in candidates:
        changes = []
        for attribute in candidate.findall("Attribute"):
            name = attribute.get("name")
            if name not in _MODIFIABLE:
                raise XmlFormatError(f"{where}: unknown modified attribute {name!r}")
            changes.append((_int_attr(attribute, "component_id", where), name))
        modified.append(changes)
    return modified


def parse_problem_xml(text: str | bytes, where: str = "<xml>", target: int | None = None) -> Problem:
    """Parse .xml text into a ``Problem`` (see ``read_problem_xml``); ``where`` names the source in errors."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as error:
        raise XmlFormatError(f"{where}: not well-formed XML ({error})") from None
    if root.tag != "Data":
        raise XmlFormatError(f"{where}: root element is <{root.tag}>, expected <Data>")
    panels_element = root.find("Panels")
    panel_elements = [] if panels_element is None else panels_element.findall("Panel")
    if len(panel_elements) != 16:
        raise XmlFormatError(f"{where}: expected 16 <Panel> elements, found {len(panel_elements)}")
    parsed = [_parse_panel(p, f"{where}, panel {i}") for i, p in enumerate(panel_elements)]
    configurations = {c for c, _ in parsed}
    if len(configurations) != 1:
        described = sorted(f"{name}{' + Mesh' if mesh else ''}" for name, mesh in configurations)
        raise XmlFormatError(f"{where}: panels disagree on the configuration: {described}")
    configuration, mesh = configurations.pop()
    rules = _parse_rules(root, where)
    n_components = len(configuration_components(configuration, mesh))
    if len(rules) != 4 * n_components or any(r.component >= n_components for r in rules):
        raise XmlFormatError(f"{where}: expected 4 rules per component ({4 * n_components}), got {len(rules)}")
    modified = _parse_modified(root, where)
    if modified is not None:
        answers = [i for i, changes in enumerate(modified) if not changes]
        if len(answers) != 1:
            raise XmlFormatError(f"{where}: exactly one candidate must be unmodified, found {answers}")
        if target is not None and target != answers[0]:
            raise XmlFormatError(f"{where}: target {target} but candidate {answers[0]} is the unmodified one")
        target = answers[0]
    if target is None:
        raise XmlFormatError(f"{where}: the .xml does not say which candidate is correct; pass target=")
    if not 0 <= target < 8:
        raise XmlFormatError(f"{where}: target {target} outside 0..7")
    panels = [panel for _, panel in parsed]
    return Problem(
        configuration=configuration,
        context=panels[:8],
        candidates=panels[8:],
        target=int(target),
        rules=rules,
        modified=modified,
        mode="balanced" if modified is not None else "original",
    )


def read_problem_xml(path: str | os.PathLike, target: int | None = None) -> Problem:
    """Read a RAVEN / I-RAVEN / RAVEN-FAIR .xml file into a ``Problem`` (levels; rule values 0).

    ``target``: the correct candidate. Needed only for RAVEN and RAVEN-FAIR files (no ``Modified_attributes``; read
    as mode ``"original"``) without a sibling .npz; when given for an I-RAVEN file it must agree with the file.
    Raises ``XmlFormatError`` naming the file on any schema violation.
    """
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as error:
        raise XmlFormatError(f"{path}: cannot read ({error.strerror})") from None
    if target is None and b"<Modified_attributes" not in text:
        npz_path = path.with_suffix(".npz")
        if npz_path.is_file():
            with np.load(npz_path, allow_pickle=False) as data:
                if "target" not in data.files:
                    raise XmlFormatError(f"{npz_path}: no 'target' array to complete {path.name}")
                target = int(data["target"])
    return parse_problem_xml(text, str(path), target)


def xml_bytes(problem: Problem) -> bytes:
    """``problem_xml(problem)`` encoded as the file's bytes."""
    buffer = io.BytesIO()
    write_problem_xml(problem, buffer)
    return buffer.getvalue()
