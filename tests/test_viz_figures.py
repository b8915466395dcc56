"""rpm_lib.viz and rpm_lib.notebook: the numbers behind the notebook figures, figure shapes, and output files."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from pathlib import Path  # noqa: E402

from rpm_lib import notebook, rules, viz  # noqa: E402
from rpm_lib.results import AblationPoint, PAPER_TABLE1, Table1Row  # noqa: E402
from rpm_lib.training.history import history_columns  # noqa: E402
from rpm_lib.training.metrics import per_rule_scores  # noqa: E402
from meta_matrices import CENTER, LEFT_RIGHT  # noqa: E402




@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_confusion_matrix_counts_and_validation():
    m = viz.confusion_matrix([0, 0, 1, 7], [0, 3, 1, 7])
    assert m.shape == (8, 8) and m.sum() == 4
    assert m[0, 0] == 1 and m[0, 3] == 1 and m[1, 1] == 1 and m[7, 7] == 1
    with pytest.raises(ValueError, match="outside"):
        viz.confusion_matrix([8], [0])
    with pytest.raises(ValueError, match="equal"):
        viz.confusion_matrix([0, 1], [0])


def test_rule_frequencies_per_configuration():
    freq, rows, cols = viz.rule_frequencies(np.stack([CENTER, CENTER, LEFT_RIGHT]),
                                              ["center_single", "Center", "left_center_single_right_center_single"])
    assert rows == ["Center", "L-R"] and len(cols) == 19
    assert freq[0, cols.index("Prog Type")] == 1.0 and freq[0, cols.index("Const Type")] == 0.0
    assert freq[1, cols.index("Prog Type")] == 1.0 and freq[1, cols.index("Const Type")] == 1.0
    assert freq[1, cols.index("Const Number")] == 1.0 and freq[1, cols.index("Dist3 Color")] == 0.0


def test_answer_position_counts():
    assert viz.answer_position_counts([0, 0, 7]).tolist() == [2, 0, 0, 0, 0, 0, 0, 1]
    with pytest.raises(ValueError):
        viz.answer_position_counts([9])


def test_read_history_and_plot(tmp_path):
    path = tmp_path / "history.csv"
    path.write_text("epoch,stage,train_loss,val_loss,val_accuracy\n0,supervised,2.0,,\n0,supervised,,1.9,0.2\n"
                    "1,supervised,1.5,1.7,0.3\n")
    h = history_columns(path)
    assert h["train_loss"][0] == 2.0 and np.isnan(h["train_loss"][1]) and h["stage"][0] == "supervised"
    fig = viz.plot_history(h)
    left, right = fig.axes
    assert {ln.get_label() for ln in left.lines} == {"train_loss", "val_loss"}
    assert [ln.get_label() for ln in right.lines] == ["val_accuracy", "chance (12.5 %)"]
    assert left.lines[0].get_xdata().tolist() == [0.0, 1.0]  # NaN rows skipped
    # Accuracy in percent on a fixed 0-100 axis, so small wobbles are not magnified.
    assert right.lines[0].get_ydata().tolist() == pytest.approx([20.0, 30.0]) and right.get_ylim() == (0, 100)


def test_figures_have_fixed_sizes_and_data(tmp_path):
    acc = {"Center": 90.0, "2x2Grid": 50.0}
    fig = viz.plot_accuracy_bars(acc, reference={"Center": 99.0})
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights[:2] == [90.0, 50.0] and heights[2] == 99.0
    assert tuple(fig.get_size_inches()) == (8.0, 3.5)

    fig = viz.plot_confusion(viz.confusion_matrix([0, 1], [0, 2]))
    assert fig.axes[0].images[0].get_array().shape == (8, 8)

    true = np.array([[1, 0, 0], [0, 1, 0]])
    prob = np.array([[0.9, 0.1, 0.0], [0.2, 0.6, 0.0]])
    fig = viz.plot_rule_heatmap(true, prob, ["a", "b", "c"], xlabel=rules.component_legend())
    assert fig.axes[0].images[0].get_array().shape == (2, 2)  # unused rule "c" dropped
    assert fig.get_supxlabel() == "component 0: Grid, Left, Up or Out; component 1: Right, Down or In"
    with pytest.raises(ValueError):
        viz.plot_rule_heatmap(true, prob, ["a", "b"])

    scores = per_rule_scores(true, prob > 0.5)
    fig = viz.plot_per_rule_f1(scores, ["a", "b", "c"])
    assert len(fig.axes[0].patches) == 2  # rule "c" has no support

    series = {"SCL MLCL": [AblationPoint(0.0, 35.0, 1.0, 2), AblationPoint(10.0, 80.0, float("nan"), 1)]}
    fig = viz.plot_ablation(series, "beta", reference={"paper SCL beta=0": 35.3})
    assert fig.axes[0].lines[0].get_ydata().tolist() == [35.0, 80.0]
    # References are named in the legend (not written over each other on the plot); the axis is 0-100.
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "paper SCL beta=0" in legend and "chance" in legend and fig.axes[0].get_ylim() == (0.0, 100.0)

    rows = [Table1Row("SCL", "CE", {}, ["0"], 70.0, 1.0, {}, PAPER_TABLE1[0])]
    fig = viz.plot_table1_comparison(rows)
    assert [p.get_height() for p in fig.axes[0].patches][:2] == [70.0, 82.8]

    freq, r, c = viz.rule_frequencies(np.stack([CENTER]), ["center_single"])
    assert viz.plot_rule_frequencies(freq, r, c).axes[0].images[0].get_array().shape == (1, 19)
    fig = viz.plot_answer_positions({"Center": np.array([1, 0, 0, 0, 0, 0, 0, 2])})
    assert [p.get_height() for p in fig.axes[0].patches][7] == 2


def test_save_figure_and_table(tmp_path):
    fig = viz.plot_accuracy_bars({"Center": 10.0})
    assert notebook.save_figure(fig, "", "x") is None
    png = notebook.save_figure(fig, tmp_path / "out", "acc")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv_path, md_path = notebook.save_table(["a", "b"], [[1, 2]], tmp_path / "out", "t")
    assert csv_path.read_text().splitlines() == ["a,b", "1,2"]
    assert "| 1 | 2 |" in md_path.read_text()
    assert notebook.save_table(["a"], [[1]], None, "t") is None
    assert notebook.format_percent(12.345) == "12.3" and notebook.format_percent(float("nan")) == "–"


# ----------------------------------------------------------------------------------------------
# Dataset / augmentation helpers (on a tiny generated set)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("nbviz-data")
    return notebook.load_or_generate("", "train", sample_root=str(root), sample_per_config=2, sample_seed=5,
                                  configurations=["Center", "L-R"], image_size=40)


def test_load_or_generate_and_indices(tiny_dataset, tmp_path):
    assert len(tiny_dataset) == 4 and tiny_dataset.image_size == 40
    groups = viz.indices_by_configuration(tiny_dataset)
    assert list(groups) == ["center_single", "left_center_single_right_center_single"]
    assert [g.tolist() for g in groups.values()] == [[0, 1], [2, 3]]
    # an explicit data_root is read as is (here: the folder the sample went to)
    again = notebook.load_or_generate(str(tiny_dataset.root), "train", configurations=["L-R"])
    assert len(again) == 2 and again.source_ids[0].startswith("left_center_single_right_center_single/")


def test_dataset_summary_counts(tiny_dataset):
    header, rows = viz.dataset_summary(tiny_dataset)
    assert header[:3] == ["configuration", "problems", "rules / problem"] and len(header) == 4 + 8
    assert [r[0] for r in rows] == ["Center", "L-R"]
    assert [r[2] for r in rows] == ["4.00", "8.00"]  # 4 rule groups per component
    for row in rows:
        assert sum(row[4:]) == row[1]  # every problem has one answer position


def test_rpm_figures_from_dataset(tiny_dataset):
    lines = viz.dataset_rule_lines(tiny_dataset, 2)
    assert len(lines) == 8 and lines[0].startswith("Left:") and lines[4].startswith("Right:")
    fig = viz.rpm_figure(tiny_dataset, 0, predicted=None)
    assert fig._suptitle.get_text() == "Center · center_single/RAVEN_0_train"
    gallery = viz.rpm_gallery(tiny_dataset, [0, 2], predicted=[1, 2])
    assert len(gallery.subfigs) == 2
    with pytest.raises(ValueError, match="2 problems"):
        viz.rpm_gallery(tiny_dataset, [0, 2], predicted=[1])


def test_solved_matrix_places_context_and_answer():
    panels = np.stack([np.full((4, 4), k, dtype=np.uint8) for k in range(16)])
    m = viz.solved_matrix(panels, target=3, gap=1, gap_value=200)
    assert m.shape == (14, 14)
    assert m[0, 0] == 0 and m[0, 5] == 1 and m[5, 0] == 3 and m[10, 5] == 7
    assert m[10, 10] == 8 + 3  # the answer fills the ninth cell
    assert m[4, 0] == 200 and m[0, 4] == 200
    with pytest.raises(ValueError):
        viz.solved_matrix(panels, target=8)


def test_augmentation_examples(tiny_dataset):
    sample = tiny_dataset[0]
    panels, target = sample["panels"].numpy(), int(sample["target"])
    singles = viz.single_transform_examples(panels, target, False, ["hflip", "grid2"], seed=0)
    assert list(singles) == ["original", "hflip", "grid2"]
    np.testing.assert_array_equal(singles["hflip"], viz.solved_matrix(panels[:, :, ::-1], target))
    kept = viz.single_transform_examples(panels, target, True, ["grid2"], seed=0)
    assert list(kept)[1] == "grid2: skipped (position rule)"
    np.testing.assert_array_equal(kept["grid2: skipped (position rule)"], kept["original"])
    draws = viz.recipe_examples(panels, target, False, "official", 4, seed=0)
    assert list(draws) == list(viz.recipe_examples(panels, target, False, "official", 4, seed=0))  # seeded
    assert [k.split(".")[0] for k in draws] == ["1", "2", "3", "4"]
    fig = viz.plot_matrices(draws, ncols=3)
    assert len(fig.axes) == 6 and [ax.get_title() for ax in fig.axes[:4]] == list(draws)


def test_describe_applied():
    from rpm_lib.augment import AppliedTransform

    assert viz.describe_applied([]) == "identity"
    applied = [AppliedTransform("hflip", {}), AppliedTransform("rotate", {"angle": 37.4}),
               AppliedTransform("roll_vh", {"dy": 3, "dx": 5})]
    assert viz.describe_applied(applied) == "hflip + rotate 37° + roll_vh (3, 5)"
    no_ops = [AppliedTransform("rot90", {"factor": 4}), AppliedTransform("rotate", {"angle": -1.2}),
              AppliedTransform("roll_vh", {"dy": 0, "dx": 0})]
    assert viz.describe_applied(no_ops) == "identity", "steps that change nothing visibly are not listed"
    assert viz.describe_applied([*no_ops, AppliedTransform("rot90", {"factor": 1})]) == "rot90 ×1"


def test_recipe_examples_show_a_visible_change_in_every_tile():
    panels = np.random.default_rng(0).integers(0, 256, size=(16, 32, 32), dtype=np.uint8)
    draws = viz.recipe_examples(panels, 3, True, "official", 8, seed=0)  # position rule: the sparse fallback
    assert len(draws) == 8 and not any(caption.endswith("identity") for caption in draws)


def test_compare_rules_and_sigmoid():
    diff = viz.compare_rules(["a", "b"], ["b", "c"])
    assert diff == {"correct": ["b"], "missing": ["a"], "extra": ["c"]}
    np.testing.assert_allclose(viz.sigmoid(np.array([-800.0, 0.0, 800.0])), [0.0, 0.5, 1.0])


def test_rule_comparison_lines_mark_each_rule_and_line_up():
    lines = viz.rule_comparison_lines(["Left: Constant on Size", "Right: Arithmetic on Color"],
                                      ["Right: Arithmetic on Color", "Left: Progression on Type"])
    assert lines == ["ok      Right: Arithmetic on Color", "missing Left: Constant on Size",
                     "extra   Left: Progression on Type"]


def test_plot_rpm_writes_the_rules_heading_it_is_given():
    panels = np.full((16, 20, 20), 255, np.uint8)
    fig = viz.plot_rpm(panels, target=1, rule_lines=["ok      Grid: Constant on Size"],
                       rules_heading="Rules, true vs predicted")
    text = fig.axes[-1].texts[0].get_text()
    assert text.startswith("Rules, true vs predicted:\n- ok      Grid: Constant on Size")


def test_history_x_counts_epochs_across_stages():
    h = {"stage": np.array(["pretrain", "pretrain", "linear", "linear"], dtype=object),
         "epoch": np.array([0.0, 1.0, 0.0, 1.0]), "val_loss": np.array([3.0, 2.0, 1.0, 0.5])}
    x, label, boundaries = viz.history_x(h)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0] and boundaries == [(0.0, "pretrain"), (2.0, "linear")]
    fig = viz.plot_history(h)
    assert fig.axes[0].lines[0].get_xdata().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert len(fig.axes[0].texts) == 2  # stage names


def test_project_root_and_resolve_path(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").mkdir()
    assert notebook.project_root(tmp_path / "notebooks") == tmp_path.resolve()
    assert notebook.resolve_path("data/x", tmp_path / "notebooks") == tmp_path.resolve() / "data" / "x"
    assert notebook.resolve_path("/abs/p", tmp_path) == Path("/abs/p")
