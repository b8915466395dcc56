"""``rpm-batch`` argument errors: each is one line on stderr and exit 2, also when a value holds a line break, and an
empty path is refused instead of being taken as the current folder."""
from __future__ import annotations

import pytest

from rpm_lib import batch


def test_an_argument_error_stays_one_line_when_the_value_holds_a_line_break(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        batch.main(["--gather", "a\nb"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rpm-batch: error: --gather"), err


@pytest.mark.parametrize("argv", [["progress", ""], ["pack", "", "--out", "s.tar.gz"], ["pack", "runs", "--out", ""],
                                  ["unpack", "", "--out", "runs"], ["unpack", "s.tar.gz", "--out", " "]])
def test_an_empty_path_is_refused_not_taken_as_the_current_folder(argv: list[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # `rpm-batch progress ""` listed the current folder; pack / unpack would have packed or unpacked it
    with pytest.raises(SystemExit) as stopped:
        batch.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "empty path" in err[0], err
