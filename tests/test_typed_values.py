"""Typed values: one coercion for TrainConfig fields and notebook parameters (rpm_lib.typed_values)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Union

import pytest

from rpm_lib import notebook, typed_values


def test_text_is_read_as_the_declared_type() -> None:
    namespace = {"__annotations__": {"ablations": list[str], "configurations": Optional[list[str]], "seed": int,
                                     "run_dir": str, "lr": float, "devices": Union[int, str, list[int]]},
                 "ablations": '["beta"]', "configurations": "null", "seed": 3, "run_dir": "007", "lr": "1e-3",
                 "devices": "[0, 1]"}
    notebook.check_parameters(namespace)
    assert {k: v for k, v in namespace.items() if k != "__annotations__"} == {
        "ablations": ["beta"], "configurations": None, "seed": 3, "run_dir": "007", "lr": 0.001, "devices": [0, 1]}


def test_a_comma_list_is_a_list_and_a_misfit_names_the_parameter() -> None:
    namespace = {"__annotations__": {"recipes": list[str]}, "recipes": "official, position_preserving"}
    notebook.check_parameters(namespace)
    assert namespace["recipes"] == ["official", "position_preserving"]
    with pytest.raises(ValueError, match=r"^parameter 'seed': expected int, got three \(str\)$"):
        notebook.check_parameters({"__annotations__": {"seed": int}, "seed": "three"})


def test_raw_text_keeps_leading_zeros_for_str_and_reads_yaml_otherwise() -> None:
    assert typed_values.coerce("run_dir", typed_values.from_text("007"), str) == "007"
    assert typed_values.coerce("seed", typed_values.from_text("007"), int) == 7
    assert typed_values.type_name(Optional[int]) == "Optional[int]" and typed_values.type_name(type(None)) == "null"


# --- text that is not YAML, YAML tags and non-finite numbers are refused, naming the field ----------


@pytest.mark.parametrize(("text", "reason"), [
    ("[a, b", "not valid YAML: while parsing a flow sequence, expected ',' or ']', but got '<stream end>'"),
    ("{a: 1", "not valid YAML: while parsing a flow mapping, expected ',' or '}', but got '<stream end>'"),
    ("!!python/name:os.system", "YAML tags are not accepted"),
    ("!foo bar", "YAML tags are not accepted"),
])
def test_unreadable_text_is_refused_for_a_list_not_split_at_commas(text: str, reason: str) -> None:
    expected = f"config field 'configurations': expected list[str], got {text!r} ({reason})"
    with pytest.raises(ValueError) as caught:
        typed_values.coerce("configurations", typed_values.from_text(text), list[str])
    assert str(caught.value) == expected


def test_unreadable_text_is_still_a_str_for_a_field_that_takes_text() -> None:
    assert typed_values.coerce("run_dir", typed_values.from_text("[a, b"), str) == "[a, b"
    assert typed_values.coerce("run_dir", typed_values.from_text("!foo bar"), Optional[str]) == "!foo bar"


@pytest.mark.parametrize(("text", "shown"), [("nan", "nan"), (".nan", ".nan"), ("inf", "inf"), ("-.inf", "-.inf"),
                                             ("1e999", "1e999"), ("1" + "0" * 400, "1" + "0" * 76 + "...")])
def test_non_finite_floats_are_refused_unless_allowed(text: str, shown: str) -> None:
    with pytest.raises(ValueError) as caught:
        typed_values.coerce("lr", typed_values.from_text(text), float)
    assert str(caught.value) == f"config field 'lr': must be a finite number, got {shown}"
    assert not math.isfinite(typed_values.coerce("lr", typed_values.from_text(text), float, allow_non_finite=True))


def test_non_finite_numbers_are_refused_inside_lists_and_unions_and_from_yaml_values() -> None:
    with pytest.raises(ValueError, match=r"^config field 'limit_train_batches': must be a finite number, got nan$"):
        typed_values.coerce("limit_train_batches", float("nan"), Union[int, float])
    with pytest.raises(ValueError, match=r"^parameter 'weights': must be a finite number, got \[1, \.inf\]$"):
        typed_values.coerce("weights", typed_values.from_text("[1, .inf]"), list[float], what="parameter")
    assert typed_values.coerce("weights", typed_values.from_text("[1, 2.5]"), list[float]) == [1.0, 2.5]
    assert typed_values.coerce("name", typed_values.from_text("nan"), Union[float, str]) == "nan"  # text stays text


def test_valid_text_is_still_accepted() -> None:
    for text in ("Center,L-R", "Center, L-R", "[Center, L-R]"):
        assert typed_values.coerce("c", typed_values.from_text(text), list[str]) == ["Center", "L-R"]
    assert typed_values.coerce("c", typed_values.from_text("null"), Optional[list[str]]) is None
    assert typed_values.coerce("lr", typed_values.from_text("1e-3"), float) == 0.001
    assert typed_values.coerce("k", typed_values.from_text("{a: 1}"), dict) == {"a": 1}


def test_train_config_overrides_refuse_unreadable_lists_in_one_line() -> None:
    from rpm_lib.training.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError) as caught:
        TrainConfig().with_overrides(["configurations=[Center, L-R"])
    assert str(caught.value) == ("config field 'configurations': expected Optional[list[str]], got '[Center, L-R' "
                                 "(not valid YAML: while parsing a flow sequence, expected ',' or ']', but got "
                                 "'<stream end>')")
    with pytest.raises(ConfigError, match=r"^config field 'encoder_kwargs': expected dict\[str, Any\], got "
                                          r"'!!python/name:os\.system' \(YAML tags are not accepted\)$"):
        TrainConfig().with_overrides(["encoder_kwargs=!!python/name:os.system"])


# --- hostile files: YAML aliases ("billion laughs"), deep nesting, huge or control-character values ------

_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


def test_a_yaml_alias_bomb_is_refused_in_one_line_before_it_expands() -> None:
    import yaml

    assert len(_LAUGHS) < 2048  # 9**9 "lol"s once expanded
    with pytest.raises(yaml.YAMLError) as caught:
        typed_values.load_yaml_file_text(_LAUGHS)
    assert typed_values.yaml_problem(caught.value) == "YAML aliases (*name) are not accepted"
    with pytest.raises(yaml.YAMLError):
        typed_values.load_yaml_file_text("base: &b {lr: 0.1}\nrun: *b\n")
    raw = typed_values.from_text("[&x [1, 2], *x]")
    assert raw.error == "YAML aliases (*name) are not accepted" and raw.parsed == "[&x [1, 2], *x]"
    assert typed_values.load_yaml_file_text("a: '&x *x'\n") == {"a": "&x *x"}  # in a string: text


def test_a_run_config_with_an_alias_bomb_is_refused_naming_the_file(tmp_path: Path) -> None:
    from rpm_lib.training.config import ConfigError, TrainConfig

    path = tmp_path / "config.yaml"
    path.write_text(_LAUGHS)
    with pytest.raises(ConfigError) as caught:
        TrainConfig.from_yaml(path)
    assert str(caught.value) == f"config file {path}: YAML aliases (*name) are not accepted"


@pytest.mark.parametrize("text", ["[" * 100_000, "a:\n" + "".join(" " * i + "- \n" for i in range(1, 3000)),
                                  "x: " + "{a: " * 150 + "1" + "}" * 150])
def test_yaml_nested_too_deep_is_refused_in_one_line(text: str) -> None:
    import yaml

    with pytest.raises(yaml.YAMLError) as caught:
        typed_values.load_yaml_file_text(text)
    problem = typed_values.yaml_problem(caught.value)
    assert "\n" not in problem and problem.startswith("not valid YAML: ") and len(problem) <= 200, problem
    import json

    assert typed_values.load_yaml_file_text("x: " + "[" * 99 + "]" * 99) == {"x": json.loads("[" * 99 + "]" * 99)}


def test_echoed_values_are_cut_and_escaped() -> None:
    with pytest.raises(ValueError) as caught:
        typed_values.coerce("seed", "9" * 10**6 + "x", int)
    assert str(caught.value) == "config field 'seed': expected int, got '" + "9" * 76 + "... (str)"
    with pytest.raises(ValueError) as caught:
        typed_values.coerce("seed", "\x1b]0;pwned\x07" + "x" * 500, int)
    assert str(caught.value) == ("config field 'seed': expected int, got '\\x1b]0;pwned\\x07" + "x" * 60 + "... (str)")
    with pytest.raises(ValueError) as caught:
        typed_values.coerce("k\x1b[2J" * 1000, list(range(10**6)), dict)
    assert len(str(caught.value)) < 200 and "\x1b" not in str(caught.value)
    with pytest.raises(ValueError, match=r"empty item in the comma-separated list 'a,,b'"):
        typed_values.coerce("c", typed_values.from_text("a,,b"), list[str])
    with pytest.raises(ValueError) as caught:
        typed_values.coerce("c", typed_values.from_text("a,," + "b" * 1000), list[str])
    assert len(str(caught.value)) < 200


def test_a_repeated_key_in_yaml_is_named_cut() -> None:
    import yaml

    key = "k" * 1000  # PyYAML's longest plain key: 1024 characters
    with pytest.raises(yaml.YAMLError) as caught:
        typed_values.load_yaml_file_text(f"{key}: 1\n{key}: 2\n")
    problem = typed_values.yaml_problem(caught.value)
    assert problem == f"not valid YAML: key '{'k' * 76}... appears twice (line 2)"
