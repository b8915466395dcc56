"""Values checked against a type annotation, and text read as the annotated type.

One definition for everything that takes typed values from a user: ``TrainConfig`` fields (YAML files,
``key=value`` overrides) and notebook parameters (papermill's ``-p name value`` passes lists and ``None`` as
text). Supported annotations: ``bool``, ``int``, ``float``, ``str``, ``None``, ``list[T]``, ``list``, ``dict``,
``Any`` and unions of these (``Optional[...]``, ``X | None``).

Refused, each with one line naming the field: text that is not valid YAML (``[a, b``) or carries a YAML tag
(``!foo bar``, ``!!python/name:os.system``), unless the field takes a ``str`` (then the text itself is the value);
and a non-finite number (``nan``, ``inf``, ``1e999``) for a ``float``, unless the caller passes
``allow_non_finite=True`` to :func:`coerce`.

YAML from files and text is read without aliases (``*name``: a 2 KB "billion laughs" expands to gigabytes), at
most :data:`MAX_YAML_DEPTH` deep and :data:`MAX_YAML_CHARS` long; messages echo values only through
``rpm_lib.json_files.shown_value`` / ``printable`` (at most 80 characters, control characters escaped).
"""
from __future__ import annotations

import math
import types
import typing
from typing import Any, Union

import yaml

from rpm_lib.json_files import printable, shown_value

#: Deepest nesting of YAML collections read (PyYAML composes nodes recursively; configs nest a few levels).
MAX_YAML_DEPTH = 100
#: Longest YAML text read (a run's config or a batch file is KBs).
MAX_YAML_CHARS = 16 << 20


class RawValue:
    """A value read from text: the YAML-parsed value plus the raw text (for str fields like ``run_dir=007``).

    ``error`` is why the text is not YAML (``None`` when it parsed); ``parsed`` is then the text itself, which
    only a ``str`` field accepts.
    """

    __slots__ = ("raw", "parsed", "error")

    def __init__(self, raw: str, parsed: Any, error: str | None = None) -> None:
        self.raw = raw
        self.parsed = parsed
        self.error = error

    def __repr__(self) -> str:
        return repr(self.raw)


def from_text(raw: str) -> RawValue:
    """``raw`` parsed as YAML (``"[Center, L-R]"`` -> a list, ``"null"`` -> None), the text kept beside it."""
    try:
        value = _load(raw, _BoundedLoader) if raw.strip() else ""
    except yaml.YAMLError as error:
        return RawValue(raw, raw, yaml_problem(error))
    return RawValue(raw, value)


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing an alias (``*name``: the same node again, so a few of them nested expand a
    small text into gigabytes, a "billion laughs") and collections nested deeper than :data:`MAX_YAML_DEPTH`."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, _ALIASES_REFUSED, event.start_mark)
        if self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            if self._depth >= MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                                  self.peek_event().start_mark)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)


_ALIASES_REFUSED = "YAML aliases (*name) are not accepted"


def _load(text: str, loader: type[yaml.SafeLoader]) -> Any:
    """``text`` read with ``loader``; too long a text is a ``yaml.YAMLError``, as is one nested so deep that
    Python's recursion limit is reached first."""
    if len(text) > MAX_YAML_CHARS:
        raise yaml.YAMLError(f"longer than {MAX_YAML_CHARS} characters")
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.YAMLError("nested too deep to read") from None


class _NoDuplicateKeys(_BoundedLoader):
    """The bounded safe loader, refusing a mapping that names a key twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {shown_value(key)} appears twice (line {key_node.start_mark.line + 1})",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_NoDuplicateKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _NoDuplicateKeys.construct_mapping)


def load_yaml_file_text(text: str) -> Any:
    """A YAML file's text parsed as ``yaml.safe_load`` would, except that a key given twice in one mapping is
    refused instead of silently keeping the last, and so are aliases, nesting deeper than :data:`MAX_YAML_DEPTH`
    and text longer than :data:`MAX_YAML_CHARS` (``yaml.YAMLError``; :func:`yaml_problem` says it in one line)."""
    return _load(text, _NoDuplicateKeys)


def yaml_problem(error: yaml.YAMLError) -> str:
    """One line saying why text is not YAML (PyYAML's own message spans several lines, with a caret)."""
    problem = getattr(error, "problem", None) or (str(error).splitlines() or [type(error).__name__])[0]
    if "could not determine a constructor for the tag" in problem:
        return "YAML tags are not accepted"
    if problem == _ALIASES_REFUSED:
        return _ALIASES_REFUSED
    context = getattr(error, "context", None)
    return printable(f"not valid YAML: {context + ', ' if context else ''}{problem}", limit=200)


#: The names an annotation read back from text may use (see :func:`annotation_from_text`).
_ANNOTATION_NAMES: dict[str, Any] = {"bool": bool, "int": int, "float": float, "str": str, "list": list, "dict": dict,
                                     "None": type(None), "Any": Any, "Optional": typing.Optional, "Union": Union}


def annotation_from_text(text: str) -> Any | None:
    """The annotation that ``text`` spells (``"Optional[list[str]]"``, ``"int | None"``; papermill reads a
    ``parameters`` cell's annotations as text), or None when it uses anything but the supported types above.

    Parsed, not evaluated: a template's text never runs here.
    """
    import ast

    def resolve(node: ast.AST) -> Any:
        if isinstance(node, ast.Name):
            return _ANNOTATION_NAMES[node.id]
        if isinstance(node, ast.Constant) and node.value is None:
            return type(None)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return Union[resolve(node.left), resolve(node.right)]
        if isinstance(node, ast.Subscript):
            inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            arguments = tuple(resolve(element) for element in inner)
            return resolve(node.value)[arguments if len(arguments) > 1 else arguments[0]]
        raise ValueError(ast.dump(node))

    try:
        return resolve(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, KeyError, TypeError):
        return None


def type_name(tp: Any) -> str:
    """``list[str]``, ``Optional[int]``, ``null``: an annotation as a user reads it."""
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def coerce(name: str, value: Any, tp: Any, what: str = "config field", error: type[Exception] = ValueError,
           allow_non_finite: bool = False) -> Any:
    """Check ``value`` against annotation ``tp``; convert int->float, numeric strings -> numbers, a
    ``RawValue`` to whichever of its text or parsed value fits.

    Args:
        allow_non_finite: accept ``nan`` / ``inf`` where ``tp`` asks for a ``float`` (refused by default: they
            pass or fail every comparison, so a threshold or rate of ``nan`` runs on with a meaningless result).

    Raises:
        error: the value does not fit the type, the text is not YAML (and the field takes no ``str``), or a
            float is not finite; the message names ``what`` and ``name``, e.g.
            ``config field 'lr': must be a finite number, got nan`` or
            ``parameter 'ablations': expected list[str], got '[a, b' (not valid YAML: ...)``.
    """
    raw: str | None = None
    if isinstance(value, RawValue):
        if value.error is not None and not _takes_str(tp):
            raise error(f"{what} {shown_value(name)}: expected {type_name(tp)}, got {shown_value(value.raw)} "
                        f"({value.error})")
        raw, value = value.raw, value.parsed
    try:
        result = _try_coerce(value, raw, tp, allow_non_finite)
    except _NonFinite:
        shown = printable(raw.strip()) if raw is not None else shown_value(value)
        raise error(f"{what} {shown_value(name)}: must be a finite number, got {shown}") from None
    except _EmptyItem:
        raise error(f"{what} {shown_value(name)}: empty item in the comma-separated list {shown_value(raw)} (remove "
                    "the extra comma)") from None
    if result is _FAIL:
        shown = printable(raw) if raw is not None else shown_value(value)
        raise error(f"{what} {shown_value(name)}: expected {type_name(tp)}, got {shown} ({type(value).__name__})")
    return result


_FAIL = object()


class _NonFinite(Exception):
    """A float field got nan or inf (and non-finite numbers were not allowed)."""


class _EmptyItem(Exception):
    """A comma-separated list has an empty item (``a,,b``, ``a,``): a typo, never meant as a value."""


def _takes_str(tp: Any) -> bool:
    if tp is str:
        return True
    return typing.get_origin(tp) in (Union, types.UnionType) and any(_takes_str(t) for t in typing.get_args(tp))


def _finite_float(value: Any, allow_non_finite: bool) -> float:
    try:
        number = float(value)
    except OverflowError:  # an int beyond float's range (1e309 written out)
        number = math.inf
    if not allow_non_finite and not math.isfinite(number):
        raise _NonFinite
    return number


def _try_coerce(value: Any, raw: str | None, tp: Any, allow_non_finite: bool = False) -> Any:
    if tp in (list, dict):  # a bare annotation (a notebook's `encoder_kwargs: dict = {}`): items of any type
        tp = list[Any] if tp is list else dict[str, Any]
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        # Exact-type matches first, so "1" for Union[int, str] becomes 1 and 1.0 for Union[int, float] stays 1.0.
        for option in options:
            if _exact_match(value, option):
                return _try_coerce(value, raw, option, allow_non_finite)
        for option in options:
            result = _try_coerce(value, raw, option, allow_non_finite)
            if result is not _FAIL:
                return result
        return _FAIL
    if tp is Any:
        return value
    if tp is type(None):
        return None if value is None else _FAIL
    if tp is bool:
        return value if isinstance(value, bool) else _FAIL
    if tp is int:
        # Strict: 3.0 for an int field is more likely a mistake than an intent.
        return value if isinstance(value, int) and not isinstance(value, bool) else _FAIL
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _finite_float(value, allow_non_finite)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                return _finite_float(value, allow_non_finite)
            except ValueError:
                return _FAIL
        return _FAIL
    if tp is str:
        if isinstance(value, str):
            return value
        if raw is not None and value is not None and not isinstance(value, (list, dict)):
            return raw.strip()
        return _FAIL
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str) and raw is not None:
            value = [v.strip() for v in value.split(",")] if value.strip() else []
            if "" in value:
                raise _EmptyItem
        if not isinstance(value, (list, tuple)):
            return _FAIL
        items = [_try_coerce(v, None, item_tp, allow_non_finite) for v in value]
        return _FAIL if any(i is _FAIL for i in items) else items
    if origin is dict:
        if not isinstance(value, dict):
            return _FAIL
        return dict(value)
    raise TypeError(f"unsupported config annotation {tp!r}")


def _exact_match(value: Any, tp: Any) -> bool:
    if tp is type(None):
        return value is None
    if tp is bool or tp is int:
        return type(value) is tp
    if tp in (float, str):
        return type(value) is tp
    origin = typing.get_origin(tp)
    return origin is not None and isinstance(value, origin)
