"""`make demo` end to end at smoke-test sizes (`--quick`): every step runs and the index lists real outputs; an
unknown or empty ``--steps`` is an argument error."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest


@pytest.mark.slow
def test_quick_demo_runs_every_step_and_indexes_its_outputs(tmp_path, capsys):
    from rpm_lib import demo

    out, data = tmp_path / "run", tmp_path / "data"
    argv = ["--out", str(out), "--data", str(data), "--num-per-config", "10", "--quick"]
    assert demo.main(argv) == 0
    printed = capsys.readouterr().out

    # Live progress: a line per finished epoch of each run, its stage's epoch limit from the run's config.yaml
    epoch_lines = re.findall(r"^  \[(\d)/2\] main/(\S+) (\w+) epoch (\d+)/(\d+): train loss \d+\.\d{4}, val (?:acc|loss) ",
                             printed, flags=re.MULTILINE)
    assert [line[:3] for line in epoch_lines] == [
        ("1", "setup-ce__seed-0", "supervised"), ("2", "setup-mlcl_aug_ft__seed-0", "pretrain"),
        ("2", "setup-mlcl_aug_ft__seed-0", "linear"), ("2", "setup-mlcl_aug_ft__seed-0", "finetune")], printed
    assert all(line[3:] == ("1", "1") for line in epoch_lines)  # --quick: one epoch per stage
    assert "first epoch measured" in printed
    assert printed.rstrip().splitlines()[-1].endswith(f"listed in {(out / 'index.html').resolve()} (and "
                                                      f"{out / 'index.md'})")

    runs = sorted(p.parent.name for p in (out / "batch").glob("*/*/metrics.json"))
    assert runs == ["setup-ce__seed-0", "setup-mlcl_aug_ft__seed-0"]
    for run in (out / "batch" / "main").iterdir():
        for notebook in ("03_train.ipynb", "04_evaluate.ipynb", "05_rule_predictions.ipynb"):
            executed = json.loads((run / notebook).read_text())
            errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
            assert not errors, f"{run.name}/{notebook} raised"
    assert (out / "batch" / "table1.md").is_file() and (out / "batch" / "06_results_table.ipynb").is_file()
    assert (out / "explore" / "01_explore_dataset.ipynb").is_file()
    assert (out / "explore" / "02_augmentations.ipynb").is_file()
    assert (data.with_name("data-48") / "manifest.json").is_file()

    index = (out / "index.md").read_text()
    for listed in ("gallery.png", "explore/02_augmentations.ipynb", "batch/main/setup-ce__seed-0/metrics.json",
                   "batch/table1.md", "| scl | MLCL+AUG+FT |"):
        assert listed in index
    linked = [line.split("](", 1)[1].rstrip(")") for line in index.splitlines() if line.startswith("- [")]
    assert linked and all((out / path).is_file() for path in linked)
    assert "<img src='gallery.png'" in (out / "index.html").read_text()

    # A rerun reuses everything: no notebook is executed again, every training run is skipped.
    capsys.readouterr()
    assert demo.main(argv) == 0
    printed = capsys.readouterr().out
    assert "2 already finished" in printed and "reusing" in printed


def test_demo_exits_2_for_an_unknown_step(capsys: pytest.CaptureFixture[str]) -> None:
    # an unknown step exited 1 as "demo: error: ...", unlike every other argument error
    from rpm_lib import demo

    try:
        code = demo.main(["--steps", "zzz", "--out", "unused", "--data", "unused"])
    except SystemExit as stopped:
        code = stopped.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "zzz" in err[0], (code, err)


def test_demo_refuses_an_empty_step_list(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # --steps "" (or ",") ran no step and reported "finished", exit 0
    from rpm_lib import demo

    try:
        code = demo.main(["--steps", "", "--out", str(tmp_path / "out"), "--data", str(tmp_path / "data")])
    except SystemExit as stopped:
        code = stopped.code
    assert code == 2, capsys.readouterr()


DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000  # json.loads alone: a RecursionError


def _summary_of(tmp_path: Path, metrics_text: str) -> list[dict]:
    from rpm_lib import demo

    run = tmp_path / "out" / "batch" / "main" / "setup-ce__seed-0"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(metrics_text)
    return demo.demo_summary(demo.DemoContext(out=tmp_path / "out", data=tmp_path / "data", cache=tmp_path / "c"))


@pytest.mark.parametrize("metrics_text, shown", [
    (DEEP, "nested deeper than 200 levels"),
    ('{"test_num_samples": "70", "test_accuracy": 0.5}', "field 'test_num_samples' must be int, got str '70'"),
    ('{"test_accuracy": 0.5}', "field 'test_num_samples' must be a count >= 1, got None"),  # found: KeyError
    ('{"test_num_samples": 70, "test_accuracy": 7.5}', "field 'test_accuracy' must be a fraction in [0, 1], got 7.5"),
    ('{"test_num_samples": 70, "test_accuracy": 0.5, "stages": ["linear"]}',  # found: AttributeError
     "field 'stages' must hold objects, got 'linear'"),
    ('{"test_num_samples": 70, "test_accuracy": 0.5, "test_accuracy_per_configuration_short": {"Center": "x"}}',
     "field 'test_accuracy_per_configuration_short' must hold fractions in [0, 1], got 'x'"),
])
def test_a_hostile_metrics_json_is_one_line_naming_file_and_field(tmp_path: Path, metrics_text: str,
                                                                   shown: str) -> None:
    with pytest.raises(ValueError) as caught:
        _summary_of(tmp_path, metrics_text)
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "out" / "batch" / "main" / "setup-ce__seed-0" / "metrics.json"))
    assert shown in message and "\n" not in message, message


def test_a_setup_label_cannot_break_the_index_table(tmp_path: Path) -> None:
    row, = _summary_of(tmp_path, json.dumps({"test_num_samples": 70, "test_accuracy": 0.5,
                                             "setup_label": "CE\n| forged | row |", "encoder": "scl"}))
    assert "\n" not in row["setup"] and row["setup"].startswith("CE\\n")


@pytest.mark.parametrize("text", [DEEP, '{"cells": {"0": {}}}', '{"cells": [{"outputs": "none"}]}',
                                  '{"cells": [{"outputs": [3]}]}'])
def test_a_malformed_executed_notebook_is_executed_again_not_a_traceback(tmp_path: Path, text: str) -> None:
    from rpm_lib import demo

    (tmp_path / "01.ipynb").write_text(text)
    assert demo._executed_ok(tmp_path / "01.ipynb") is False
    (tmp_path / "01.ipynb").write_text(json.dumps({"cells": [{"outputs": [{"output_type": "stream"}]}]}))
    assert demo._executed_ok(tmp_path / "01.ipynb") is True
