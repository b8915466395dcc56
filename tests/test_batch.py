"""rpm-batch: config parsing, grid expansion, resumable execution with failures, results files.

Executions use a tiny stand-in notebook (no torch) so the runner itself is tested in a few seconds;
the real ``03_train`` template is exercised by ``tests/test_notebooks.py``.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest

from rpm_lib import batch
from rpm_lib.batch.grid import run_name, slug
from rpm_lib.batch.notebook import check_parameters
from rpm_lib.batch.prepare import run_prepare
from rpm_lib.notebook_execution import kernel_log_of
from rpm_lib.rules import CONFIGURATIONS
from rpm_lib.run_folder import METRICS

FAKE_TRAIN_BODY = """
import json, pathlib
if fail:
    raise RuntimeError(f"deliberate failure for seed {seed}")
acc = {c: round(0.5 + 0.01 * seed + 0.001 * i, 4) for i, c in enumerate(CONFIGS)}
pathlib.Path(output_dir).mkdir(parents=True, exist_ok=True)
pathlib.Path(output_dir, "figure.txt").write_text("drawn")
pathlib.Path(run_dir, "metrics.json").write_text(json.dumps(
    {"test_accuracy": sum(acc.values()) / len(acc), "test_accuracy_per_configuration": acc,
     "encoder": encoder, "setup": setup, "lr": lr}))
print("trained", encoder, setup, seed)
"""

FAKE_REPORT_BODY = """
import pathlib
pathlib.Path(output_dir).mkdir(parents=True, exist_ok=True)
runs = sorted(p.parent.name for p in pathlib.Path(batch_dir).rglob("metrics.json"))
pathlib.Path(output_dir, "report.txt").write_text(",".join(runs))
"""

FAKE_EVAL_BODY = """
import json, pathlib
m = json.loads(pathlib.Path(run_dir, "metrics.json").read_text())
pathlib.Path(output_dir).mkdir(parents=True, exist_ok=True)
pathlib.Path(output_dir, "seen.txt").write_text(m["encoder"])
"""


def _notebook(path: Path, parameters: str, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(body),
    ]
    nbformat.write(nb, path)
    return path


@pytest.fixture
def fake_templates(tmp_path: Path) -> tuple[Path, Path]:
    _notebook(tmp_path / "report.ipynb", 'batch_dir: str = ""\noutput_dir: str = ""\n', FAKE_REPORT_BODY)
    train = _notebook(
        tmp_path / "train.ipynb",
        'run_dir: str = ""\noutput_dir: str = ""\nencoder: str = "scl"\nsetup: str = "ce"\n'
        'seed: int = 0\nlr: float = 0.1\n'
        f"fail: bool = False\nCONFIGS = {list(CONFIGURATIONS)!r}\n",
        FAKE_TRAIN_BODY,
    )
    evaluate = _notebook(tmp_path / "evaluate.ipynb", 'run_dir: str = ""\noutput_dir: str = ""\n', FAKE_EVAL_BODY)
    return train, evaluate


def _write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_expand_grid_product_precedence_and_names(tmp_path, fake_templates):
    train, _ = fake_templates
    cfg_path = _write_config(tmp_path / "b.yaml", f"""
template: {train}
out: {tmp_path / 'out'}
fixed: {{lr: 0.1, epochs: 3}}
grids:
  - name: main
    fixed: {{epochs: 5}}
    axes:
      encoder: [scl, wren]
      setup:
        CE: {{setup: ce, beta: 0}}
        MLCL+AUG: {{setup: mlcl, augment: official}}
      seed: [0, 1, 2]
  - name: extra
    default: false
    axes: {{beta: [1, 10]}}
""")
    cfg = batch.load_batch_config(cfg_path)
    specs = batch.expand_grid(cfg)
    assert len(specs) == 2 * 2 * 3
    first = specs[0]
    assert first.name == "encoder-scl__setup-CE__seed-0"
    assert first.labels == {"encoder": "scl", "setup": "CE", "seed": "0"}
    assert first.parameters == {"lr": 0.1, "epochs": 5, "encoder": "scl", "setup": "ce", "beta": 0, "seed": 0}
    aug = [s for s in specs if s.labels["setup"] == "MLCL+AUG"][0]
    assert aug.name.endswith("setup-MLCL_AUG__seed-0") and aug.parameters["augment"] == "official"
    assert len({s.name for s in specs}) == len(specs)
    # non-default grids only on request; overrides win over everything
    extra = batch.expand_grid(cfg, grids=["extra"], overrides={"lr": 0.5})
    assert [s.parameters["beta"] for s in extra] == [1, 10] and all(s.parameters["lr"] == 0.5 for s in extra)
    assert {s.grid for s in extra} == {"extra"}
    with pytest.raises(batch.BatchConfigError, match="unknown grid"):
        batch.expand_grid(cfg, grids=["nope"])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("axes: {seed: []}", "is empty"),
        ("axes: {seed: [0]}\nbogus: 1", "unknown key"),
        ("axes: {seed: 3}", "must be a list of values or a mapping"),
        ("grids: [{name: a, axes: {seed: [0]}}, {name: a, axes: {seed: [1]}}]", "unique"),
        ("axes: {seed: [0]}\nfixed: {output_dir: x}", "set by rpm-batch"),
        ("axes: {seed: {a: {run_dir: x}}}", "set by rpm-batch"),
        ("axes: {seed: [0]}\nprepare: [{run: 'echo hi'}]", "list of arguments"),
        ("axes: {seed: [0]}\ngrids: []", "exactly one of"),
        ("axes: {label: [a, b]}\n", None),
    ],
)
def test_config_errors_name_file_and_entry(tmp_path, fake_templates, body, message):
    train, _ = fake_templates
    cfg_path = _write_config(tmp_path / "bad.yaml", f"template: {train}\n{body}\n")
    if message is None:  # control: a valid file parses
        assert len(batch.expand_grid(batch.load_batch_config(cfg_path))) == 2
        return
    with pytest.raises(batch.BatchConfigError, match=message) as info:
        batch.load_batch_config(cfg_path)
    assert str(cfg_path) in str(info.value)


def test_missing_template_is_reported(tmp_path):
    cfg_path = _write_config(tmp_path / "b.yaml", f"template: {tmp_path / 'missing.ipynb'}\naxes: {{seed: [0]}}\n")
    with pytest.raises(FileNotFoundError, match="missing.ipynb"):
        batch.load_batch_config(cfg_path)


def test_slug_and_run_name():
    assert slug("MLCL+AUG") == "MLCL_AUG"
    assert slug("0.5") == "0.5"
    assert run_name({"encoder": "scl", "beta": "0.1"}) == "encoder-scl__beta-0.1"
    with pytest.raises(ValueError, match="no letters"):
        slug("+++")


def test_dry_run_plans_without_writing(tmp_path, fake_templates, capsys):
    train, _ = fake_templates
    out = tmp_path / "out"
    cfg_path = _write_config(tmp_path / "b.yaml", f"template: {train}\nout: {out}\naxes: {{seed: [0, 1]}}\n")
    results = batch.run_batch(cfg_path, dry_run=True)
    assert [r.status for r in results] == ["planned", "planned"]
    assert not out.exists()
    printed = capsys.readouterr().out
    assert "seed-0" in printed and "seed-1" in printed


def test_batch_runs_records_failures_resumes_and_gathers(tmp_path, fake_templates, monkeypatch):
    train, evaluate = fake_templates
    out = tmp_path / "out"
    marker = tmp_path / "prepared.txt"
    cfg_path = _write_config(tmp_path / "b.yaml", f"""
template: {train}
then: [{evaluate}]
report: {tmp_path / "report.ipynb"}
out: {out}
prepare:
  - creates: {marker}
    run: [{sys.executable}, -c, "import pathlib; pathlib.Path(r'{marker}').write_text('x')"]
fixed: {{lr: 0.01}}
axes:
  encoder: [scl]
  setup: [MLCL]
  seed:
    "0": {{seed: 0}}
    "1": {{seed: 1}}
    "2": {{seed: 2, fail: true}}
""")
    monkeypatch.chdir(tmp_path)
    results = batch.run_batch(cfg_path, jobs=2, quiet=True)
    assert marker.read_text() == "x"
    status = {r.spec.labels["seed"]: r.status for r in results}
    assert status == {"0": "done", "1": "done", "2": "failed"}

    ok_dir = out / "main" / "encoder-scl__setup-MLCL__seed-0"
    run_info = json.loads((ok_dir / "run.json").read_text())
    assert run_info["parameters"]["lr"] == 0.01 and run_info["labels"]["seed"] == "0"
    assert (ok_dir / "train.ipynb").is_file()
    assert (ok_dir / "train" / "figure.txt").read_text() == "drawn"  # output_dir = <run>/<template stem>
    assert (ok_dir / "evaluate" / "seen.txt").read_text() == "scl"  # `then` notebook got run_dir

    bad_dir = out / "main" / "encoder-scl__setup-MLCL__seed-2"
    assert not (bad_dir / "metrics.json").exists()
    assert "deliberate failure for seed 2" in (bad_dir / "error.txt").read_text()
    executed = nbformat.read(bad_dir / "train.ipynb", as_version=4)
    assert executed.metadata.papermill.exception is True

    csv_text = (out / "results.csv").read_text()
    assert "failed" in csv_text and csv_text.count("\n") == 4  # header + 3 runs
    finished = "encoder-scl__setup-MLCL__seed-0,encoder-scl__setup-MLCL__seed-1"
    assert (out / "report" / "report.txt").read_text() == finished  # the report notebook saw the batch
    assert (out / "report.ipynb").is_file()
    table = (out / "table1.md").read_text()
    assert "| SCL | MLCL |" in table and "95.7" in table  # ours beside the paper's 95.7

    # second invocation: finished runs are skipped, the failed one is retried (and fails again)
    mtime = (ok_dir / "metrics.json").stat().st_mtime_ns
    again = batch.run_batch(cfg_path, jobs=1, quiet=True)
    assert {r.spec.labels["seed"]: r.status for r in again} == {"0": "skipped", "1": "skipped", "2": "failed"}
    assert (ok_dir / "metrics.json").stat().st_mtime_ns == mtime

    # a lost `then` output is redone without retraining
    (ok_dir / "evaluate.ipynb").unlink()
    third = batch.run_batch(cfg_path, quiet=True)
    assert third[0].status == "done" and (ok_dir / "evaluate.ipynb").is_file()
    assert (ok_dir / "metrics.json").stat().st_mtime_ns == mtime


def test_cli_help_and_dry_run(tmp_path, fake_templates, capsys):
    with pytest.raises(SystemExit) as info:
        batch.main(["--help"])
    assert info.value.code == 0
    assert "resumabl" in capsys.readouterr().out
    train, _ = fake_templates
    cfg_path = _write_config(tmp_path / "b.yaml", f"template: {train}\nout: {tmp_path / 'o'}\naxes: {{seed: [0]}}\n")
    assert batch.main([str(cfg_path), "--dry-run", "--set", "lr=0.5"]) == 0
    assert "lr=0.5" in capsys.readouterr().out
    assert batch.main([str(tmp_path / "nope.yaml")]) == 2


@pytest.mark.parametrize("name", ["demo.yaml", "table1.yaml", "table1_scl_gpu.yaml", "table1_scl_tiny.yaml",
                                  "table1_predrnet_gpu.yaml", "predrnet_cpu.yaml", "slurm_example.yaml"])
def test_shipped_configs_are_valid_train_configs(name, monkeypatch):
    """Every run of the shipped batches (all grids) is a valid TrainConfig and a known 03_train parameter."""
    import papermill

    from rpm_lib.training import TrainConfig

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    cfg = batch.load_batch_config(root / "configs" / name)
    known = set(papermill.inspect_notebook(str(cfg.template)))
    specs = batch.expand_grid(cfg, grids=[g.name for g in cfg.grids])
    for spec in specs:
        assert set(spec.parameters) <= known, f"{name} {spec.name}: unknown parameters"
        config = TrainConfig.from_dict({**spec.parameters, "run_dir": "runs/x"}, source=f"{name} {spec.name}")
        assert config.progress_bar is False and config.resume is True
    if name == "table1.yaml":
        main = [s for s in specs if s.grid == "main"]
        assert len(main) == 5 * 5 * 4
        assert {s.parameters["setup"] for s in main} == {"ce", "ce_aux_dense", "ce_aux_sparse", "mlcl", "mlcl_aug"}
        assert {s.parameters["encoder"] for s in main} == {"scl", "hrinet", "copinet", "wren", "predrnet"}
        assert {s.parameters["batch_size"] for s in main} == {128} and {s.parameters["lr"] for s in main} == {0.002}
        assert {s.grid for s in specs} == {"main", "ablation_beta", "ablation_batch_size"}


def test_execution_timeout_is_opt_in_and_a_timed_out_run_fails_without_a_retry(tmp_path, fake_templates):
    """No per-cell limit by default; a YAML `execution_timeout` makes a longer cell a failed run, executed once."""
    body = (
        "import pathlib, time\n"
        "marker = pathlib.Path(run_dir, 'attempts.txt')\n"
        "attempts = int(marker.read_text()) + 1 if marker.exists() else 1\n"
        "marker.write_text(str(attempts))\n"
        "time.sleep(sleep)\n"
        "pathlib.Path(run_dir, 'metrics.json').write_text('{}')\n"
    )
    slow = _notebook(tmp_path / "slow.ipynb", 'run_dir: str = ""\noutput_dir: str = ""\nsleep: int = 0\n', body)
    default = batch.load_batch_config(_write_config(tmp_path / "a.yaml", f"template: {slow}\nout: {tmp_path / 'a'}\n"
                                                    "axes: {sleep: [4]}\n"))
    assert default.execution_timeout is None
    limited = batch.load_batch_config(_write_config(tmp_path / "b.yaml", f"template: {slow}\nout: {tmp_path / 'b'}\n"
                                                    "execution_timeout: 2\naxes: {sleep: [30]}\n"))
    done = batch.run_one(batch.expand_grid(default)[0], default, tmp_path / "a")
    failed = batch.run_one(batch.expand_grid(limited)[0], limited, tmp_path / "b")
    assert done.status == "done"
    assert failed.status == "failed" and "Timeout" in failed.error
    assert (failed.run_dir / "attempts.txt").read_text() == "1"


@pytest.mark.parametrize("argv, message", [
    (["configs/demo.yaml", "--jobs", "0"], "--jobs must be >= 1, got 0"),
    (["--gather", "no/such/batch"], "--gather: batch folder no/such/batch does not exist"),
    (["configs/demo.yaml", "--cuda-devices", ",,"], "--cuda-devices: an empty GPU id in ',,' (e.g. 0,1,2,3)"),
    (["configs/demo.yaml", "--cuda-devices", "0,x"], "--cuda-devices: 'x' is neither a GPU index (0, 1, ...) nor a "
                                                      "GPU-/MIG- UUID (nvidia-smi -L lists both)"),
    (["configs/demo.yaml", "--time-budget", "-5"],
     "--time-budget must be a positive, finite number of seconds, got -5 (see rpm-batch --help)"),
])
def test_hostile_cli_arguments_get_one_line_and_exit_2(argv, message, capsys):
    from rpm_lib.batch import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "Traceback" not in err


def test_a_misspelled_parameter_is_refused_before_anything_runs(tmp_path):
    template = Path(__file__).resolve().parents[1] / "notebooks" / "03_train.ipynb"
    config = tmp_path / "typo.yaml"
    config.write_text(json.dumps({"name": "typo", "template": str(template), "out": str(tmp_path / "out"),
                                  "fixed": {"batchsize": 4}, "grids": [{"name": "main", "axes": {"seed": [0]}}]}))
    with pytest.raises(batch.BatchConfigError, match=r"typo.yaml: grid main: 'batchsize' is not a parameter of .*"
                                                     r"03_train.ipynb \(did you mean 'batch_size'\?\)"):
        batch.run_batch(config, dry_run=True, quiet=True)
    assert not (tmp_path / "out").exists()


def test_a_parameter_of_the_wrong_type_is_refused_before_anything_runs(tmp_path, capsys):
    # Regression: `--set max_epochs=abc` planned fine and failed every run after its kernel started.
    template = Path(__file__).resolve().parents[1] / "notebooks" / "03_train.ipynb"
    config = tmp_path / "types.yaml"
    config.write_text(json.dumps({"name": "types", "template": str(template), "out": str(tmp_path / "out"),
                                  "fixed": {"batch_size": 4}, "grids": [{"name": "main", "axes": {"seed": [0]}}]}))
    for override, expected in ((["--set", "max_epochs=abc"], "parameter 'max_epochs': expected int, got 'abc'"),
                               (["--set", "configurations=3"], "parameter 'configurations': expected "
                                                               "Optional[list[str]], got 3")):
        assert batch.main([str(config), "--dry-run", *override]) == 2
        err = capsys.readouterr().err
        assert f"types.yaml: grid main, run seed-0: {expected}" in err and err.count("\n") == 1, err
    assert batch.main([str(config), "--dry-run", "--set", "max_epochs=7", "--set", "lr=1e-3"]) == 0
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["int", "Optional[list[str]]", "Union[int, float]", "int | None",
                                  "Union[int, str, list[int]]", "dict", "Optional[float]"])
def test_annotations_read_back_from_papermill_text_are_the_types(text):
    from typing import Optional, Union  # noqa: F401 - named by the texts

    from rpm_lib.typed_values import annotation_from_text

    assert annotation_from_text(text) == eval(text)  # noqa: S307 - the test's own constants


def test_an_annotation_text_that_is_not_a_plain_type_is_left_unchecked():
    from rpm_lib.typed_values import annotation_from_text

    for text in ("", "np.ndarray", "__import__('os').system('x')", "list[", "Callable[[int], int]"):
        assert annotation_from_text(text) is None


def test_a_batch_yaml_without_a_default_grid_or_with_broken_yaml_is_one_line(tmp_path, fake_templates, capsys):
    train, _ = fake_templates
    nothing = _write_config(tmp_path / "nothing.yaml", f"template: {train}\ngrids:\n"
                                                       "  - {name: a, default: false, axes: {seed: [0]}}\n")
    with pytest.raises(batch.BatchConfigError, match="nothing.yaml: no grid has 'default: true'; name one with "
                                                     "--grid \\(a\\)"):
        batch.expand_grid(batch.load_batch_config(nothing))
    broken = _write_config(tmp_path / "broken.yaml", "template: [unclosed\n")
    twice = _write_config(tmp_path / "twice.yaml", f"template: {train}\naxes: {{seed: [0]}}\naxes: {{seed: [1]}}\n")
    for path, expected in ((broken, "not valid YAML"), (twice, "key 'axes' appears twice (line 3)")):
        assert batch.main([str(path), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err


def test_a_time_budget_that_never_ends_is_refused(tmp_path, fake_templates):
    train, _ = fake_templates
    config = _write_config(tmp_path / "b.yaml", f"template: {train}\naxes: {{seed: [0]}}\n")
    with pytest.raises(batch.BatchConfigError, match="--time-budget must be a positive, finite number of seconds, "
                                                     "got inf"):
        batch.run_batch(config, time_budget=float("inf"), dry_run=True, quiet=True)


OVERRUN_BODY = """
import json, pathlib, time
run = pathlib.Path(run_dir)
request = run / "stop.request"

def wait_for_request(seconds):
    waited = time.monotonic()
    while not request.exists() and time.monotonic() - waited < seconds:
        time.sleep(0.05)
    return request.exists()

if overrun:
    # as a run whose unpredicted work goes past the batch's end: it looks only for a stop request; the second
    # wait shows that the request is written again after the run removed it (train removes a stale one at start)
    first = wait_for_request(120)
    seen_at = time.time()
    request.unlink(missing_ok=True)
    second = wait_for_request(10)
    run.joinpath("progress.json").write_text(json.dumps({"status": "unfinished", "requests": [first, second],
                                                         "seen_at": seen_at}))
else:
    run.joinpath("metrics.json").write_text(json.dumps({"test_accuracy": 0.5}))
"""


def test_a_run_going_on_past_the_batch_time_budget_is_asked_to_stop_and_one_that_ends_in_time_is_not(tmp_path):
    template = _notebook(tmp_path / "train.ipynb", 'run_dir: str = ""\noutput_dir: str = ""\ntime_budget: float = 0.0\n'
                         'resume: bool = False\noverrun: bool = False\n', OVERRUN_BODY)
    out = tmp_path / "out"
    config = _write_config(tmp_path / "b.yaml", f"template: {template}\nout: {out}\n"
                                                "axes: {overrun: {late: {overrun: true}, in-time: {overrun: false}}}\n")
    budget = 15.0
    began = time.time()
    results = {r.spec.labels["overrun"]: r for r in batch.run_batch(config, jobs=2, quiet=True, time_budget=budget)}
    late, in_time = results["late"], results["in-time"]
    assert (late.status, in_time.status) == ("unfinished", "done")
    record = json.loads((late.run_dir / "progress.json").read_text())
    assert record["requests"] == [True, True]
    # never before the budget's end; soon after it (a tenth of the budget, 1.5 s, then the next poll)
    assert began + budget <= record["seen_at"] <= began + budget + 1.5 + 5.0, record["seen_at"] - began
    # asked BACKSTOP_S (at most a tenth of the budget) after the budget's end; the note says so
    assert re.fullmatch(r"asked to stop \d+ s after the batch's time budget had ended \(work the run could not "
                        r"predict ran over\)", late.error), late.error
    assert in_time.error is None
    for result in (late, in_time):  # no request outlives its run: the next call's run would stop at once
        assert not (result.run_dir / "stop.request").exists()


# ----------------------------------------------------------------------------------------------
# Train regime x test regime
# ----------------------------------------------------------------------------------------------
def test_a_grid_varies_the_training_folder_and_its_test_folders_with_readable_names(tmp_path):
    """Labelled axis values set a path and a list of paths together; the label, not the path, names the run."""
    template = _notebook(tmp_path / "t.ipynb", 'run_dir: str = ""\noutput_dir: str = ""\ndata_root: str = ""\n'
                         "test_data_roots: list = None\nsetup: str = 'ce'\n", "pass\n")
    cfg = batch.load_batch_config(_write_config(tmp_path / "b.yaml", f"""
template: {template}
out: {tmp_path / 'out'}
axes:
  train:
    A/Color: {{data_root: data/A-Color, test_data_roots: [data/A-Size, data/A-Type]}}
    I-RAVEN: {{data_root: data/iraven, test_data_roots: null}}
  test:
    own: {{}}
    A/Size: {{test_data_roots: [data/A-Size]}}
  setup: [ce]
"""))
    specs = batch.expand_grid(cfg)
    check_parameters(cfg, specs)
    assert [s.name for s in specs] == ["train-A_Color__test-own__setup-ce", "train-A_Color__test-A_Size__setup-ce",
                                       "train-I_RAVEN__test-own__setup-ce",
                                       "train-I_RAVEN__test-A_Size__setup-ce"]
    assert specs[0].labels == {"train": "A/Color", "test": "own", "setup": "ce"}
    assert specs[0].parameters == {"data_root": "data/A-Color", "test_data_roots": ["data/A-Size", "data/A-Type"],
                                   "setup": "ce"}
    assert specs[1].parameters["test_data_roots"] == ["data/A-Size"]  # a later axis wins
    assert specs[2].parameters["test_data_roots"] is None


def _regime_specs(name, monkeypatch):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    cfg = batch.load_batch_config(root / "configs" / name)
    return cfg, batch.expand_grid(cfg)


@pytest.mark.parametrize("name", ["regimes.yaml", "regimes_cpu.yaml"])
def test_regime_batches_expand_to_the_train_regime_grid_and_pass_the_checks(name, monkeypatch, capsys):
    from rpm_lib.generator.regimes import PRIMARY_REGIMES
    from rpm_lib.training import TrainConfig

    cfg, specs = _regime_specs(name, monkeypatch)
    check_parameters(cfg, specs)
    assert len(specs) == len(PRIMARY_REGIMES) * 2
    assert {s.labels["train"] for s in specs} == set(PRIMARY_REGIMES)
    assert {s.parameters["setup"] for s in specs} == {"ce_aux_sparse", "mlcl_aug"}
    assert "train-A_Color__setup-CE_AUX_sparse" in {s.name for s in specs}
    roots = {s.labels["train"]: s.parameters["data_root"] for s in specs}
    assert len(set(roots.values())) == len(PRIMARY_REGIMES)
    for spec in specs:
        config = TrainConfig.from_dict({**spec.parameters, "run_dir": "runs/x"}, source=f"{name} {spec.name}")
        assert config.encoder == "scl" and config.progress_bar is False and config.resume is True
        # Tested on every other primary regime's test split, never on its own folder twice.
        assert sorted(config.test_data_roots) == sorted(r for t, r in roots.items() if t != spec.labels["train"])
    # Every folder a run reads is made by a prepare step (regime named), and its cache by the next step.
    prepare = [" ".join(step.command) for step in cfg.prepare]
    for regime, root in roots.items():
        assert any(f"--regime {regime} " in cmd and f"--out {root.rsplit('-', 1)[0]} " in cmd for cmd in prepare)
        assert any(cmd.startswith("rpm-data prepare") and f"--out {root} " in cmd for cmd in prepare)
    sizes = {s.parameters["image_size"] for s in specs}
    if name == "regimes.yaml":
        assert sizes == {80} and all("--num-per-config 10000" in c for c in prepare if "rpm-generate" in c)
        assert {s.parameters["max_epochs"] for s in specs} == {100}
    else:
        assert max(sizes) <= 48 and all(s.parameters["accelerator"] == "cpu" for s in specs)
    # The batch's own check mode: a dry run plans every run and writes nothing.
    assert batch.main([str(cfg.path), "--dry-run", "--out", "/nonexistent/regimes-dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("[planned]") == len(specs) and not Path("/nonexistent").exists()


def test_gathering_writes_one_line_per_run_and_test_set(tmp_path):
    import csv

    from rpm_lib import results

    run = tmp_path / "out" / "main" / "train-A_Color"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"name": run.name, "grid": "main", "labels": {"train": "A/Color"},
                                              "parameters": {}}))
    per_config = {c: 0.5 for c in CONFIGURATIONS}
    sets = [{"name": "test", "split": "test", "regime": "A/Color", "distribution": "out-of-distribution",
             "accuracy": 0.5, "accuracy_per_configuration": per_config, "num_samples": 8},
            {"name": "val", "split": "val", "regime": "A/Color", "distribution": "in-distribution",
             "accuracy": 0.75, "accuracy_per_configuration": {**per_config, CONFIGURATIONS[0]: 1.0}, "num_samples": 8},
            {"name": "A-Size", "split": "test", "regime": "A/Size", "distribution": "out-of-distribution",
             "accuracy": 0.25, "accuracy_per_configuration": per_config, "num_samples": 4}]
    (run / "metrics.json").write_text(json.dumps({"test_accuracy": 0.5, "test_accuracy_per_configuration": per_config,
                                                  "test_sets": sets}))
    paths = batch.gather_results(tmp_path / "out")
    rows = list(csv.DictReader(paths["test_sets_csv"].open()))
    assert [(r["train"], r["set"], r["regime"], r["distribution"]) for r in rows] == [
        ("A/Color", "test", "A/Color", "out-of-distribution"), ("A/Color", "val", "A/Color", "in-distribution"),
        ("A/Color", "A-Size", "A/Size", "out-of-distribution")]
    assert [float(r["accuracy"]) for r in rows] == [50.0, 75.0, 25.0]
    assert float(rows[1]["Average"]) == pytest.approx(100 * (1.0 + 6 * 0.5) / 7) and float(rows[1]["Center"]) == 100
    # Table 1 sets no I-RAVEN paper numbers beside a run trained on another regime.
    (row,) = results.table1(results.load_runs(tmp_path / "out"))
    assert row.paper is None and row.group == {"train": "A/Color"}
    # Runs without test sets (older runs) give no file.
    (run / "metrics.json").write_text(json.dumps({"test_accuracy": 0.5}))
    assert "test_sets_csv" not in results.write_tables(results.load_runs(tmp_path / "out"), tmp_path / "t2")


def test_prepare_steps_sharing_creates_run_and_skip_together(tmp_path, fake_templates):
    """Generate then cache: both steps name the cache; only the last of them has to make it."""
    train, _ = fake_templates
    raw, cache = tmp_path / "raw.txt", tmp_path / "cache.txt"

    def step(path: Path) -> str:
        return f"""  - creates: {cache}
    run: [{sys.executable}, -c, "import pathlib; pathlib.Path(r'{path}').write_text('x')"]
"""

    cfg = batch.load_batch_config(_write_config(tmp_path / "b.yaml", f"template: {train}\naxes: {{seed: [0]}}\n"
                                                "prepare:\n" + step(raw) + step(cache)))
    lines: list[str] = []
    run_prepare(cfg, False, lines.append)
    assert raw.is_file() and cache.is_file()
    raw.unlink()
    run_prepare(cfg, False, lines.append)
    assert not raw.exists() and sum("exists, skipping" in line for line in lines) == 2
    cache.unlink()
    broken = batch.load_batch_config(_write_config(tmp_path / "c.yaml", f"template: {train}\naxes: {{seed: [0]}}\n"
                                                   "prepare:\n" + step(raw) + step(raw)))
    with pytest.raises(RuntimeError, match=f"prepare command did not create {cache}"):
        run_prepare(broken, False, lines.append)


def test_prepare_only_makes_the_data_and_runs_nothing(tmp_path, fake_templates, monkeypatch, capsys):
    train, _ = fake_templates
    made = tmp_path / "data.txt"
    config = _write_config(tmp_path / "b.yaml", f"""
template: {train}
out: {tmp_path / "out"}
prepare:
  - creates: {made}
    run: [{sys.executable}, -c, "import pathlib; pathlib.Path(r'{made}').write_text('x')"]
axes: {{seed: [0]}}
""")
    monkeypatch.chdir(tmp_path)
    assert batch.main([str(config), "--prepare-only", "--dry-run"]) == 0 and not made.exists()
    assert batch.main([str(config), "--prepare-only"]) == 0
    assert made.read_text() == "x" and not (tmp_path / "out").exists()  # no run folder, no tables
    assert batch.main([str(config), "--prepare-only"]) == 0
    assert "exists, skipping" in capsys.readouterr().out
    failing = _write_config(tmp_path / "f.yaml", f"template: {train}\naxes: {{seed: [0]}}\nprepare:\n"
                                                 f"  - run: [{sys.executable}, -c, 'raise SystemExit(3)']\n")
    assert batch.main([str(failing), "--prepare-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "prepare command failed (exit 3)" in err, err
    bare = _write_config(tmp_path / "n.yaml", f"template: {train}\naxes: {{seed: [0]}}\n")
    assert batch.main([str(bare), "--prepare-only"]) == 0
    assert "has no prepare steps; nothing to do" in capsys.readouterr().out


def test_auto_loader_workers_share_the_cores_among_the_runs_left_to_train(tmp_path, monkeypatch):
    # the Table 1 campaign resumed with two of its three runs at once left: each gets 7 workers of 16 cores, not 4
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # the YAML names its template relative to the repository
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    out = tmp_path / "runs"

    def planned_workers() -> list[int]:
        results = batch.run_batch(repo / "configs" / "table1_scl_tiny.yaml", out=out, dry_run=True, quiet=True,
                                  prepare=False, jobs=3, workers_per_run="auto")
        return [r.spec.parameters["num_workers"] for r in results if r.status == "planned"]

    assert planned_workers() == [4] * 5  # 16 // 3 - 1
    for name in ("setup-ce__seed-0", "setup-ce_aux_dense__seed-0", "setup-ce_aux_sparse__seed-0"):
        (out / "main" / name).mkdir(parents=True)
        (out / "main" / name / METRICS).write_text("{}")
    assert planned_workers() == [7, 7]  # 16 // 2 - 1


CHATTY_TRAIN_BODY = """
import json, os, pathlib
os.write(2, f"kernel chatter of seed {seed}\\n".encode())  # as a C library or ipykernel's own log would
if fail:
    raise RuntimeError(f"deliberate failure for seed {seed}")
pathlib.Path(run_dir, "metrics.json").write_text(json.dumps({"test_accuracy": 0.5}))
"""


def test_what_kernels_write_to_their_standard_error_stays_with_their_run(tmp_path):
    # Several kernels at once used to interleave their chatter in the batch's terminal, among it ipykernel's
    # "KeyboardInterrupt caught in kernel." when jupyter_client interrupts a kernel on its way to shutting it down
    train = _notebook(tmp_path / "train.ipynb", 'run_dir: str = ""\noutput_dir: str = ""\nseed: int = 0\n'
                                                "fail: bool = False\n", CHATTY_TRAIN_BODY)
    config = _write_config(tmp_path / "b.yaml", f"""
template: {train}
out: {tmp_path / "out"}
axes:
  seed:
    "0": {{seed: 0}}
    "1": {{seed: 1, fail: true}}
""")
    import subprocess

    done = subprocess.run([sys.executable, "-m", "rpm_lib.batch", str(config), "--jobs", "2"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr  # one run failed
    assert "kernel chatter" not in done.stdout + done.stderr
    ok, bad = tmp_path / "out" / "main" / "seed-0", tmp_path / "out" / "main" / "seed-1"
    assert "kernel chatter of seed 0" in kernel_log_of(ok / "train.ipynb").read_text()
    error = (bad / "error.txt").read_text()
    assert "deliberate failure for seed 1" in error
    assert "the kernel's standard error" in error and "kernel chatter of seed 1" in error
    assert error.rstrip().splitlines()[-1] == "RuntimeError: deliberate failure for seed 1"  # quoted by the tables
    # the batch's line for the failed run still ends with the error itself
    assert re.search(r"failed +main/seed-1 \(.*\): RuntimeError: deliberate failure for seed 1", done.stdout)


def _one_run_batch(tmp_path: Path, body: str, out: Path) -> Path:
    """A batch YAML of one run (``main/seed-0``) whose training notebook runs ``body`` into ``out``."""
    train = _notebook(tmp_path / "train.ipynb", 'run_dir: str = ""\noutput_dir: str = ""\n', body)
    return _write_config(tmp_path / "b.yaml", f"template: {train}\nout: {out}\naxes:\n  seed:\n    \"0\": {{}}\n")


FILLING_TRAIN_BODY = """
import pathlib
pathlib.Path(run_dir, "history.csv").write_text("epoch\\n")
with open(pathlib.Path(run_dir, "fill.bin"), "wb") as handle:  # until the disk is full
    handle.write(b"0" * (8 << 20))
"""


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 4 MB tmpfs at ``tmp_path/small`` (mounting needs root: CI runs as root)."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("a full disk is made with a small tmpfs, which only root may mount (CI runs as root)")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"this machine refuses to mount a tmpfs ({done.stderr.strip()}); a container without "
                    "CAP_SYS_ADMIN")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_leaves_its_reason_in_error_txt_and_no_temporary_files(tmp_path, small_disk):
    # with the disk full, error.txt, the executed notebook and the task's log were all empty: nothing said why
    config = _one_run_batch(tmp_path, FILLING_TRAIN_BODY, small_disk / "out")
    results = batch.run_batch(config, quiet=True)
    assert [r.status for r in results] == ["failed"]
    run_dir = small_disk / "out" / "main" / "seed-0"
    error = (run_dir / "error.txt").read_text()
    assert error.rstrip().splitlines()[-1].startswith("OSError: [Errno 28] No space left on device"), error[-500:]
    assert results[0].error.rstrip().splitlines()[-1].startswith("OSError: [Errno 28] No space left on device")
    left = [p.name for p in small_disk.rglob("*") if ".tmp" in p.name or p.name.endswith((".reserve", ".partial"))]
    assert left == [], left


KILLED_TRAIN_BODY = """
import os, pathlib, signal
pathlib.Path(run_dir, "history.csv").write_text("epoch\\n")
os.kill(os.getpid(), signal.SIGKILL)  # the out-of-memory killer, kill -9
"""


def test_a_killed_kernel_leaves_its_executed_notebook(tmp_path):
    config = _one_run_batch(tmp_path, KILLED_TRAIN_BODY, tmp_path / "out")
    assert [r.status for r in batch.run_batch(config, quiet=True)] == ["failed"]
    run_dir = tmp_path / "out" / "main" / "seed-0"
    executed = nbformat.read(run_dir / "train.ipynb", as_version=4)  # was missing: nothing showed how far it got
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    assert "DeadKernelError" in (run_dir / "error.txt").read_text()
