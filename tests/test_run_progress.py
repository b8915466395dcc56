"""``rpm-batch progress`` (``rpm_lib.runs.progress``) on run folders made, copied or edited by others: a history or
metrics file with text, NaN or percentages where fractions belong is one damaged run, never a traceback nor a
wrong percentage; symbolic links, odd run names and long names keep the table and the figure readable."""
from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from rpm_lib import batch
from rpm_lib.runs import progress as run_progress

HEADER = "stage,epoch,step,train_loss,val_loss,val_accuracy,lr\n"


def _run(folder: Path, history: str | None = HEADER + "supervised,0,1,1.0,1.0,0.5,0.002\n",
         config: str | bytes = "encoder: scl\nsetup: ce\nbatch_size: 4\n", metrics: str | None = None) -> Path:
    folder.mkdir(parents=True)
    if isinstance(config, bytes):
        (folder / "config.yaml").write_bytes(config)
    else:
        (folder / "config.yaml").write_text(config)
    if history is not None:
        (folder / "history.csv").write_text(history)
    if metrics is not None:
        (folder / "metrics.json").write_text(metrics)
    return folder


def _progress(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = batch.main(["progress", *argv])
    captured = capsys.readouterr()
    plt.close("all")
    return code, captured.out, captured.err.strip().splitlines()


@pytest.mark.parametrize("row", ["supervised,0,1,1.0,1.0,abc,0.002", "supervised,zero,1,1.0,1.0,0.5,0.002",
                                 "supervised,0,1,1.0,1.0,0.5\x00,0.002"])
def test_progress_plot_of_a_history_with_text_in_a_numeric_column_is_one_damaged_run_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], row: str) -> None:
    _run(tmp_path / "grid" / "r", HEADER + row + "\n")
    png = tmp_path / "p.png"
    code, out, _ = _progress(capsys, str(tmp_path / "grid"), "--plot", str(png))
    assert code == 0 and png.read_bytes().startswith(b"\x89PNG")
    assert "| r | damaged: history.csv" in out


def test_progress_figure_draws_no_curve_for_a_run_the_table_calls_damaged(tmp_path: Path) -> None:
    # epoch 1e308: int() refuses it (the table says damaged) but the figure drew it, squeezing every run to x=0
    _run(tmp_path / "grid" / "bad", HEADER + "supervised,1e308,1,1.0,1.0,0.5,0.002\n")
    _run(tmp_path / "grid" / "good", HEADER + "".join(f"supervised,{e},1,1.0,1.0,0.{e + 3},0.002\n" for e in range(3)))
    runs = run_progress.batch_progress(tmp_path / "grid")
    assert runs[0].status.startswith("damaged")
    figure = run_progress.progress_figure(tmp_path / "grid", runs)
    assert figure.axes[0].get_xlim()[1] <= 3
    assert any(t.get_text().startswith("bad: no accuracy yet") for t in figure.axes[0].get_legend().get_texts())
    plt.close(figure)


@pytest.mark.parametrize("accuracy", ["nan", "inf", "-inf", "-0.3", "1.7", "55"])
def test_a_validation_accuracy_that_is_no_fraction_marks_the_history_damaged(
        tmp_path: Path, accuracy: str) -> None:
    # the writer leaves NaN empty, so "nan" (or 55, or inf) is a damaged or hand-edited file; it showed as
    # "best val % nan" or "5500.0"
    _run(tmp_path / "grid" / "r", HEADER + f"supervised,0,1,1.0,1.0,{accuracy},0.002\n"
         "supervised,1,2,1.0,1.0,0.5,0.002\n")
    (run,) = run_progress.batch_progress(tmp_path / "grid")
    assert run.status.startswith("damaged: history.csv") and "val_accuracy" in run.status, run
    assert run.best_val_accuracy is None


def test_a_negative_epoch_marks_the_history_damaged(tmp_path: Path) -> None:
    _run(tmp_path / "grid" / "r", HEADER + "supervised,-5,1,1.0,1.0,0.5,0.002\n")
    (run,) = run_progress.batch_progress(tmp_path / "grid")
    assert run.status.startswith("damaged: history.csv") and "epoch" in run.status, run


@pytest.mark.parametrize(("slice_fields", "reason"), [
    ({"seconds": -3600}, "slices[0].seconds -3600 is not a number of seconds >= 0"),  # found: shown as -3600 s
    ({"seconds": 1e400}, "slices[0].seconds inf is not a number of seconds >= 0"),
    ({"seconds": 12.0, "first_step_s": -1.5}, "slices[0].first_step_s -1.5 is not a number of seconds >= 0"),
])
def test_a_negative_or_endless_slice_time_marks_the_progress_record_damaged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], slice_fields: dict, reason: str) -> None:
    run = _run(tmp_path / "grid" / "r")
    (run / "progress.json").write_text(json.dumps({
        "status": "unfinished", "stages": {"supervised": {"name": "supervised", "completed": False, "global_step": 1}},
        "slices": [{"ended_in": "supervised", "global_step": {"supervised": 1}, **slice_fields}]}))
    code, out, err = _progress(capsys, str(tmp_path / "grid"))
    assert code == 0, err
    assert f"| r | damaged: progress.json: {reason} |" in out, out


@pytest.mark.parametrize("value", ['"abc"', "[1, 2]"])
def test_a_test_accuracy_that_is_not_a_number_is_one_damaged_run_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    _run(tmp_path / "grid" / "r", metrics=f'{{"test_accuracy": {value}}}')
    _run(tmp_path / "grid" / "s")
    code, out, err = _progress(capsys, str(tmp_path / "grid"))
    assert code == 0, err
    assert "| r | damaged: metrics.json: test_accuracy" in out and "| s | running or killed |" in out


@pytest.mark.parametrize("value", ["true", "NaN", "1e400", "3"])
def test_a_test_accuracy_that_is_no_fraction_is_not_shown_as_a_percentage(tmp_path: Path, value: str) -> None:
    _run(tmp_path / "grid" / "r", metrics=f'{{"test_accuracy": {value}}}')
    (run,) = run_progress.batch_progress(tmp_path / "grid")
    assert run.status.startswith("damaged: metrics.json") and run.test_accuracy is None, run


def test_progress_paper_lines_skip_a_config_yaml_that_is_not_utf8(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "grid" / "r", config=b"\x00\xff: [[[")
    png = tmp_path / "p.png"
    code, _, err = _progress(capsys, str(tmp_path / "grid"), "--plot", str(png), "--paper")
    assert code == 0 and png.is_file(), err


def test_a_symlinked_run_folder_is_listed_not_silently_dropped(tmp_path: Path) -> None:
    _run(tmp_path / "elsewhere" / "r1")
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "link").symlink_to(tmp_path / "elsewhere" / "r1", target_is_directory=True)
    runs = run_progress.batch_progress(tmp_path / "grid")
    assert [run.run for run in runs] == ["link"]
    assert runs[0].status.startswith("skipped: a symbolic link")


def test_run_names_with_a_pipe_or_a_line_break_keep_one_table_row_each(tmp_path: Path) -> None:
    _run(tmp_path / "grid" / "a|b")
    _run(tmp_path / "grid" / "new\nline")
    table = run_progress.progress_table(run_progress.batch_progress(tmp_path / "grid")).splitlines()
    assert len(table) == 4, table
    # 11 unescaped "|" a row, as in the header: the name's own "|" is escaped and adds no column
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 11 for line in table), table


def test_a_long_run_name_does_not_squeeze_the_progress_figure(tmp_path: Path) -> None:
    _run(tmp_path / "grid" / ("L" * 200))
    figure = run_progress.progress_figure(tmp_path / "grid")
    label = figure.axes[0].get_legend().get_texts()[0].get_text()
    assert len(label) < 150, label
    png = tmp_path / "p.png"
    figure.savefig(png, dpi=100, bbox_inches="tight")
    plt.close(figure)
    width = int.from_bytes(png.read_bytes()[16:20], "big")
    assert width < 1000, width  # an 8-inch figure; the 200-character legend entry made it 1613 px, the axis a sliver


def test_rpm_batch_progress_refuses_an_empty_plot_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--plot ""` (an unset shell variable) drew nothing and said nothing
    _run(tmp_path / "grid" / "r")
    code, _, err = _progress(capsys, str(tmp_path / "grid"), "--plot", "")
    assert code == 2 and len(err) == 1 and "--plot" in err[0], err
