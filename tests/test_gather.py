"""Gathering run folders into Table 1 (``rpm_lib.results``, ``rpm-batch --gather``) when others made, copied,
edited or damaged them.

The worst failure here is a table that looks right and is not: each test names a run folder that must be named
rather than counted wrongly, dropped without a word, or allowed to crash the whole gather with a traceback."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gathered_runs import run_metrics, write_run
from rpm_lib import batch, results
from rpm_lib.results import gather
from rpm_lib.rules import CONFIGURATIONS

LAST = CONFIGURATIONS[-1]  # O-IG


def _config(**fields) -> dict:
    """A metrics.json ``config`` as training records it (the fields these tests look at)."""
    return {"encoder": "scl", "setup": "ce", "seed": 0, "dataset": "iraven", "data_root": "data/i-raven-80",
            "image_size": 80, "lr": 0.002, "batch_size": 128, "max_epochs": 100, "run_dir": "runs/x",
            "num_workers": 3, "accelerator": "auto", **fields}


def _seeded(root: Path, seed: int, value: float = 0.6, setup: str = "ce", sub: str = "main", **config) -> Path:
    """A finished run of ``setup`` / ``seed`` whose metrics.json records the config it trained with."""
    cfg = _config(setup=setup, seed=seed, **config)
    return write_run(root, f"{sub}/setup-{setup}__seed-{seed}", {"setup": setup, "seed": str(seed)},
                {"encoder": "scl", "setup": setup, "seed": seed},
                run_metrics(value, encoder="scl", setup=setup, seed=seed, config=cfg))


def _gather(out: Path, capsys) -> tuple[int, str, str]:
    code = batch.main(["--gather", str(out)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _table_lines(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("|")]


# --- a damaged run folder is one named run, never a traceback that loses the whole table ----------------------

@pytest.mark.parametrize("metrics, named", [
    ("{not json", "not valid JSON"),
    (json.dumps(run_metrics(84.7)), "not a fraction"),                      # percent instead of a fraction
    (json.dumps({"test_accuracy_per_configuration": "abc"}), "must be a mapping"),
    (json.dumps({**run_metrics(), "test_sets": ["test"]}), "test_sets"),    # an entry that is not an object
    (json.dumps({**run_metrics(), "test_sets": "test"}), "test_sets"),
    ("[1, 2]", "expected a JSON object"),
])
def test_gather_names_a_damaged_run_and_tables_the_others(tmp_path, capsys, metrics, named):
    # rpm-batch --gather died with a ValueError / AttributeError traceback: no table at all for the 3 good runs
    out = tmp_path / "out"
    for seed in range(3):
        _seeded(out, seed)
    write_run(out, "main/setup-ce__seed-3", {"setup": "ce", "seed": "3"}, {}, metrics)
    code, printed, err = _gather(out, capsys)
    assert code == 0, err
    md = (out / "table1.md").read_text()
    (row,) = [line for line in _table_lines(md) if "| CE |" in line]
    assert "| 3 | 60.0 ± 0.0 |" in row
    assert "setup-ce__seed-3" in md and named in md, md
    assert "Traceback" not in err
    rows = {r["name"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert rows["setup-ce__seed-3"]["status"] == "damaged" and named in rows["setup-ce__seed-3"]["error"]


@pytest.mark.parametrize("record", [{"name": "r", "labels": ["setup", "ce"]}, {"name": "r", "parameters": [1]},
                                    {"name": "r", "labels": {"seed": {"a": 1}}}])
def test_a_run_json_of_the_wrong_shape_is_one_line_naming_it(tmp_path, record):
    # TypeError / AttributeError from deep inside load_run
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"run\.json: "):
        results.load_run(folder)
    (only,) = results.load_runs(tmp_path)
    assert only.status == "damaged" and "run.json" in only.problem


def test_an_error_txt_that_is_not_utf8_is_shown_not_a_crash(tmp_path, capsys):
    # UnicodeDecodeError while reading a failed run's error.txt (a traceback with bytes from the notebook)
    out = tmp_path / "out"
    _seeded(out, 0)
    failed = write_run(out, "main/setup-ce__seed-1", {"setup": "ce", "seed": "1"})
    (failed / "error.txt").write_bytes(b"boom\nKeyError: \xff\xfe\n")
    code, _, err = _gather(out, capsys)
    assert code == 0, err
    rows = {r["name"]: r for r in csv.DictReader((out / "results.csv").open(encoding="utf-8"))}
    assert rows["setup-ce__seed-1"]["status"] == "failed" and rows["setup-ce__seed-1"]["error"].startswith("KeyError")


def test_a_huge_metrics_json_is_refused_by_its_size_without_reading_it(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    with (folder / "metrics.json").open("wb") as fh:
        fh.truncate(300 * 2**20)  # sparse: 300 MiB of nothing
    began = time.perf_counter()
    with pytest.raises(ValueError, match=r"metrics\.json: .*MiB"):
        results.load_run(folder)
    assert time.perf_counter() - began < 0.5


# --- a run whose records disagree is not counted under the labels ------------------------------------------------

@pytest.mark.parametrize("labels, params, field", [
    ({"setup": "mlcl_aug", "seed": "0"}, {}, "setup"),            # metrics.json of a CE run in an MLCL+AUG folder
    ({"encoder": "hrinet", "setup": "ce", "seed": "0"}, {}, "encoder"),
    ({"setup": "ce", "seed": "1"}, {}, "seed"),                   # seed 0's metrics.json copied into seed 1's folder
    ({"setup": "ce", "seed": "0"}, {"lr": 0.001}, "lr"),           # the YAML's lr changed, finished runs kept
    ({"setup": "ce", "seed": "0"}, {"max_epochs": 20}, "max_epochs"),
])
def test_a_run_whose_metrics_contradict_its_labels_is_named_not_counted(tmp_path, labels, params, field):
    out = tmp_path / "out"
    _seeded(out, 5, sub="other")  # a good run, so the table is not empty
    write_run(out, "main/odd", labels, params, run_metrics(0.9, encoder="scl", setup="ce", seed=0, config=_config()))
    records = results.load_runs(out)
    odd = next(r for r in records if r.name == "odd")
    with pytest.raises(ValueError, match=rf"odd.*{field}"):
        results.table1(records)
    paths = results.write_tables(records, tmp_path / "t")
    md = paths["table1_md"].read_text()
    assert "90.0" not in md and "odd" in md and field in md, md
    assert odd.status == "done" and field in odd.conflict  # it finished; its number is not the labels' run


def test_a_single_run_whose_metrics_json_contradicts_its_config_yaml_is_named_not_counted(tmp_path):
    # an rpm-train folder (no run.json) holding another run's metrics.json: counted as that other run
    good = write_run(tmp_path, "good", None, metrics=run_metrics(encoder="scl", setup="ce", seed=0, config=_config()))
    (good / "config.yaml").write_text("encoder: scl\nsetup: ce\nseed: 0\nlr: 0.002\nrun_dir: elsewhere\n")
    odd = write_run(tmp_path, "odd", None, metrics=run_metrics(encoder="scl", setup="ce", seed=0, config=_config()))
    (odd / "config.yaml").write_text("encoder: scl\nsetup: mlcl_aug\nseed: 3\n")
    records = {r.name: r for r in results.load_runs(tmp_path)}
    assert records["good"].status == "done"
    assert records["good"].conflict is None
    assert "config.yaml asks for setup='mlcl_aug'" in records["odd"].conflict


def test_the_encoder_comes_from_metrics_json_when_the_grid_does_not_label_it(tmp_path):
    # the batch's `fixed` left the encoder to the template's default: the row was "?" with no paper numbers
    write_run(tmp_path, "main/seed-0", {"seed": "0"}, {"setup": "ce"}, run_metrics(encoder="scl", setup="ce", seed=0))
    (row,) = results.table1(results.load_runs(tmp_path))
    assert (row.encoder, row.setup) == ("SCL", "CE") and row.paper is not None


# --- runs trained differently are never averaged into one row ---------------------------------------------------

@pytest.mark.parametrize("field, values", [("lr", (0.002, 0.001)), ("image_size", (80, 48)),
                                           ("dataset_regime", None), ("max_epochs", (100, 5))])
def test_seeds_trained_with_other_settings_get_rows_of_their_own(tmp_path, field, values):
    if field == "dataset_regime":
        _seeded(tmp_path, 0, value=0.8)
        odd = _seeded(tmp_path, 1, value=0.4)
        metrics = json.loads((odd / "metrics.json").read_text())
        metrics["test_sets"] = [{"name": "test", "split": "test", "regime": "I-RAVEN", "accuracy": 0.4,
                                 "num_samples": 700}]
        (odd / "metrics.json").write_text(json.dumps(metrics))
        metrics["test_sets"][0]["regime"] = "A/Color"
        (tmp_path / "main" / "setup-ce__seed-0" / "metrics.json").write_text(json.dumps(
            {**json.loads((tmp_path / "main" / "setup-ce__seed-0" / "metrics.json").read_text()),
             "test_sets": [{**metrics["test_sets"][0], "accuracy": 0.8}]}))
    else:
        _seeded(tmp_path, 0, value=0.8, **{field: values[0]})
        _seeded(tmp_path, 1, value=0.4, **{field: values[1]})
    rows = results.table1(results.load_runs(tmp_path))
    assert len(rows) == 2, [(r.group, r.seeds) for r in rows]
    assert all(len(r.seeds) == 1 for r in rows)
    md = results.table1_markdown(rows)
    assert "60.0" not in md  # the average of the two experiments is no one's number


def test_test_sets_of_other_sizes_are_not_averaged_as_equals(tmp_path):
    _seeded(tmp_path, 0, value=0.8)
    small = _seeded(tmp_path, 1, value=0.4)
    metrics = json.loads((small / "metrics.json").read_text())
    (small / "metrics.json").write_text(json.dumps({**metrics, "test_num_samples": 14}))  # a tiny cache
    rows = results.table1(results.load_runs(tmp_path))
    assert sorted(len(r.seeds) for r in rows) == [1, 1]
    assert any("14" in ", ".join(f"{k}={v}" for k, v in r.group.items()) for r in rows)


def test_a_pgm_run_gets_no_iraven_paper_numbers(tmp_path):
    # a PGM run records no I-RAVEN regime, so it was compared with the paper's I-RAVEN Table 1
    write_run(tmp_path, "main/pgm", {"encoder": "scl", "setup": "ce", "seed": "0"}, {},
         {"test_accuracy": 0.7, "dataset": "pgm", "test_accuracy_per_regime": {"neutral": 0.7}, "encoder": "scl",
          "setup": "ce", "seed": 0, "config": _config(dataset="pgm")})
    (row,) = results.table1(results.load_runs(tmp_path))
    assert row.paper is None


def test_a_run_missing_a_configuration_is_not_averaged_with_full_runs_and_its_paper_delta_is_flagged(tmp_path):
    _seeded(tmp_path, 0, value=0.8)
    partial = _seeded(tmp_path, 1, value=0.8)
    metrics = json.loads((partial / "metrics.json").read_text())
    metrics["test_accuracy_per_configuration"][LAST] = 0.1
    del metrics["test_accuracy_per_configuration"][CONFIGURATIONS[0]]
    (partial / "metrics.json").write_text(json.dumps(metrics))
    rows = results.table1(results.load_runs(tmp_path))
    assert len(rows) == 2, [(r.group, r.seeds) for r in rows]
    (full,) = [r for r in rows if r.seeds == ["0"]]
    (part,) = [r for r in rows if r.seeds == ["1"]]
    assert full.per_configuration["O-IG"] == pytest.approx(80.0)
    assert not any("Average over" in note for note in full.notes)
    assert any("Average over 6 configurations (no Center)" in note for note in part.notes), part.notes


@pytest.mark.parametrize("other", ["untrained_head", "linear_probe_v2"])
def test_an_mlcl_run_whose_linear_evaluation_never_ran_is_not_a_table1_number(tmp_path, other):
    # protocol untrained_head (max_total_epochs left linear evaluation no epoch), or one this rpm_lib does not
    # know: counted as MLCL beside the paper
    for seed, protocol in ((0, "linear_evaluation"), (1, other)):
        write_run(tmp_path, f"main/s{seed}", {"setup": "mlcl", "seed": str(seed)}, {},
             run_metrics(0.5 + 0.3 * seed, encoder="scl", setup="mlcl", seed=seed, protocol=protocol))
    rows = results.table1(results.load_runs(tmp_path))
    assert [(r.setup, r.seeds) for r in rows][0] == ("MLCL", ["0"])
    assert len(rows) == 2 and rows[1].paper is None and rows[1].setup != "MLCL"


# --- the same run counted twice ---------------------------------------------------------------------------------

def test_a_run_folder_copied_twice_counts_once_and_the_copy_is_named(tmp_path):
    # combining machines: machine B's folder also held seed 0; 2 "seeds" gave std 0 and a row of 3 runs
    _seeded(tmp_path, 0, value=0.8, sub="A/main")
    _seeded(tmp_path, 1, value=0.6, sub="A/main")
    shutil.copytree(tmp_path / "A" / "main" / "setup-ce__seed-0", tmp_path / "B" / "main" / "setup-ce__seed-0")
    (row,) = results.table1(results.load_runs(tmp_path))
    assert sorted(row.seeds) == ["0", "1"] and row.average == pytest.approx(70.0)
    md = results.table1_markdown([row])
    assert "B/main/setup-ce__seed-0" in md and "seed 0" in md, md


def test_the_ablation_plot_counts_a_copied_seed_once_and_names_a_value_that_is_no_number(tmp_path):
    for sub in ("A", "B"):  # the same run from two machines: 3 points at beta=0 where 2 seeds ran
        write_run(tmp_path, f"{sub}/beta/b0", {"setup": "mlcl", "beta": "0", "seed": "0"}, {"beta": 0.0},
             run_metrics(0.3, encoder="scl"))
    write_run(tmp_path, "A/beta/b0s1", {"setup": "mlcl", "beta": "0", "seed": "1"}, {"beta": 0.0},
         run_metrics(0.5, encoder="scl"))
    (point,) = results.ablation_series(results.load_runs(tmp_path), "beta")["SCL MLCL"]
    assert point.seeds == 2 and point.mean == pytest.approx(40.0)
    # a run copied and relabelled beta=10, its records left saying beta=0: refused, named
    write_run(tmp_path, "D/beta/b10", {"setup": "mlcl", "beta": "10", "seed": "0"}, {"beta": 10.0},
         run_metrics(0.3, encoder="scl", config=_config(setup="mlcl", beta=0.0)))
    with pytest.raises(ValueError, match=r"b10.*beta=0\.0"):
        results.ablation_series(results.load_runs(tmp_path), "beta")
    # float("high") said "could not convert string to float: 'high'", naming no run
    write_run(tmp_path, "C/beta/high", {"setup": "mlcl", "beta": "high", "seed": "2"}, {"beta": "high"},
         run_metrics(0.3, encoder="scl"))
    with pytest.raises(ValueError, match=r"high.*run\.json: parameter 'beta' must be a number"):
        results.ablation_series(results.load_runs(tmp_path), "beta")


# --- runs that are not in the table are named where the table is -------------------------------------------------

def test_table1_md_names_the_runs_it_leaves_out(tmp_path, capsys):
    out = tmp_path / "out"
    _seeded(out, 0)
    write_run(out, "main/setup-ce__seed-1", {"setup": "ce", "seed": "1"})        # planned or running: no metrics.json
    single = out / "single"                                                # an rpm-train run stopped by a budget
    single.mkdir()
    (single / "config.yaml").write_text("encoder: scl\nsetup: ce\nseed: 2\n")
    (single / "progress.json").write_text(json.dumps({"status": "unfinished", "stages": {}}))
    failed = write_run(out, "main/setup-ce__seed-3", {"setup": "ce", "seed": "3"})
    (failed / "error.txt").write_text("Traceback\nRuntimeError: out of memory\n")
    code, printed, err = _gather(out, capsys)
    assert code == 0, err
    md = (out / "table1.md").read_text()
    for name in ("setup-ce__seed-1", "single", "setup-ce__seed-3"):
        assert name in md, (name, md)
    assert "out of memory" in md and "unfinished" in md
    names = [r["name"] for r in csv.DictReader((out / "results.csv").open())]
    assert "single" in names


def test_a_symlinked_run_folder_is_named_not_silently_dropped(tmp_path, capsys):
    out = tmp_path / "out"
    _seeded(out, 0)
    _seeded(tmp_path / "elsewhere", 1)
    (out / "main" / "link").symlink_to(tmp_path / "elsewhere" / "main" / "setup-ce__seed-1", target_is_directory=True)
    code, _, err = _gather(out, capsys)
    assert code == 0, err
    md = (out / "table1.md").read_text()
    assert "link" in md and "symbolic link" in md, md


_GATHER = """
import sys
from pathlib import Path
from rpm_lib import results
out = Path(sys.argv[1])
results.write_tables(results.load_runs(out), out)
print("gathered")
"""


def test_a_run_folder_or_file_that_cannot_be_read_is_named_not_lost(tmp_path):
    # a metrics.json without read permission was a PermissionError traceback; a run folder that cannot be listed
    # was passed over by rglob without a word
    out = tmp_path / "out"
    _seeded(out, 0)
    locked = _seeded(out, 1)
    hidden = _seeded(out, 2)
    os.chmod(locked / "metrics.json", 0)
    os.chmod(hidden, 0)
    command = [sys.executable, "-c", _GATHER, str(out)]
    if os.geteuid() == 0:  # root reads anything: drop the capability that lets it
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        command = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1],
                              env={**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"})
    finally:
        os.chmod(hidden, 0o755)
    assert done.returncode == 0 and "gathered" in done.stdout, done.stderr[-800:]
    md = (out / "table1.md").read_text()
    assert "setup-ce__seed-1" in md and "Permission denied" in md, md
    assert "setup-ce__seed-2" in md and "cannot be listed" in md, md


# --- names and labels from others' folders ----------------------------------------------------------------------

def test_a_run_folder_named_in_bytes_that_are_not_utf8_is_gathered(tmp_path, capsys):
    out = tmp_path / "out"
    _seeded(out, 0)
    odd = os.fsencode(out / "main") + b"/seed-\xff"
    os.makedirs(odd)
    with open(odd + b"/metrics.json", "w") as fh:
        fh.write(json.dumps(run_metrics(0.6, encoder="scl", setup="ce", seed=1)))
    code, printed, err = _gather(out, capsys)
    assert code == 0, err
    assert "seed-" in (out / "results.csv").read_text(encoding="utf-8")


def test_labels_with_line_breaks_or_pipes_keep_table1_md_one_row_each(tmp_path, capsys):
    out = tmp_path / "out"
    write_run(out, "main/a", {"setup": "ce", "seed": "0", "data": "x\n| fake | row |"}, {}, run_metrics())
    write_run(out, "main/b", {"setup": "ce\r\nMLCL", "seed": "1"}, {}, run_metrics())
    code, _, err = _gather(out, capsys)
    assert code == 0, err
    lines = _table_lines((out / "table1.md").read_text(encoding="utf-8"))
    assert len(lines) == 2 + 2, lines
    assert all(len(re.findall(r"(?<!\\)\|", line)) == len(results.table1_header()) + 1 for line in lines), lines


def test_a_run_json_with_a_lone_surrogate_is_gathered(tmp_path, capsys):
    # JSON may spell "\udcff", which no UTF-8 file can hold: writing results.csv raised UnicodeEncodeError
    out = tmp_path / "out"
    (out / "main" / "b").mkdir(parents=True)
    (out / "main" / "b" / "run.json").write_text('{"name": "b\\udcff", "grid": "main", '
                                                 '"labels": {"setup": "ce", "seed": "1", "data": "y\\udcff"}}')
    (out / "main" / "b" / "metrics.json").write_text(json.dumps(run_metrics()))
    code, _, err = _gather(out, capsys)
    assert code == 0, err
    assert len(_table_lines((out / "table1.md").read_text(encoding="utf-8"))) == 3


# --- runs reached again, gathered where one cannot write, written for spreadsheets ----------------------------------

def test_a_finished_run_reached_again_keeps_the_run_json_of_its_results(tmp_path):
    # found: run_one rewrote run.json before it saw the run had finished, so a batch run again after its YAML was
    # edited (lr 0.002 -> 0.01) relabelled results trained with lr 0.002
    template = Path(__file__).resolve().parents[1] / "notebooks" / "03_train.ipynb"
    config_path = tmp_path / "grid.yaml"
    config_path.write_text(f"template: {template}\nout: {tmp_path / 'out'}\nfixed: {{lr: 0.01}}\naxes: {{seed: [0]}}\n")
    config = batch.load_batch_config(config_path)
    spec = batch.expand_grid(config)[0]
    run_dir = batch.run_dir_of(config.out, spec)
    earlier = {"name": spec.name, "grid": spec.grid, "labels": spec.labels, "parameters": {"lr": 0.002, "seed": 0}}
    write_run(config.out / spec.grid, spec.name, None, metrics=run_metrics(config=_config(lr=0.002)))
    (run_dir / "run.json").write_text(json.dumps(earlier))

    assert batch.run_one(spec, config, config.out).status == "skipped"

    assert json.loads((run_dir / "run.json").read_text()) == earlier
    assert results.load_runs(config.out)[0].conflict is None


def test_gather_of_a_folder_one_cannot_write_is_one_line(tmp_path, capsys, monkeypatch):
    # found: rpm-batch --gather of a shared, read-only batch folder ended in a PermissionError traceback
    _seeded(tmp_path / "grid", 0)

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "grid" / "results.csv"))

    monkeypatch.setattr(gather, "write_csv", refused)
    code, out, err = _gather(tmp_path / "grid", capsys)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rpm-batch: error: --gather: Permission denied ("), lines
    assert "gather a copy of it that you can write to" in lines[0]


def test_a_label_that_a_spreadsheet_would_run_as_a_formula_is_written_as_text(tmp_path, capsys):
    # found: results.csv kept a run.json label `=HYPERLINK(...)` as it was: a spreadsheet opening it runs it
    write_run(tmp_path / "grid", "a", {"setup": "ce", "seed": "0", "note": '=HYPERLINK("http://x","y")'}, {"lr": 0.002},
         run_metrics())
    write_run(tmp_path / "grid", "b", {"setup": "ce", "seed": "1", "note": "-0.5"}, {"lr": 0.002}, run_metrics())
    code, _, _ = _gather(tmp_path / "grid", capsys)
    assert code == 0
    with (tmp_path / "grid" / "results.csv").open(newline="") as handle:
        notes = [row["note"] for row in csv.DictReader(handle)]
    assert notes == ['\'=HYPERLINK("http://x","y")', "-0.5"]  # a number stays a number


def test_a_metrics_json_that_names_a_key_twice_is_named_not_read_as_its_last_value(tmp_path, capsys):
    # found: json kept the last "test_accuracy" of a hand-edited metrics.json without a word
    text = json.dumps(run_metrics(0.6)).replace('"test_num_samples"', '"test_accuracy": 0.9, "test_num_samples"')
    write_run(tmp_path / "grid", "a", {"setup": "ce", "seed": "0"}, {}, text)
    _seeded(tmp_path / "grid", 1)
    code, _, _ = _gather(tmp_path / "grid", capsys)
    assert code == 0
    md = (tmp_path / "grid" / "table1.md").read_text()
    assert "the key 'test_accuracy' is given twice" in md and "- a: " in md, md
