"""Typed values: one coercion for TrainConfig fields and notebook parameters (rpm_lib.typed_values)."""
from __future__ import annotations

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
