"""Notebooks: nbval regression notebooks (tests/notebooks) and every template in notebooks/ under papermill.

* ``test_regression_notebooks_match_stored_outputs`` runs ``pytest --nbval`` on ``tests/notebooks`` in a
  subprocess (the only place they run: ``pytest tests`` does not collect .ipynb files without ``--nbval``,
  and ``notebooks`` is in ``norecursedirs``), sanitised with ``tests/notebooks/sanitize.cfg``.
* ``test_template_runs_headless`` executes each template with tiny parameters (``interactive=False``) into
  ``tmp_path`` and checks what it wrote. ``03_train`` is executed by a 2-run ``rpm-batch`` (which also checks
  the runner with the real template); 04 / 05 / 06 read that batch; 09 reads a tiny model added to a registry of
  its own.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml

from rpm_lib import batch
from rpm_lib.notebook_execution import execute_notebook

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "notebooks"
REGRESSION = REPO / "tests" / "notebooks"

#: Tiny training (a few seconds on one core): used by the batch that runs 03_train.
TINY_TRAIN: dict[str, Any] = {
    "encoder": "scl", "setup": "mlcl", "image_size": 32, "batch_size": 4, "max_epochs": 1,
    "limit_train_batches": 2, "limit_val_batches": 1, "configurations": ["Center", "2x2Grid", "L-R"],
    "progress_bar": False, "accelerator": "cpu", "num_workers": 0,
}


def _outputs_with_errors(nb: nbformat.NotebookNode) -> list[str]:
    return [f"{o.ename}: {o.evalue}" for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]


def _stream_text(nb: nbformat.NotebookNode) -> str:
    return "".join(o.text for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream")


def _execute(template: str, out_dir: Path, **parameters: Any) -> nbformat.NotebookNode:
    out = out_dir / template
    execute_notebook(TEMPLATES / template, out, {"output_dir": str(out_dir / "figures"), **parameters},
                     cwd=REPO, execution_timeout=300)
    nb = nbformat.read(out, as_version=4)
    assert not _outputs_with_errors(nb)
    assert nb.metadata.papermill.exception is not True
    return nb


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory) -> Path:
    """10 generated problems per configuration (6 train / 2 val / 2 test each)."""
    from rpm_lib.generator.writer import write_dataset

    root = tmp_path_factory.mktemp("data") / "iraven"
    write_dataset(root, "all", count=10, seed=0, write_xml=False, progress=False)
    return root


@pytest.fixture(scope="module")
def tiny_batch(tmp_path_factory, sample_data) -> Path:
    """``rpm-batch`` of 03_train over two seeds (run in parallel), plus two fake ablation copies for 06."""
    work = tmp_path_factory.mktemp("batch")
    config = work / "tiny.yaml"
    fixed = {**TINY_TRAIN, "data_root": str(sample_data)}
    config.write_text(
        f"template: {TEMPLATES / '03_train.ipynb'}\nout: {work / 'out'}\n"
        f"fixed: {json.dumps(fixed)}\n"
        "axes: {encoder: [scl], setup: [mlcl], seed: [0, 1]}\n"
    )
    results = batch.run_batch(config, jobs=2, quiet=True)
    failed = [r.error for r in results if r.status != "done"]
    assert not failed, failed
    # An ablation grid for 06's plots: the same runs relabelled with a beta value (no extra training).
    for seed, beta in ((0, 0.0), (1, 10.0)):
        src = work / "out" / "main" / f"encoder-scl__setup-mlcl__seed-{seed}"
        dst = work / "out" / "ablation_beta" / f"encoder-scl__setup-mlcl__beta-{beta}__seed-0"
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("checkpoints", "*.ipynb"))
        info = json.loads((dst / "run.json").read_text())
        info.update(grid="ablation_beta", name=dst.name,
                    labels={"encoder": "scl", "setup": "mlcl", "beta": str(beta), "seed": "0"},
                    parameters={**info["parameters"], "beta": beta, "seed": 0})
        (dst / "run.json").write_text(json.dumps(info))
        # its records say the same (else the gather names the copy as contradicting its run.json)
        metrics = json.loads((dst / "metrics.json").read_text())
        metrics["config"].update(beta=beta, seed=0)
        metrics.update({"seed": 0} if "seed" in metrics else {})
        (dst / "metrics.json").write_text(json.dumps(metrics))
        recorded = yaml.safe_load((dst / "config.yaml").read_text())
        (dst / "config.yaml").write_text(yaml.safe_dump({**recorded, "beta": beta, "seed": 0}))
    return work / "out"


def test_regression_notebooks_match_stored_outputs():
    notebooks = sorted(REGRESSION.glob("*.ipynb"))
    assert len(notebooks) >= 3
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", str(REGRESSION / "sanitize.cfg"), "-p", "no:cacheprovider", "-q",
         *map(str, notebooks)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"},
    )
    assert result.returncode == 0, (
        "nbval regression notebooks differ from their stored outputs (regenerate with "
        f"`python tools/regen_notebooks.py` if the change is intended):\n"
        f"{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    )
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_01_explore_dataset(tmp_path):
    nb = _execute("01_explore_dataset.ipynb", tmp_path, data_root="", sample_root=str(tmp_path / "sample"),
                  sample_per_config=10, split="test", interactive=False)
    assert "14 test problems, 7 configurations" in _stream_text(nb)
    figures = tmp_path / "figures"
    assert {"gallery.png", "rule_frequencies.png", "answer_positions.png", "summary.csv", "summary.md"} <= {
        p.name for p in figures.iterdir()}
    assert len((figures / "summary.csv").read_text().splitlines()) == 1 + 7
    assert (tmp_path / "sample" / "center_single").is_dir()  # generated offline, no data_root needed


def test_02_augmentations(tmp_path, sample_data):
    nb = _execute("02_augmentations.ipynb", tmp_path, data_root=str(sample_data), configuration="2x2Grid",
                  num_random=3, recipes=["official"], interactive=False)
    assert "distribute_four/RAVEN_0_train" in _stream_text(nb)
    names = {p.name for p in (tmp_path / "figures").iterdir()}
    assert {"original.png", "single_transforms.png", "recipe_official.png"} <= names
    # the widget cell did not run: no widget outputs in a headless run
    assert "application/vnd.jupyter.widget-view+json" not in json.dumps(nb.cells[-1].get("outputs", []))


def test_03_train_by_batch(tiny_batch):
    runs = sorted((tiny_batch / "main").iterdir())
    assert [r.name for r in runs] == ["encoder-scl__setup-mlcl__seed-0", "encoder-scl__setup-mlcl__seed-1"]
    for run in runs:
        nb = nbformat.read(run / "03_train.ipynb", as_version=4)
        assert not _outputs_with_errors(nb)
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["config"]["run_dir"] == str(run)  # the batch's run_dir reached TrainConfig
        assert metrics["config"]["image_size"] == 32
        assert [s["name"] for s in metrics["stages"]] == ["pretrain", "linear"]
        assert {"history.png", "accuracy.png", "accuracy.csv"} <= {p.name for p in (run / "03_train").iterdir()}
        tagged = [c for c in nb.cells if "metrics" in c.metadata.get("tags", [])]
        shown = tagged[0].outputs[0].data["application/json"]
        assert shown["test_accuracy"] == metrics["test_accuracy"]
    assert (tiny_batch / "table1.md").read_text().count("| SCL | MLCL |") == 1


def test_03_train_says_what_ended_an_unfinished_call(tmp_path, sample_data):
    # A budget too short for the first stage's first steps: the call ends before training, resumable.
    nb = _execute("03_train.ipynb", tmp_path, data_root=str(sample_data), run_dir=str(tmp_path / "run"),
                  time_budget=0.5, **TINY_TRAIN)
    text = _stream_text(nb)
    assert "unfinished: the time budget (0.5 s) ended the run in pretrain" in text, text[-2000:]
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["status"] == "unfinished"


def test_04_evaluate(tmp_path, tiny_batch):
    run = tiny_batch / "main" / "encoder-scl__setup-mlcl__seed-0"
    nb = _execute("04_evaluate.ipynb", tmp_path, run_dir=str(run), num_failures=2, interactive=False)
    text = _stream_text(nb)
    assert "scl · mlcl · seed 0: test accuracy" in text and "test problems answered wrongly" in text
    names = {p.name for p in (tmp_path / "figures").iterdir()}
    assert {"accuracy_per_configuration.png", "accuracy_per_configuration.csv", "confusion.png"} <= names
    rows = (tmp_path / "figures" / "accuracy_per_configuration.csv").read_text().splitlines()
    assert rows[1].startswith("Average,6,") and len(rows) == 1 + 1 + 3  # header, average, 3 configurations
    metrics = json.loads((run / "metrics.json").read_text())
    assert ("failures.png" in names) == (metrics["test_accuracy"] < 1.0)


def test_05_rule_predictions(tmp_path, tiny_batch):
    run = tiny_batch / "main" / "encoder-scl__setup-mlcl__seed-1"
    nb = _execute("05_rule_predictions.ipynb", tmp_path, run_dir=str(run), num_examples=2, interactive=False)
    text = _stream_text(nb)
    assert "6 test problems, sparse38 rules (38 slots)" in text
    assert text.count("(answer ") == 2 and "Constant on Number/Position" in text
    names = {p.name for p in (tmp_path / "figures").iterdir()}
    assert {"rule_heatmap.png", "per_rule_f1.png", "per_rule.csv"} <= names


def test_06_results_table(tmp_path, tiny_batch):
    # Ablations as text, as `papermill -p ablations "beta, batch_size"` passes them: read as a list, not letters.
    nb = _execute("06_results_table.ipynb", tmp_path, batch_dir=str(tiny_batch), ablations="beta, batch_size")
    text = _stream_text(nb)
    assert "4 runs: 4 finished, 0 failed, 0 pending" in text and "no finished runs vary batch_size" in text
    figures = tmp_path / "figures"
    names = {p.name for p in figures.iterdir()}
    assert {"table1.md", "table1.csv", "table1.png", "ablation_beta.png", "runs.csv", "training_curves.png"} <= names
    table = (figures / "table1.md").read_text()
    assert "| SCL | MLCL | – | 2 |" in table and "95.7 ± 0.5" in table  # ours (2 seeds) beside the paper


def test_07_reproduction_cpu(tmp_path):
    from test_claims import write_fake_reproduction_batch

    batch_dir = write_fake_reproduction_batch(tmp_path / "batch")
    nb = _execute("07_reproduction_cpu.ipynb", tmp_path, batch_dir=str(batch_dir))
    assert "18 finished runs of 18" in _stream_text(nb)
    figures = tmp_path / "figures"
    assert {"reproduction_cpu.png", "claims.md"} <= {p.name for p in figures.iterdir()}
    claims_table = (figures / "claims.md").read_text()
    assert "| the sparse rule encoding beats the dense one (CE+AUX-sparse > CE+AUX-dense) |" in claims_table
    assert "does not hold" in claims_table and "| holds |" in claims_table


def test_08_generalisation(tmp_path, tiny_batch):
    nb = _execute("08_generalisation.ipynb", tmp_path, regimes=["A/Position", "I-RAVEN-Mesh"],
                  batch_dir=str(tiny_batch), interactive=False)
    text = _stream_text(nb)
    assert "finished run(s) with test sets" in text
    names = {p.name for p in (tmp_path / "figures").iterdir()}
    assert {"examples_A-Position.png", "rule_mix_A-Position.png", "rule_mix_A-Position.csv",
            "examples_I-RAVEN-Mesh.png"} <= names
    assert "rule_mix_I-RAVEN-Mesh.png" not in names  # nothing held out: no rule mix to show
    # The A/Position caveat is in the notebook's own words, beside the regime.
    outputs = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "Test split out of distribution in: 2x2Grid, 3x3Grid, O-IG" in outputs


def tiny_pretrained_registry(root: Path) -> Path:
    """``root/zoo/models.json``: a registry of one model, ``tiny`` (SCL · CE+AUX-sparse, so with a rule head; 24 px,
    two training steps on 10 generated problems per configuration, a few seconds), added as ``rpm-pretrained add``
    adds a shipped one."""
    from rpm_lib.pretrained.cli import main
    from rpm_lib.training import TrainConfig, train

    config = TrainConfig(run_dir=str(root / "run"), data_root=str(root / "data"), generate=True,
                         generate_num_per_config=10, generate_seed=3, image_size=24, setup="ce_aux_sparse",
                         encoder="scl", batch_size=2, max_epochs=1, max_steps=2, progress_bar=False,
                         limit_val_batches=1, max_val_samples=2, max_test_samples=14, accelerator="cpu", num_workers=0)
    train(config)
    registry = root / "zoo" / "models.json"
    assert main(["--registry", str(registry), "add", str(root / "run"), "--name", "tiny", "--command", "pytest"]) == 0
    return registry


@pytest.fixture(scope="module")
def tiny_registry(tmp_path_factory) -> Path:
    return tiny_pretrained_registry(tmp_path_factory.mktemp("pretrained"))


def test_09_pretrained(tmp_path, tiny_registry):
    nb = _execute("09_pretrained.ipynb", tmp_path, model_name="tiny", registry=str(tiny_registry), num_per_config=10,
                  regimes=["I-RAVEN", "A/Color"], regime_num_per_config=10, problem_index=1, embedding_problems=40,
                  data_dir=str(tmp_path / "data"), interactive=False)
    text = _stream_text(nb)
    assert "tiny on 70 fresh I-RAVEN problems (seed 20261128; trained on seed 3)" in text
    assert "problem 2 of 14: " in text and "40 problems (all configurations), embeddings of " in text
    figures = tmp_path / "figures"
    assert {"model.md", "fresh_accuracy.png", "fresh_accuracy.csv", "regimes.md", "problem.png", "neighbours.csv",
            "embedding_tsne.png"} <= {p.name for p in figures.iterdir()}
    fresh = (figures / "fresh_accuracy.csv").read_text().splitlines()
    assert len(fresh) == 1 + 7 + 1 and fresh[-1].startswith("All,70,")
    regimes = (figures / "regimes.md").read_text()
    assert regimes.count("| A/Color |") == 2 and "out-of-distribution" in regimes and "in-distribution" in regimes
    outputs = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "| recorded test accuracy |" in outputs
    assert (tmp_path / "data" / "I-RAVEN" / "manifest.json").is_file()  # kept in data_dir


def test_every_template_has_a_test():
    tested = {"01_explore_dataset", "02_augmentations", "03_train", "04_evaluate", "05_rule_predictions",
              "06_results_table", "07_reproduction_cpu", "08_generalisation", "09_pretrained"}
    assert {p.stem for p in TEMPLATES.glob("*.ipynb")} == tested


def _run_folder(path: Path, metrics_text: str) -> Path:
    """A finished run folder (default config) whose metrics.json holds ``metrics_text``."""
    from rpm_lib.training import TrainConfig

    path.mkdir()
    TrainConfig().to_yaml(path / "config.yaml")
    (path / "metrics.json").write_text(metrics_text)
    return path


@pytest.mark.parametrize("metrics_text, shown", [
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested deeper than 200 levels"),  # found: RecursionError
    ('{"test_accuracy": "0.9"}', "field 'test_accuracy' must be int or float, got str '0.9'"),
    ('{"test_sets": {"A-Size": {}}}', "field 'test_sets' must be list, got dict"),
    # found: plotted as the text "0.9" repeated 100 times; then a KeyError for an unknown configuration
    ('{"test_accuracy_per_regime": {"neutral": "0.9"}}', "field 'test_accuracy_per_regime': entry 'neutral' must be"),
    ('{"test_num_samples_per_configuration": {"Centre": 2}}', "field 'test_num_samples_per_configuration': entry "
                                                              "'Centre' must be one of"),
])
def test_open_run_refuses_a_hostile_metrics_json_in_one_line(tmp_path, metrics_text, shown):
    from rpm_lib import notebook

    run = _run_folder(tmp_path / "run", metrics_text)
    with pytest.raises(ValueError) as caught:
        notebook.open_run(run)
    message = str(caught.value)
    assert message.startswith(f"{run / 'metrics.json'}: ") and shown in message and "\n" not in message, message


def test_open_run_reads_what_training_writes(tmp_path):
    from rpm_lib import notebook

    metrics = {"test_accuracy": 0.5, "test_num_samples": 4, "test_accuracy_per_configuration": {"center_single": 0.5},
               "test_accuracy_per_configuration_short": {"Center": 0.5}, "test_loss": float("nan"), "test_sets": []}
    run = notebook.open_run(_run_folder(tmp_path / "run", json.dumps(metrics)))
    assert run.metrics["test_accuracy_per_configuration"] == {"center_single": 0.5} and run.predictions is None
