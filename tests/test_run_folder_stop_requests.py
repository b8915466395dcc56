"""A run's stop request (``rpm_lib.run_folder.request_stop`` / ``withdraw_stop_request``): the file the training loop
polls, written and removed without ever following a symbolic link planted at its name."""
from __future__ import annotations

from pathlib import Path

from rpm_lib.run_folder import STOP_FILE, request_stop, withdraw_stop_request


def test_a_request_is_written_then_withdrawn(tmp_path: Path) -> None:
    assert request_stop(tmp_path) and (tmp_path / STOP_FILE).is_file()
    withdraw_stop_request(tmp_path)
    assert not (tmp_path / STOP_FILE).exists()
    withdraw_stop_request(tmp_path)  # none there: nothing to do


def test_a_link_planted_at_the_request_s_name_is_neither_followed_nor_removed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / STOP_FILE).symlink_to(target)
    assert not request_stop(run)
    withdraw_stop_request(run)
    assert (run / STOP_FILE).is_symlink() and target.read_text() == "keep"


def test_a_missing_run_folder_gets_no_request(tmp_path: Path) -> None:
    assert not request_stop(tmp_path / "gone")
    withdraw_stop_request(tmp_path / "gone")
