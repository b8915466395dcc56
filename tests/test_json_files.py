"""Reading JSON records from shared folders (rpm_lib.json_files): bounded size and depth, checked types, one line
naming the file, and values echoed only escaped and cut (``printable``, ``shown_value``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rpm_lib import json_files
from rpm_lib.json_files import printable, read_object, read_object_or_empty, shown_value


class _RecordError(ValueError):
    """A caller's own error type."""


def _one_line(error: BaseException, path: Path) -> str:
    text = str(error)
    assert "\n" not in text and text.startswith(f"{path}: ") and len(text) < 300, text
    return text


@pytest.mark.parametrize("name", ["progress.json", "slurm.json", "rpm_state.json"])
def test_json_nested_100000_deep_is_refused_in_one_line_naming_the_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(_RecordError) as caught:
        read_object(path, _RecordError)
    assert _one_line(caught.value, path) == f"{path}: nested deeper than 200 levels; not a record this tool writes"
    path.write_text('{"a": ' + '{"b": ' * 100_000 + "1" + "}" * 100_001)
    with pytest.raises(_RecordError, match="nested deeper than 200 levels"):
        read_object(path, _RecordError)
    assert read_object_or_empty(path) == {}  # a record that only informs: damaged means unknown


def test_depth_counts_arrays_and_objects_but_not_brackets_inside_strings(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    deepest = {"x": json.loads("[" * 199 + "]" * 199)}  # 200 levels with the object
    path.write_text(json.dumps(deepest))
    assert read_object(path) == deepest
    with pytest.raises(ValueError, match="nested deeper than 199 levels"):
        read_object(path, max_depth=199)
    quoted = {"note": "[[[{{{" * 1000 + '\\" [[[', "n": [[1]]}
    path.write_text(json.dumps(quoted))
    assert read_object(path) == quoted and read_object_or_empty(path) == quoted


def test_a_file_over_the_size_bound_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"values": list(range(1000))}))
    assert json_files.MAX_BYTES == 64 << 20 and read_object(path)["values"][-1] == 999
    with pytest.raises(_RecordError) as caught:
        read_object(path, _RecordError, max_bytes=100, advice="remove it")
    assert _one_line(caught.value, path) == (f"{path}: larger than 100 bytes; not a record this tool writes; "
                                             "remove it")
    assert read_object_or_empty(path, max_bytes=100) == {}


def test_fields_of_the_wrong_type_are_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "slurm.json"
    path.write_text(json.dumps({"job_id": 4242, "submitted": "2026-11-28"}))
    with pytest.raises(_RecordError) as caught:
        read_object(path, _RecordError, fields={"job_id": str})
    assert _one_line(caught.value, path) == f"{path}: field 'job_id' must be str, got int 4242"
    assert read_object_or_empty(path, fields={"job_id": str}) == {}
    path.write_text(json.dumps({"job_id": "4242_1", "steps": True}))
    with pytest.raises(_RecordError, match=r"field 'steps' must be int, got bool True$"):
        read_object(path, _RecordError, fields={"job_id": str, "steps": int})
    path.write_text(json.dumps({"job_id": "4242_1"}))  # absent fields are the caller's business
    assert read_object(path, fields={"job_id": str, "steps": int}) == {"job_id": "4242_1"}
    path.write_text(json.dumps({"job_id": "x" * 10_000 + "\x1b[2J"}))
    assert read_object_or_empty(path, fields={"job_id": str})["job_id"].startswith("xxx")
    with pytest.raises(_RecordError) as caught:
        read_object(path, _RecordError, fields={"job_id": int})
    assert len(_one_line(caught.value, path)) < len(str(path)) + 120


def test_a_huge_repeated_key_is_named_cut_and_escaped(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    key = "\x1b]0;owned\x07" + "k" * 1_000_000
    path.write_text(f'{{"{json.dumps(key)[1:-1]}": 1, "{json.dumps(key)[1:-1]}": 2}}')
    with pytest.raises(ValueError) as caught:
        read_object(path)
    text = _one_line(caught.value, path)
    assert "\x1b" not in text and "\\x1b]0;owned\\x07kkk" in text and "given twice" in text


def test_printable_escapes_control_characters_and_cuts_long_text() -> None:
    assert printable("2026-11-28T10:00:00Z") == "2026-11-28T10:00:00Z"
    assert printable("2026\x1b[2J\x1b]0;pwned\x07\r\nok\u202e") == "2026\\x1b[2J\\x1b]0;pwned\\x07\\r\\nok\\u202e"
    assert printable("x" * 1000) == "x" * 77 + "..." and len(printable("\x1b" * 10**6)) == 80
    assert printable(4242) == "4242"
    assert shown_value("a" * 10**7) == "'" + "a" * 76 + "..."
    assert shown_value(list(range(10**6))) == "<list of 1000000 items>"
    assert shown_value("run\x1b[2J") == "'run\\x1b[2J'" and shown_value(4242) == "4242"
