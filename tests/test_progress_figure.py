"""``rpm-batch progress --plot``: each run's validation accuracy over its epochs, drawn from its run folder."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from rpm_lib import batch
from rpm_lib.runs import progress as run_progress


def _run(folder: Path, encoder: str, setup: str, rows: list[tuple[str, int, float | None]],
         test_accuracy: float | None = None) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"encoder: {encoder}\nsetup: {setup}\nbatch_size: 4\n")
    lines = ["stage,epoch,step,train_loss,val_loss,val_accuracy,lr"]
    lines += [f"{stage},{epoch},{epoch + 1},1.0,1.0,{'' if acc is None else acc},0.002" for stage, epoch, acc in rows]
    (folder / "history.csv").write_text("\n".join(lines) + "\n")
    if test_accuracy is None:
        (folder / "progress.json").write_text(json.dumps({"status": "unfinished", "slices": [{"ended_in": rows[-1][0]}]}))
    else:
        (folder / "metrics.json").write_text(json.dumps({"test_accuracy": test_accuracy}))


@pytest.fixture
def batch_folder(tmp_path: Path) -> Path:
    root = tmp_path / "grid"
    _run(root / "main" / "ce", "scl", "ce", [("supervised", e, 0.5 + 0.1 * e) for e in range(3)], test_accuracy=0.8)
    _run(root / "main" / "mlcl", "scl", "mlcl", [("pretrain", e, None) for e in range(4)]
         + [("linear", e, 0.6 + 0.05 * e) for e in range(2)])
    (root / "main" / "broken").mkdir()
    (root / "main" / "broken" / "config.yaml").write_text("encoder: scl\nsetup: mlcl_aug\n")
    (root / "main" / "broken" / "history.csv").write_bytes(b"\x00\xff not a csv")
    return root


def test_the_figure_shows_each_run_its_state_and_the_papers_average(batch_folder: Path) -> None:
    figure = run_progress.progress_figure(batch_folder, paper=True)
    axis = figure.axes[0]
    labels = axis.get_legend().get_texts()
    text = [label.get_text() for label in labels]
    assert "main/ce: best 70.0 %, last 70.0 % at epoch 3, finished, test 80.0 %" in text, text
    assert "main/mlcl: best 65.0 %, last 65.0 % at epoch 6, unfinished, pretrain 4 ep, linear 2 ep" in text, text
    assert any(t.startswith("main/broken: no accuracy yet") for t in text), text
    curves = {line.get_label(): line for line in axis.get_lines()}
    mlcl = curves["main/mlcl: best 65.0 %, last 65.0 % at epoch 6, unfinished, pretrain 4 ep, linear 2 ep"]
    # linear evaluation follows the 4 pre-training epochs, which have no accuracy
    assert list(mlcl.get_xdata()) == [4.0, 5.0] and np.allclose(mlcl.get_ydata(), [60.0, 65.0])
    dashed = sorted(round(float(segments.get_segments()[0][0][1]), 1) for segments in axis.collections)
    assert dashed == [82.8, 95.7]  # the paper's SCL CE and SCL MLCL averages; none for a run without accuracy
    plt.close(figure)


def test_rpm_batch_progress_writes_the_figure_and_refuses_bad_options_in_one_line(
        batch_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "figures" / "progress.png"
    assert batch.main(["progress", str(batch_folder), "--plot", str(png), "--paper"]) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    assert f"figure written to {png}" in capsys.readouterr().out
    assert batch.main(["progress", str(batch_folder), "--plot", str(tmp_path / "p.jpg")]) == 2
    assert batch.main(["progress", str(batch_folder), "--paper"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rpm-batch progress: error: --plot {tmp_path / 'p.jpg'}: give a .png file name",
                   "rpm-batch progress: error: --paper draws into the figure: give --plot PNG too"]


def test_a_large_grid_keeps_every_run_apart_and_its_legend_off_the_curves() -> None:
    from rpm_lib.viz.training_curves import LEGEND_INSIDE, plot_runs_accuracy

    epochs = np.arange(5, dtype=float)
    curves = {f"run-{i:02d}": {"stage": np.array(["supervised"] * 5, dtype=object), "epoch": epochs,
                               "val_accuracy": 0.3 + 0.01 * i + 0.02 * epochs} for i in range(25)}
    assert len(curves) > LEGEND_INSIDE
    figure = plot_runs_accuracy(curves)
    axis = figure.axes[0]
    drawn = {line.get_label(): line for line in axis.get_lines() if line.get_label().startswith("run-")}
    assert len(drawn) == 25
    styles = {(tuple(line.get_color()), line.get_marker()) for line in drawn.values()}
    assert len(styles) == 25  # no two runs look alike (20 colours, then markers)
    legend = axis.get_legend()
    assert legend.get_window_extent().y1 < axis.get_window_extent().y0 + 1  # below the axis, not over the curves
    plt.close(figure)


def test_runs_sharing_a_reference_get_one_grey_labelled_line_and_others_keep_their_colour() -> None:
    from rpm_lib.viz.training_curves import SHARED_REFERENCE_COLOUR, plot_runs_accuracy

    epochs = np.arange(4, dtype=float)
    curves = {name: {"stage": np.array(["supervised"] * 4, dtype=object), "epoch": epochs + start,
                     "val_accuracy": 0.5 + 0.01 * epochs}
              for name, start in (("ce/seed-0", 0), ("ce/seed-1", 0), ("ce/seed-2", 2), ("mlcl/seed-0", 0))}
    references = {"ce/seed-0": 82.8, "ce/seed-1": 82.8, "ce/seed-2": 82.8, "mlcl/seed-0": 95.7}
    figure = plot_runs_accuracy(curves, references)
    axis = figure.axes[0]
    dashed = {round(float(c.get_segments()[0][0][1]), 1): c for c in axis.collections}
    assert sorted(dashed) == [82.8, 95.7] and len(axis.collections) == 2  # one line for the three seeds
    shared = dashed[82.8]
    assert shared.get_segments()[0][0][0] == 0.0  # from the earliest seed's first epoch
    assert np.allclose(shared.get_colors()[0][:3], [float(SHARED_REFERENCE_COLOUR)] * 3)
    mlcl_colour = next(line.get_color() for line in axis.get_lines() if line.get_label().startswith("mlcl/seed-0"))
    assert np.allclose(dashed[95.7].get_colors()[0][:3], plt.matplotlib.colors.to_rgb(mlcl_colour))
    assert [t.get_text() for t in axis.texts] == ["82.8 % (ce/seed-*, 3 runs)"]
    legend = [t.get_text() for t in axis.get_legend().get_texts()]
    assert "dashed: reference (same colour; dark grey: shared by several runs)" in legend, legend
    plt.close(figure)


def test_runs_still_in_pre_training_show_their_validation_loss_on_a_second_axis() -> None:
    from rpm_lib.viz.training_curves import plot_runs_accuracy

    supervised = {"stage": np.array(["supervised"] * 3, dtype=object), "epoch": np.arange(3.0),
                  "val_accuracy": np.array([0.4, 0.5, 0.6]), "val_loss": np.array([2.0, 1.5, 1.2])}
    pretraining = {"stage": np.array(["pretrain"] * 4, dtype=object), "epoch": np.arange(4.0),
                   "val_accuracy": np.full(4, np.nan), "val_loss": np.array([8.7, 7.6, 6.4, 6.1])}
    figure = plot_runs_accuracy({"ce": supervised, "mlcl": pretraining})
    assert len(figure.axes) == 2
    accuracy_axis, loss_axis = figure.axes
    legend = [t.get_text() for t in accuracy_axis.get_legend().get_texts()]
    assert "mlcl: no accuracy yet (loss below)" in legend, legend
    drawn = loss_axis.get_lines()
    assert len(drawn) == 1  # only the epochs without an accuracy: the supervised run's losses are not repeated
    assert list(drawn[0].get_xdata()) == [0.0, 1.0, 2.0, 3.0] and np.allclose(drawn[0].get_ydata(), [8.7, 7.6, 6.4, 6.1])
    mlcl_colour = next(line.get_color() for line in accuracy_axis.get_lines() if line.get_label().startswith("mlcl"))
    assert drawn[0].get_color() == mlcl_colour
    assert loss_axis.get_xlabel() == "epoch (all stages)" and accuracy_axis.get_xlabel() == ""
    assert loss_axis.get_yscale() == "log"  # a diverging run's 1e6 would otherwise flatten the others
    plt.close(figure)
    negative = plot_runs_accuracy({"mlcl": {**pretraining, "val_loss": np.array([1.0, -0.5, -1.0, -2.0])}})
    assert negative.axes[1].get_yscale() == "linear"  # a loss that can be negative keeps a linear axis
    plt.close(negative)
    only_supervised = plot_runs_accuracy({"ce": supervised})
    assert len(only_supervised.axes) == 1 and only_supervised.axes[0].get_xlabel() == "epoch (all stages)"
    plt.close(only_supervised)
