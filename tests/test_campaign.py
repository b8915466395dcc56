"""The Table 1 campaign in slices (``tools/campaign/gpu_slice.sh``): its dry run on the CPU goes through every step a
GPU slice takes (prepare, time-boxed batch, pack, a fresh folder, unpack, resume, progress) and its GPU config is
the SCL row of the paper's grid."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _dry_campaign(work: Path, out: Path, timeout: float, **settings: str) -> tuple[int, str]:
    """``bash tools/campaign/gpu_slice.sh --cpu-dry-run`` in ``work`` with its state returned into ``out`` and the
    environment ``settings`` (``CAMPAIGN_BUDGETS``, ``PATH``, ...); its exit status and its stdout + stderr."""
    env = {**os.environ, "CAMPAIGN_WORK": str(work), "CAMPAIGN_OUT": str(out), **settings}
    done = subprocess.run(["bash", "tools/campaign/gpu_slice.sh", "--cpu-dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def test_the_campaign_dry_run_stops_unfinished_then_resumes_from_its_per_run_archives_to_the_end(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    # MPS is the campaign's default on a GPU: a control program that refused to start its daemon cost a whole slice
    # (rpm-batch stops with one line, status 2, before any run); now the time left goes to the runs without MPS.
    driver = tmp_path / "driver-bin"
    driver.mkdir()
    control = driver / "nvidia-cuda-mps-control"
    control.write_text("#!/bin/sh\necho 'An instance of this daemon is already running' >&2\nexit 1\n")
    control.chmod(0o755)
    # Three at a time, as a slice can be asked to (one at a time is the default).
    status, log = _dry_campaign(tmp_path / "work", out, 900, CAMPAIGN_JOBS="3", CAMPAIGN_CUDA_MPS="1",
                                PATH=f"{driver}{os.pathsep}{os.environ['PATH']}")
    assert status == 0, log[-3000:]
    assert "-d exited with status 1: An instance of this daemon is already running" in log, log[-3000:]
    assert "gpu_campaign: MPS did not work (above); the runs take turns on the GPU for the 400 s left" in log, log[-3000:]
    # Slice 0 stops each run at the step after its first checkpoint, whatever this machine's speed and load (a
    # wall-clock first slice once ended before any run's kernel had started); slice 1 resumes every run from its
    # archive alone (the run folders are removed) and finishes it.
    assert "gpu_campaign: slice 0 stops each run after its first checkpoint" in log, log[-3000:]
    assert "gpu_campaign: slice 0 ended with status 75" in log, log[-3000:]
    assert "gpu_campaign: slice 1 ended with status 0" in log, log[-3000:]
    assert "Traceback" not in log
    assert "runs/table1_scl_tiny from main__setup-ce__seed-0.tar.gz" in log, log[-3000:]  # restored from its own
    # The reports come back as one archive, each run's state as its own (a slice returns at most 8 files).
    assert sorted(p.name for p in out.iterdir()) == ["slice.tar.gz", "state"]
    archives = sorted(p.name for p in (out / "state").iterdir())
    assert archives == [f"main__setup-{setup}__seed-0.tar.gz"
                        for setup in ("ce", "ce_aux_dense", "ce_aux_sparse", "mlcl", "mlcl_aug")], archives
    from rpm_lib.runs import archive as run_archive

    for name in archives:
        manifest = run_archive.read_manifest(out / "state" / name)
        run = f"main/{name.removeprefix('main__').removesuffix('.tar.gz')}"
        assert [r["path"] for r in manifest["runs"]] == [run] and manifest["compact"] is True, manifest["runs"]
        # finished runs carry no checkpoints, but the weights their test scored (bfloat16, ~2 bytes a parameter)
        assert not any("/checkpoints/" in f for f in manifest["files"]), (name, sorted(manifest["files"]))
        weights = manifest["files"].get(f"{run}/final_weights.pt")
        assert weights is not None and weights["bytes"] < 2_500_000, (name, sorted(manifest["files"]))
    with tarfile.open(out / "slice.tar.gz") as tar:
        reports = {Path(m.name).name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert set(reports) == {"progress.md", "progress.json", "table1.md", "slice.json"}, set(reports)  # no GPU: no csv
    progress = reports["progress.md"]
    rows = [line for line in progress.splitlines() if line.startswith("| main/")]
    assert len(rows) == 5 and all("| finished |" in row for row in rows), progress
    # every run went on in slice 1 from the archive slice 0 packed
    assert all(row.split("|")[9].strip() == "2" for row in rows), progress
    assert "| SCL | MLCL+AUG |" in reports["table1.md"]
    info = json.loads(reports["slice.json"])
    assert info["exit_status"] == 0 and info["opencv"].count(".") == 2 and info["numpy"]  # the pixels' makers
    # where the slice's seconds went: in order, within the slice
    phases = info["phases_s"]
    assert list(phases) == ["environment", "unpacked", "batch_ended", "packed"], phases
    assert 0 <= phases["environment"] <= phases["unpacked"] <= phases["batch_ended"] <= phases["packed"] \
        <= info["seconds"], (phases, info["seconds"])
    # every run trained in slice 1 (a run slice 0 started resumed there): its training call's start-up is recorded
    standing = json.loads(reports["progress.json"])
    assert all(0 < run["first_step_s"] < info["seconds"] for run in standing), standing

    # Recording the slice here: each run's archive is stored, the slice appended, the document's tables rewritten.
    record = _campaign_record()
    results, doc = tmp_path / "results", tmp_path / "reproduction-gpu.md"
    doc.write_text((REPO / "docs" / "reproduction-gpu.md").read_text())
    record.RESULTS, record.DOC, record.SLICES = results, doc, results / "slices.jsonl"
    assert record.main([str(out)]) == 0
    for name in archives:  # the archives as they came back, every run being new here
        assert (results / "state" / name).read_bytes() == (out / "state" / name).read_bytes(), name
    assert not (results / "state.tar.gz").exists()
    entry = json.loads((results / "slices.jsonl").read_text().splitlines()[-1])
    assert entry["state_bytes_added"] == entry["state_bytes"] == sum((out / "state" / n).stat().st_size
                                                                    for n in archives)
    text = doc.read_text()
    assert "| 1 | " in text and "cpu (dry run)" in text and "mlcl_aug 3+3 ep" in text, text
    assert "5 of 5 runs finished" in text and "MLCL+AUG is the best setup" in text, text
    assert "After 1 slice (" in text and "| MLCL+AUG | finished | linear |" in text, text
    assert (results / "progress.md").read_text() == progress
    figure = (results / "progress.png").read_bytes()  # each run's validation accuracy, drawn from the state
    assert figure.startswith(b"\x89PNG") and len(figure) > 10_000

    # Slices 1-3 returned their reports as loose files, slices 1-6 the state as one archive of every run: recorded
    # the same way. The same state again adds nothing.
    loose = tmp_path / "loose"
    loose.mkdir()
    for name, text in reports.items():
        (loose / name).write_text(text)
    for name in archives:
        run_archive.unpack(out / "state" / name, tmp_path / "whole")
    run_archive.pack(tmp_path / "whole", loose / "state.tar.gz", compact=True)
    info = json.loads(reports["slice.json"])
    del info["started"]  # slices 1-3 did not record their start (and this one is recorded already)
    (loose / "slice.json").write_text(json.dumps(info))
    before = {name: (results / "state" / name).read_bytes() for name in archives}
    entry = record.record(loose)
    assert entry["slice"] == 2 and entry["exit_status"] == 0 and len(entry["runs"]) == 5
    assert entry["state_bytes_added"] == 0 and {n: (results / "state" / n).read_bytes() for n in archives} == before


def test_a_slice_whose_budget_ends_before_any_run_begins_is_not_a_failure(tmp_path: Path) -> None:
    # found on a loaded machine: start-up took the whole budget, and `rpm-batch pack` of no run folder failed the slice
    # CAMPAIGN_CUDA_MPS=1 on a machine without NVIDIA's MPS control program: a note, and the slice goes on without
    # (rpm-batch --cuda-mps would have refused, failing the slice)
    status, log = _dry_campaign(tmp_path / "work", tmp_path / "out", 300, CAMPAIGN_BUDGETS="1", CAMPAIGN_CUDA_MPS="1")
    assert status == 0, log[-3000:]
    # one run at a time by default: a slice's commit then adds at most one unfinished run's checkpoints
    assert "gpu_campaign: slice 0, time budget 1 s, 1 runs at a time" in log, log[-3000:]
    assert "campaign_record: no run has begun yet in runs/table1_scl_tiny; nothing to pack" in log, log[-3000:]
    if not _mps_control_here():
        assert "the runs take turns on the GPU: nvidia-cuda-mps-control is not on this machine" in log, log[-3000:]
    assert "gpu_campaign: slice 0 ended with status 75" in log and "Traceback" not in log, log[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["slice.tar.gz"]  # no state: the next slice starts


def test_a_slice_left_no_time_after_its_reserve_says_so_and_returns_the_state_as_it_came(tmp_path: Path) -> None:
    # a short second slice on a still-running machine: rpm-batch refused the budget (exit 2) and failed the slice
    work = tmp_path / "work"
    _stopped_run(work / "runs" / "table1_scl_tiny" / "main" / "a", epochs=1, steps=4)
    from rpm_lib.runs import archive as run_archive

    state = work / "results" / "table1_scl_gpu" / "state.tar.gz"
    run_archive.pack(work / "runs" / "table1_scl_tiny", state)
    status, log = _dry_campaign(work, tmp_path / "out", 300, CAMPAIGN_BUDGETS="0")
    assert status == 0 and "Traceback" not in log and "rpm-batch: error" not in log, log[-3000:]
    assert "gpu_campaign: slice 0: no time left for training" in log, log[-3000:]
    returned = tmp_path / "returned"
    assert sorted(p.name for p in (tmp_path / "out" / "state").iterdir()) == ["main__a.tar.gz"]
    run_archive.unpack(tmp_path / "out" / "state" / "main__a.tar.gz", returned)
    assert run_archive.run_reach(returned / "main" / "a").steps == 4


def _mps_control_here() -> bool:
    from rpm_lib.cuda_mps import MpsUnavailable, find_control

    try:
        find_control()
    except MpsUnavailable:
        return False
    return True


def _stopped_run(run_dir: Path, epochs: int, steps: int) -> None:
    """A run folder as a time budget leaves it in its first stage, ``epochs`` finished, ``steps`` trained."""
    import torch

    (run_dir / "checkpoints" / "supervised").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text("setup: ce\n")
    (run_dir / "history.csv").write_text("stage,epoch\n" + "".join(f"supervised,{e}\n" for e in range(epochs)))
    for name in ("last.ckpt", "best.ckpt"):
        torch.save({"state_dict": {"w": torch.full((4,), float(steps))}}, run_dir / "checkpoints" / "supervised" / name)
    (run_dir / "progress.json").write_text(json.dumps(
        {"status": "unfinished", "stages": {"supervised": {"completed": False, "global_step": steps}}}))


def test_a_second_slice_on_a_warm_machine_goes_on_from_the_runs_there_not_the_older_state_it_carries(
        tmp_path: Path) -> None:
    # A second slice on the same machine finds the first slice's runs there, while the state it carries is the one
    # committed before the first slice: unpacking it over them (--overwrite alone) threw the first slice's work away.
    work = tmp_path / "work"
    runs = work / "runs" / "table1_scl_tiny" / "main"
    _stopped_run(runs / "ahead", epochs=1, steps=4)
    _stopped_run(runs / "behind", epochs=1, steps=4)
    state = work / "results" / "table1_scl_gpu" / "state.tar.gz"
    from rpm_lib.runs import archive as run_archive

    run_archive.pack(work / "runs" / "table1_scl_tiny", state)
    _stopped_run(runs / "ahead", epochs=3, steps=12)  # the first call went on with this one
    (runs / "behind" / "history.csv").write_text("stage,epoch\n")  # and this one lost its epoch here
    status, log = _dry_campaign(work, tmp_path / "out", 300, CAMPAIGN_BUDGETS="1")
    assert status == 0 and "Traceback" not in log, log[-3000:]
    assert "note: runs/table1_scl_tiny/main/ahead: the run here had gone further (unfinished, 12 steps, 3 epochs) than the archive's " \
           "(unfinished, 4 steps, 1 epochs); kept (--keep-further)" in log, log[-3000:]
    returned = tmp_path / "returned"
    for name in ("main__ahead.tar.gz", "main__behind.tar.gz"):
        run_archive.unpack(tmp_path / "out" / "state" / name, returned)
    assert run_archive.run_reach(returned / "main" / "ahead").steps == 12
    assert run_archive.run_reach(returned / "main" / "behind").epochs == 1  # the archive's, restored


def _campaign_record():
    import importlib.util

    spec = importlib.util.spec_from_file_location("campaign_record", REPO / "tools" / "campaign" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fixed(name: str) -> dict:
    return yaml.safe_load((REPO / "configs" / name).read_text())["fixed"]


def test_the_gpu_campaign_trains_the_table1_grid_row_of_scl() -> None:
    campaign, grid = _fixed("table1_scl_gpu.yaml"), _fixed("table1.yaml")
    # Loader workers are the campaign's own choice (rpm-batch --workers-per-run); everything trained is the grid's.
    for key, value in grid.items():
        if key != "num_workers":
            assert campaign[key] == value, f"table1_scl_gpu.yaml {key}: {campaign[key]!r}, table1.yaml: {value!r}"
    assert campaign["encoder"] == "scl"
    grids = {grid["name"]: grid["axes"]
             for grid in yaml.safe_load((REPO / "configs" / "table1_scl_gpu.yaml").read_text())["grids"]}
    tiny = yaml.safe_load((REPO / "configs" / "table1_scl_tiny.yaml").read_text())["axes"]
    # the paper's row (its dry run is the tiny one), then CE and CE+AUX-dense again with seed 1, whose weights ship
    assert list(grids) == ["main", "seed1"]
    assert grids["main"] == tiny and tiny["setup"] == ["ce", "ce_aux_dense", "ce_aux_sparse", "mlcl", "mlcl_aug"]
    assert grids["seed1"] == {"setup": ["ce", "ce_aux_dense"], "seed": [1]}


def test_the_predrnet_gpu_runs_are_cells_of_the_table1_grid_s_predrnet_row() -> None:
    runs, grid = _fixed("table1_predrnet_gpu.yaml"), _fixed("table1.yaml")
    for key, value in grid.items():
        assert runs[key] == value, f"table1_predrnet_gpu.yaml {key}: {runs[key]!r}, table1.yaml: {value!r}"
    assert runs["encoder"] == "predrnet"
    table1_axes = yaml.safe_load((REPO / "configs" / "table1.yaml").read_text())["grids"][0]["axes"]
    (only,) = yaml.safe_load((REPO / "configs" / "table1_predrnet_gpu.yaml").read_text())["grids"]
    assert only["axes"] == {"setup": ["ce_aux_sparse", "mlcl_aug"], "seed": [0]}
    assert "predrnet" in table1_axes["encoder"]
    assert set(only["axes"]["setup"]) <= set(table1_axes["setup"]) and 0 in table1_axes["seed"]


# Fingerprint of the campaign's data recipe on a small scale (10 problems per configuration, the campaign's seed and
# mode, cached at 80 px), made by the generator and cache that produced the committed campaign state (slices 1-3
# wrote the problem files, then `rpm-data prepare`; later slices `rpm-generate --cache-size`, the same bytes). The
# runs in results/table1_scl_gpu resume only on data with the fingerprint they recorded: a change of the generator
# or of the cache's arrays that alters this value strands them. The pixels also depend on the OpenCV major version
# (rpm_lib.data.opencv_version): the GPU machines that ran slices 1-3 have OpenCV 5.0.0, requirements.txt installs
# 4.x. Both values were measured here, 5.0.0 from a wheel installed beside the project's environment; the full recipe
# gives sha256-pieces-v1:ef56c1ba... (the value the committed runs recorded) with OpenCV 5.0.0 and ...d0a28f22efe3
# with 4.14.0 (docs/reproduction-gpu.md).
CAMPAIGN_RECIPE_FINGERPRINTS = {
    "4": "sha256-pieces-v1:83c090036849f4aca3d43a5937d813b7b24bdd39b861693a71a8c6219bac5a0d",
    "5": "sha256-pieces-v1:5a1abc4b14451c33b2e029c9e53f874ca3fcbbfd9184d9753c6345b5cb29983d",
}
TWO_STEP_RECIPE = ([["rpm-generate", "--out", "data/i-raven", "--num-per-config", "10000", "--seed", "1234", "--mode",
                     "balanced", "--workers", "16", "--no-xml", "--quiet"],
                    ["rpm-data", "prepare", "data/i-raven", "--out", "data/i-raven-80", "--size", "80", "--workers",
                     "16", "--no-progress"]])


def _small(command: list[str], tmp_path: Path) -> list[str]:
    """A recipe command at 10 problems per configuration and 2 workers, its data/ paths under ``tmp_path``."""
    small = list(command)
    for option, value in (("--num-per-config", "10"), ("--workers", "2")):
        if option in small:
            small[small.index(option) + 1] = value
    return [str(tmp_path / arg) if arg.startswith("data/") else arg for arg in small]


@pytest.mark.parametrize("recipe", ["configs/table1_scl_gpu.yaml", "two-step (slices 1-3)"])
def test_the_campaign_data_recipe_still_makes_the_same_bytes(tmp_path: Path, recipe: str) -> None:
    from rpm_lib.data import opencv_version
    from rpm_lib.data.fingerprint import data_fingerprint

    config = yaml.safe_load((REPO / "configs" / "table1_scl_gpu.yaml").read_text())
    commands = TWO_STEP_RECIPE if recipe.startswith("two-step") else [step["run"] for step in config["prepare"]]
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"}
    for command in commands:
        command = _small([str(arg) for arg in command], tmp_path)
        module = {"rpm-generate": "rpm_lib.generator.cli", "rpm-data": "rpm_lib.data.cli"}[command[0]]
        done = subprocess.run([sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())",
                               *command[1:]], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    major = opencv_version.current().split(".")[0]
    assert major in CAMPAIGN_RECIPE_FINGERPRINTS, f"no recorded campaign fingerprint for OpenCV {major}.x"
    assert data_fingerprint(tmp_path / config["fixed"]["data_root"]) == CAMPAIGN_RECIPE_FINGERPRINTS[major], (
        "the generator or the cache now make other bytes for the campaign's recipe: the runs committed in "
        "results/table1_scl_gpu cannot resume (restart the campaign, or keep the old output)")


def test_a_slice_records_how_long_the_gpu_sat_idle_before_training(tmp_path: Path) -> None:
    record = _campaign_record()
    csv = tmp_path / "gpu_util.csv"
    csv.write_text("2026/11/27 01:33:22.662, 0 %, 0 MiB\n2026/11/27 01:33:27.667, 0 %, 0 MiB\n"
                   "2026/11/27 01:34:57.690, 0 %, 1329 MiB\nnot a sample\n2026/11/27 01:35:02.690, 94 %, 5849 MiB\n"
                   "2026/11/27 01:35:07.691, 0 %, 5855 MiB\n")
    assert record.idle_before_training(csv) == 100.0
    assert record.gpu_utilisation(csv) == 18.8  # short: every one of the 5 samples counts
    csv.write_text("2026/11/27 01:33:22.662, 0 %, 0 MiB\n")
    assert record.idle_before_training(csv) is None  # never busy: not a number
    assert record.idle_before_training(tmp_path / "absent.csv") is None
    entries = [{"slice": 1, "date": "d", "device": "cpu", "seconds": 10.0, "exit_status": 0, "state_bytes": 1e6,
                "runs": [], "idle_before_training_seconds": 41.6}, {"slice": 2, "date": "d", "device": "cpu",
                "seconds": 10.0, "exit_status": 0, "state_bytes": 1e6, "runs": []}]
    rows = record.slices_markdown(entries).splitlines()
    assert rows[0].split("|")[5].strip() == "idle at start s"  # idle: gpu_util.csv; the next column: phases_s
    assert rows[2].split("|")[5].strip() == "42" and rows[3].split("|")[5].strip() == ""


def test_recording_a_slice_says_what_the_next_slice_will_carry() -> None:
    record = _campaign_record()
    mib = 2**20
    assert record.carry_note(30 * mib, 25 * mib, 2 * mib) == (
        "campaign_record: the next slice carries ~57.0 MiB of 64 (state 30.0, .gpu 25.0, the rest 2.0)")
    warning = record.carry_note(38 * mib, 25 * mib, 2 * mib)
    assert warning.startswith("campaign_record: warning: the next slice carries ~65.0 MiB of 64") and "CAMPAIGN_JOBS" in warning


def test_a_slice_row_marks_a_run_that_went_on_with_other_pixels() -> None:
    record = _campaign_record()
    run = {"run": "main/setup-ce_aux_sparse__seed-0", "epochs": {"supervised": 12}, "best_val_accuracy": 0.81,
           "status": "unfinished"}
    assert record._run_cell(run, True) == "ce_aux_sparse 12 ep, val 81.0"
    assert record._run_cell({**run, "data_changes": 1}, True) == "ce_aux_sparse 12 ep, val 81.0, other pixels"


def test_a_slice_row_gives_the_seconds_after_the_batch_and_each_run_s_first_step_only_where_it_trained() -> None:
    record = _campaign_record()

    def run(name: str, slices: int, first: float | None) -> dict:
        return {"run": f"main/setup-{name}__seed-0", "epochs": {"supervised": 3}, "best_val_accuracy": None,
                "status": "unfinished", "slices": slices, "first_step_s": first}

    entries = [{"slice": 1, "date": "d", "device": "cpu", "seconds": 300.0, "exit_status": 75, "state_bytes": 1e6,
                "runs": [run("ce", 1, 31.4), run("mlcl", 1, 29.0)],
                "phases_s": {"environment": 7.1, "unpacked": 8.0, "batch_ended": 277.6, "packed": 281.0}},
               {"slice": 2, "date": "d", "device": "cpu", "seconds": 200.0, "exit_status": 75, "state_bytes": 1e6,
                "runs": [run("ce", 1, 31.4), run("mlcl", 2, 12.2)]}]
    rows = record.slices_markdown(entries).splitlines()
    assert rows[0].split("|")[6].strip() == "after the batch s"
    assert rows[2].split("|")[6].strip() == "22" and rows[3].split("|")[6].strip() == ""
    assert rows[2].split("|")[-2].strip() == "ce 3 ep, 1st step 31 s; mlcl 3 ep, 1st step 29 s"
    # in slice 2 only mlcl trained: ce's start-up is slice 1's and is not repeated
    assert rows[3].split("|")[-2].strip() == "ce 3 ep; mlcl 3 ep, 1st step 12 s"
    # from a slice that recorded its start and the runs' training calls: when each call began, and its process's age
    entries[1]["started"] = 1000
    entries[1]["runs"][1].update(called_at=1027.4, process_s=14.2)
    rows = record.slices_markdown(entries).splitlines()
    assert rows[3].split("|")[-2].strip() == "ce 3 ep; mlcl 3 ep, train() at 27 s (its process 14 s old), 1st step 12 s"


def test_the_standing_gives_each_run_s_stage_and_the_epochs_early_stopping_can_still_give_it(tmp_path: Path) -> None:
    record = _campaign_record()

    def run(name: str, setup: str, stage: str, losses: list[float], finished: bool = False) -> None:
        folder = tmp_path / "main" / name
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(f"setup: {setup}\nencoder: scl\nmax_epochs: 20\npatience: 3\n")
        (folder / "history.csv").write_text("stage,epoch,val_loss,val_accuracy\n" + "".join(
            f"{stage},{epoch},{loss},{'' if stage == 'pretrain' else 0.5 + epoch / 100}\n"
            for epoch, loss in enumerate(losses)))
        (folder / "progress.json").write_text(json.dumps({"status": "unfinished"}))
        if finished:
            (folder / "metrics.json").write_text(json.dumps({"test_accuracy": 0.847}))

    run("setup-ce__seed-0", "ce", "supervised", [0.9, 0.5, 0.6, 0.7, 0.8], finished=True)
    run("setup-ce_aux_sparse__seed-0", "ce_aux_sparse", "supervised", [0.9, 0.4, 0.6, 0.4])  # a tie is no improvement
    run("setup-mlcl__seed-0", "mlcl", "pretrain", [7.0, 6.0, 5.5])
    entries = [{"date": "2026-11-26", "device": "NVIDIA H200", "seconds": 431.0},
               {"date": "2026-11-27", "device": "NVIDIA H100 80GB HBM3", "seconds": 243.4}]
    lines = record.standing_markdown(tmp_path, entries).splitlines()
    assert lines[0] == ("After 2 slices (2026-11-26 to 2026-11-27; NVIDIA H200 ×1, NVIDIA H100 80GB HBM3 ×1; 674 s in "
                        "all): 1 of 3 runs finished.")
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in lines[4:]}
    assert rows["CE"] == ["finished", "supervised", "5", "0.500 (2)", "–", "54.0", "84.7", "82.8 ± 0.7"]
    # lowest 0.4 after epoch 2; patience 3 ends the stage after epoch 5 at the earliest: 1 more of 4 done; at most 16
    assert rows["CE+AUX-sparse"] == ["unfinished", "supervised", "4", "0.400 (2)", "1–16", "53.0", "", "95.9 ± 0.3"]
    assert rows["MLCL"] == ["unfinished", "pretrain (linear)", "3", "5.500 (3)", "3–17", "", "", "95.7 ± 0.5"]
    assert record.standing_markdown(None, entries) is None


def test_the_committed_document_shows_what_the_committed_state_holds(tmp_path: Path) -> None:
    # the tables between the markers of docs/reproduction-gpu.md are rendered, never typed: a hand edit, or a state
    # committed without `campaign_record.py`, shows here
    record = _campaign_record()
    results = tmp_path / "results"
    shutil.copytree(REPO / "results" / "table1_scl_gpu", results)
    doc = tmp_path / "reproduction-gpu.md"
    committed = (REPO / "docs" / "reproduction-gpu.md").read_text()
    doc.write_text(committed)
    record.RESULTS, record.DOC, record.SLICES = results, doc, results / "slices.jsonl"
    record.render()
    assert doc.read_text() == committed


def test_recording_a_damaged_slice_leaves_the_committed_state_as_it_was(tmp_path: Path) -> None:
    # Regression: a garbage state.tar.gz replaced the committed state (the campaign's only copy of
    # its finished epochs) and appended a slice before a traceback.
    record = _campaign_record()
    results = tmp_path / "results"
    results.mkdir()
    record.RESULTS, record.SLICES = results, results / "slices.jsonl"
    (results / "state.tar.gz").write_bytes(b"the committed state")
    (results / "slices.jsonl").write_text('{"slice": 1}\n')
    before = {p.name: p.read_bytes() for p in results.iterdir()}

    def slice_folder(name: str, state: bytes, slice_json: str, progress_json: str = "[]") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "state.tar.gz").write_bytes(state)
        (folder / "slice.json").write_text(slice_json)
        (folder / "progress.json").write_text(progress_json)
        return folder

    good_info = json.dumps({"date": "d", "device": "cpu", "seconds": 1.0, "exit_status": 0})
    cases = {
        "garbage state": (slice_folder("garbage", os.urandom(500), good_info), "not a readable tar archive"),
        "bad slice.json": (slice_folder("badjson", b"", "{bad"), "slice.json: not JSON"),
        "slice.json lacks fields": (slice_folder("fields", b"", "{}"), "slice.json lacks date, device"),
        "progress.json not a list": (slice_folder("list", b"", good_info, "{}"), "expected a JSON list"),
        "no such folder": (tmp_path / "absent", "is not a folder"),
    }
    bad_reports = slice_folder("badreports", b"", good_info)
    (bad_reports / "slice.tar.gz").write_bytes(os.urandom(300))
    cases["garbage slice.tar.gz"] = (bad_reports, "slice.tar.gz: not a readable tar archive")
    for case, (folder, expected) in cases.items():
        with pytest.raises(SystemExit) as stopped:
            record.record(folder)
        message = str(stopped.value)
        assert message.startswith("campaign_record: error: ") and expected in message, (case, message)
        assert "\n" not in message and "/tmp/tmp" not in message, (case, message)  # no temporary copy named
        assert {p.name: p.read_bytes() for p in results.iterdir()} == before, case


def _state_of_runs(folder: Path, epochs: dict[str, int]) -> bytes:
    """A packed state of unfinished run folders, run name -> epochs done (10 steps each)."""
    from rpm_lib.runs import archive as run_archive

    for name, done in epochs.items():
        run = folder / "runs" / name
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("setup: ce\n")
        (run / "history.csv").write_text("stage,epoch,step,train_loss\n"
                                         + "".join(f"supervised,{e},{10 * e + 10},1.0\n" for e in range(done)))
        (run / "progress.json").write_text(json.dumps(
            {"stages": {"supervised": {"global_step": 10 * done, "completed": False}}}))
    run_archive.pack(folder / "runs", folder / "state.tar.gz")
    return (folder / "state.tar.gz").read_bytes()


def test_recording_an_older_slice_or_one_slice_twice_is_refused_and_loses_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Found by trying it: recording slice 4's files after slice 5's silently put slice 4's state back (the runs lost
    # the epochs of slice 5) and appended slice 4 again as a sixth slice.
    record = _campaign_record()
    results = tmp_path / "results"
    results.mkdir()
    record.RESULTS, record.SLICES = results, results / "slices.jsonl"
    (results / "state.tar.gz").write_bytes(_state_of_runs(tmp_path / "committed", {"main/a": 5, "main/b": 3}))
    (results / "slices.jsonl").write_text(json.dumps({"slice": 1, "started": 1000, "runs": []}) + "\n")
    before = {p.name: p.read_bytes() for p in results.iterdir()}

    def slice_folder(name: str, epochs: dict[str, int], started: int) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        _state_of_runs(folder, epochs)
        (folder / "slice.json").write_text(json.dumps({"date": "d", "device": "cpu", "seconds": 1.0,
                                                       "exit_status": 75, "started": started}))
        (folder / "progress.json").write_text("[]")
        return folder

    refused = {
        "the same slice again": (slice_folder("again", {"main/a": 6, "main/b": 3}, 1000),
                                 "already recorded as slice 1"),
        "a run behind": (slice_folder("older", {"main/a": 4, "main/b": 3}, 2000),
                         "main/a: unfinished, 40 steps, 4 epochs against unfinished, 50 steps, 5 epochs"),
        "a run missing": (slice_folder("missing", {"main/a": 6}, 3000), "main/b is missing"),
    }
    for case, (folder, expected) in refused.items():
        with pytest.raises(SystemExit) as stopped:
            record.record(folder)
        message = str(stopped.value)
        assert message.startswith("campaign_record: error: ") and expected in message, (case, message)
        assert message.endswith("nothing recorded") and "\n" not in message, (case, message)
        assert {p.name: p.read_bytes() for p in results.iterdir()} == before, case
    # one archive of every run, as slices 1-6 returned it: each changed or new run is stored as its own archive
    newer = slice_folder("newer", {"main/a": 6, "main/b": 3, "main/c": 1}, 4000)
    assert record.record(newer)["slice"] == 2
    assert sorted(p.name for p in (results / "state").iterdir()) == ["main__a.tar.gz", "main__c.tar.gz"]
    assert (results / "state.tar.gz").read_bytes() == before["state.tar.gz"]  # b: unchanged, still the base's
    # a run restarted on purpose (say after a change of method): recorded when asked, with a warning
    restarted = slice_folder("restarted", {"main/a": 6, "main/b": 1, "main/c": 2}, 5000)
    assert record.record(restarted, accept_behind=True)["slice"] == 3
    assert "warning: recorded although it holds less" in capsys.readouterr().err
    # its own archive replaces the base's further copy (now every run has one: the base is gone)
    assert not (results / "state.tar.gz").exists()
    restored = tmp_path / "restored"
    record.restore_state(results, restored)
    from rpm_lib.runs import archive as run_archive

    assert [run_archive.run_reach(restored / "main" / n).epochs for n in "abc"] == [6, 1, 2]


def test_two_slices_on_one_machine_are_recorded_in_the_order_they_began(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # A second slice on the same machine goes on from the first slice's runs: its state holds all of the first's, so
    # recorded first it would make the first one's refused as "behind". Named in either order, both are recorded.
    record = _campaign_record()
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(record, "RESULTS", results)
    monkeypatch.setattr(record, "SLICES", results / "slices.jsonl")
    monkeypatch.setattr(record, "render", lambda: None)  # the document's tables are another test's
    (results / "state.tar.gz").write_bytes(_state_of_runs(tmp_path / "committed", {"main/a": 5}))
    calls = {}
    for name, epochs, started in (("first", 7, 2000), ("second", 8, 2600)):
        folder = tmp_path / name
        folder.mkdir()
        _state_of_runs(folder, {"main/a": epochs})
        (folder / "slice.json").write_text(json.dumps({"date": "d", "device": "gpu", "seconds": 600.0,
                                                       "exit_status": 75, "started": started}))
        (folder / "progress.json").write_text("[]")
        calls[name] = folder
    assert record.main([str(calls["second"]), str(calls["first"])]) == 0
    entries = [json.loads(line) for line in (results / "slices.jsonl").read_text().splitlines()]
    assert [(e["slice"], e["started"]) for e in entries] == [(1, 2000), (2, 2600)]
    second = record.committed_state(calls["second"])["main/a"].files
    assert record.committed_state(results)["main/a"].files == second


def _per_run_slice(folder: Path, runs: dict[str, int], started: int, finished: tuple[str, ...] = ()) -> Path:
    """A slice's returned folder as gpu_slice.sh leaves it: each run (name -> epochs done, 4 steps each; stopped by
    the budget, or ``finished``) packed into its own archive in ``state/``, and the slice's reports."""
    from rpm_lib.runs import archive as run_archive

    record = _campaign_record()
    for name, epochs in runs.items():
        run_dir = folder / "runs" / "main" / name
        _stopped_run(run_dir, epochs=epochs, steps=4 * epochs)
        if name in finished:
            shutil.rmtree(run_dir / "checkpoints")
            (run_dir / "metrics.json").write_text(json.dumps({"test_accuracy": 0.5}))
            (run_dir / "progress.json").write_text(json.dumps({"status": "finished", "stages": {
                "supervised": {"completed": True, "global_step": 4 * epochs}}}))
        run_archive.pack(folder / "runs", folder / "state" / record.run_archive_name(f"main/{name}"), compact=True,
                         runs=[f"main/{name}"])
    (folder / "slice.json").write_text(json.dumps({"date": "d", "device": "gpu", "seconds": 540.0,
                                                   "exit_status": 75, "started": started}))
    (folder / "progress.json").write_text("[]")
    return folder


def test_recording_stores_only_the_runs_that_changed_or_finished_and_drops_the_base_once_every_run_has_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Every slice committed one archive of every run (27.7 MB): a new blob of that size in the repository's history
    # each time, although most runs had not changed. Now a run's own archive is stored only when its files change
    # (or, small, when it has finished), and the old archive stays the base layer until no run needs it.
    from rpm_lib.runs import archive as run_archive

    record = _campaign_record()
    results = tmp_path / "results"
    monkeypatch.setattr(record, "RESULTS", results)
    monkeypatch.setattr(record, "SLICES", results / "slices.jsonl")
    monkeypatch.setattr(record, "_carried_besides_state", lambda: (0, 0))  # room enough beside the state
    base_runs = tmp_path / "committed"
    for name, epochs in (("a", 2), ("b", 3), ("done", 5)):
        _stopped_run(base_runs / "main" / name, epochs=epochs, steps=4 * epochs)
    (base_runs / "main" / "done" / "metrics.json").write_text(json.dumps({"test_accuracy": 0.5}))
    shutil.rmtree(base_runs / "main" / "done" / "checkpoints")
    (base_runs / "main" / "done" / "progress.json").write_text(json.dumps({"status": "finished", "stages": {
        "supervised": {"completed": True, "global_step": 20}}}))
    run_archive.pack(base_runs, results / "state.tar.gz", compact=True)
    base = (results / "state.tar.gz").read_bytes()

    # slice 1 trained a (b waited its turn; done had finished before): a is stored, and done, which only the base
    # held; b stays in the base, which stays
    first = _per_run_slice(tmp_path / "first", {"a": 3, "b": 3, "done": 5}, 1000, finished=("done",))
    entry = record.record(first)
    assert sorted(p.name for p in (results / "state").iterdir()) == ["main__a.tar.gz", "main__done.tar.gz"]
    assert (results / "state.tar.gz").read_bytes() == base
    added = sum((results / "state" / n).stat().st_size for n in ("main__a.tar.gz", "main__done.tar.gz"))
    assert entry["state_bytes_added"] == added
    assert entry["state_bytes"] == added + len(base)  # what the next slice carries: the base and the runs' own
    said = capsys.readouterr().out
    assert f"campaign_record: slice 1 adds {added / 1e6:.1f} MB to the repository (main__a.tar.gz, " \
           "main__done.tar.gz)" in said, said
    row = json.loads((results / "slices.jsonl").read_text().splitlines()[-1])
    assert row["state_bytes_added"] == added and row["slice"] == 1
    state = record.committed_state(results)
    assert {run: held.archive.name for run, held in state.items()} == {
        "main/a": "main__a.tar.gz", "main/b": "state.tar.gz", "main/done": "main__done.tar.gz"}

    # slice 2 trained b: stored, and with it every run has its own archive: the base goes. a and done did not
    # change: their archives are not written again (the same file, not a new blob of the same content)
    kept = {n: (results / "state" / n).stat().st_mtime_ns for n in ("main__a.tar.gz", "main__done.tar.gz")}
    monkeypatch.setattr(record, "ADDED_LIMIT", 100)  # a slice over the bound is said to be, in one line
    second = _per_run_slice(tmp_path / "second", {"a": 3, "b": 4, "done": 5}, 2000, finished=("done",))
    entry = record.record(second)
    said = capsys.readouterr().out
    assert not (results / "state.tar.gz").exists()
    assert entry["state_bytes_added"] == (results / "state" / "main__b.tar.gz").stat().st_size
    assert {n: (results / "state" / n).stat().st_mtime_ns for n in kept} == kept
    warning = [line for line in said.splitlines() if "adds" in line]
    assert len(warning) == 1 and warning[0].startswith("campaign_record: warning: slice 2 adds ") \
        and "state.tar.gz removed" in warning[0] and "over the 0 MB a commit should add" in warning[0], said
    restored = tmp_path / "restored"
    record.restore_state(results, restored)
    assert [run_archive.run_reach(restored / "main" / n).epochs for n in ("a", "b", "done")] == [3, 4, 5]

    # a slice that changed nothing adds nothing
    third = _per_run_slice(tmp_path / "third", {"a": 3, "b": 4, "done": 5}, 3000, finished=("done",))
    assert record.record(third)["state_bytes_added"] == 0
    assert "slice 3 adds 0.0 MB to the repository (no archive: no run's state changed)" in capsys.readouterr().out


def test_the_added_bytes_are_warned_about_over_15_mb() -> None:
    record = _campaign_record()
    assert record.added_note(7, ["main__setup-mlcl__seed-0.tar.gz"], 15_000_000) == (
        "campaign_record: slice 7 adds 15.0 MB to the repository (main__setup-mlcl__seed-0.tar.gz)")
    warning = record.added_note(7, ["a.tar.gz", "b.tar.gz"], 15_000_001)
    assert warning.startswith("campaign_record: warning: slice 7 adds 15.0 MB") and "CAMPAIGN_JOBS=1" in warning
    assert "\n" not in warning


def test_a_run_s_own_archive_wins_over_the_base_even_when_it_holds_less(tmp_path: Path) -> None:
    # A run restarted on purpose (recorded with --accept-behind) has an archive of its own that holds less than the
    # base's copy. Unpacking the base and then the run's archive with --keep-further, the base's copy would have
    # been kept as "further" and the restart undone: each run is restored from one archive only.
    from rpm_lib.runs import archive as run_archive

    record = _campaign_record()
    results = tmp_path / "results"
    _stopped_run(tmp_path / "old" / "main" / "a", epochs=3, steps=12)
    _stopped_run(tmp_path / "old" / "main" / "b", epochs=2, steps=8)
    run_archive.pack(tmp_path / "old", results / "state.tar.gz")
    _stopped_run(tmp_path / "new" / "main" / "a", epochs=1, steps=4)
    run_archive.pack(tmp_path / "new", results / "state" / "main__a.tar.gz", runs=["main/a"])
    machine = tmp_path / "machine"  # a fresh machine
    record.restore_state(results, machine, keep_further=True)
    assert run_archive.run_reach(machine / "main" / "a").steps == 4
    assert run_archive.run_reach(machine / "main" / "b").steps == 8
    # a second slice on the same machine: its runs went on (a to 8 steps, still behind the base's 12) and are kept
    _stopped_run(machine / "main" / "a", epochs=2, steps=8)
    notes: list[str] = []
    record.restore_state(results, machine, keep_further=True, warn=notes.append)
    assert run_archive.run_reach(machine / "main" / "a").steps == 8 and len(notes) == 1 and "kept" in notes[0]
    # two archives of one run cannot both be its own
    shutil.copyfile(results / "state" / "main__a.tar.gz", results / "state" / "main__a-copy.tar.gz")
    with pytest.raises(run_archive.ArchiveError,
                       match=r"main__a.*: holds run main/a, as .*main__a.* does; one archive per run"):
        record.committed_state(results)


def test_the_base_goes_early_when_the_next_slice_could_not_carry_it_beside_the_runs_own_archives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # One run at a time, MLCL trains for slices while MLCL+AUG waits in the base: base (27.7 MB), MLCL's own archive
    # and the finished runs' would not fit beside the wheels in what a slice may carry (64 MiB). Then the base's
    # last run is stored as its own archive too, and the base goes: one larger commit rather than no next slice.
    from rpm_lib.runs import archive as run_archive

    record = _campaign_record()
    results = tmp_path / "results"
    monkeypatch.setattr(record, "RESULTS", results)
    monkeypatch.setattr(record, "SLICES", results / "slices.jsonl")
    for name, epochs in (("a", 2), ("b", 3)):
        _stopped_run(tmp_path / "committed" / "main" / name, epochs=epochs, steps=4 * epochs)
    run_archive.pack(tmp_path / "committed", results / "state.tar.gz", compact=True)
    returned = _per_run_slice(tmp_path / "slice", {"a": 3, "b": 3}, 1000)
    a_bytes = (returned / "state" / "main__a.tar.gz").stat().st_size
    base_bytes = (results / "state.tar.gz").stat().st_size
    # the wheels and the rest of the checkout leave room for the base, not for the base and a's own archive
    monkeypatch.setattr(record, "_carried_besides_state", lambda: (record.CARRY_LIMIT - base_bytes - a_bytes + 1, 0))
    entry = record.record(returned)
    said = capsys.readouterr().out
    assert "the runs only it held (main/b) are stored as their own archives, and it goes" in said, said
    assert not (results / "state.tar.gz").exists()
    assert sorted(p.name for p in (results / "state").iterdir()) == ["main__a.tar.gz", "main__b.tar.gz"]
    assert entry["state_bytes_added"] == entry["state_bytes"] == sum(
        (results / "state" / n).stat().st_size for n in ("main__a.tar.gz", "main__b.tar.gz"))
    assert record.committed_state(results)["main/b"].files == record.committed_state(returned)["main/b"].files
