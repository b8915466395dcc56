"""rpm-batch: config parsing, grid expansion, resumable execution with failures, results files.

Executions use a tiny stand-in notebook (no torch) so the runner itself is tested in a few seconds;
the real ``03_train`` template is exercised by ``tests/test_notebooks.py``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

from rpm_lib import batch
from rpm_lib.rules import CONFIGURATIONS

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
    assert batch.slug("MLCL+AUG") == "MLCL_AUG"
    assert batch.slug("0.5") == "0.5"
    assert batch.run_name({"encoder": "scl", "beta": "0.1"}) == "encoder-scl__beta-0.1"
    with pytest.raises(ValueError, match="no letters"):
        batch.slug("+++")


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


@pytest.mark.parametrize("name", ["demo.yaml", "table1.yaml"])
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
        assert len(main) == 4 * 5 * 4
        assert {s.parameters["setup"] for s in main} == {"ce", "ce_aux_dense", "ce_aux_sparse", "mlcl", "mlcl_aug"}
        assert {s.parameters["encoder"] for s in main} == {"scl", "hrinet", "copinet", "wren"}
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
