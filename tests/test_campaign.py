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


def test_the_campaign_dry_run_stops_unfinished_then_resumes_from_the_archive_to_the_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Parts of 20 kB: the packed state comes back in pieces as a large one does from the GPU machine.
    status, log = _dry_campaign(tmp_path / "work", out, 900, CAMPAIGN_PART_BYTES="20000")
    assert status == 0, log[-3000:]
    # Slice 0 (2.5 times a run's start-up measured on this machine, at least 12 s) starts runs but cannot finish
    # five epochs of every setup; slice 1 resumes from the packed state alone.
    assert "gpu_campaign: slice 0 ended with status 75" in log, log[-3000:]
    assert "gpu_campaign: slice 1 ended with status 0" in log, log[-3000:]
    assert "Traceback" not in log
    # The reports come back as one archive (a slice returns at most 8 files): with the state's parts, no more.
    returned = sorted(p.name for p in out.iterdir())
    assert "slice.tar.gz" in returned and len(returned) <= 7, returned
    with tarfile.open(out / "slice.tar.gz") as tar:
        reports = {Path(m.name).name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert set(reports) == {"progress.md", "progress.json", "table1.md", "slice.json"}, set(reports)  # no GPU: no csv
    progress = reports["progress.md"]
    rows = [line for line in progress.splitlines() if line.startswith("| main/")]
    assert len(rows) == 5 and all("| finished |" in row for row in rows), progress
    # Three at a time: the runs slice 0 started continued in slice 1 (the others started there).
    assert sum(row.split("|")[9].strip() == "2" for row in rows) >= 1, progress
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
    parts = sorted(out.glob("state.tar.gz.part*"))
    assert len(parts) >= 2 and not (out / "state.tar.gz").exists(), sorted(p.name for p in out.iterdir())
    assert all(part.stat().st_size <= 20000 for part in parts)
    packed = b"".join(part.read_bytes() for part in parts)
    assert len(packed) < 1_000_000  # finished runs carry no checkpoints

    # Recording the slice here: the state is stored, the slice appended, the document's tables rewritten.
    record = _campaign_record()
    results, doc = tmp_path / "results", tmp_path / "reproduction-gpu.md"
    doc.write_text((REPO / "docs" / "reproduction-gpu.md").read_text())
    record.RESULTS, record.DOC, record.SLICES = results, doc, results / "slices.jsonl"
    assert record.main([str(out)]) == 0
    assert (results / "state.tar.gz").read_bytes() == packed
    text = doc.read_text()
    assert "| 1 | " in text and "cpu (dry run)" in text and "mlcl_aug 5+5 ep" in text, text
    assert "5 of 5 runs finished" in text and "MLCL+AUG is the best setup" in text, text
    assert "After 1 slice (" in text and "| MLCL+AUG | finished | linear |" in text, text
    assert (results / "progress.md").read_text() == progress
    figure = (results / "progress.png").read_bytes()  # each run's validation accuracy, drawn from the state
    assert figure.startswith(b"\x89PNG") and len(figure) > 10_000

    # Slices 1-3 returned their reports as loose files: recorded the same way.
    loose = tmp_path / "loose"
    loose.mkdir()
    for name, text in reports.items():
        (loose / name).write_text(text)
    (loose / "state.tar.gz").write_bytes(packed)
    info = json.loads(reports["slice.json"])
    del info["started"]  # slices 1-3 did not record their start (and this one is recorded already)
    (loose / "slice.json").write_text(json.dumps(info))
    entry = record.record(loose)
    assert entry["slice"] == 2 and entry["exit_status"] == 0 and len(entry["runs"]) == 5


def test_a_slice_whose_budget_ends_before_any_run_begins_is_not_a_failure(tmp_path: Path) -> None:
    # found on a loaded machine: start-up took the whole budget, and `rpm-batch pack` of no run folder failed the slice
    # CAMPAIGN_CUDA_MPS=1 on a machine without NVIDIA's MPS control program: a note, and the slice goes on without
    # (rpm-batch --cuda-mps would have refused, failing the slice)
    status, log = _dry_campaign(tmp_path / "work", tmp_path / "out", 300, CAMPAIGN_BUDGETS="1", CAMPAIGN_CUDA_MPS="1")
    assert status == 0, log[-3000:]
    assert "gpu_campaign: no run has begun yet; nothing to pack" in log, log[-3000:]
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
    run_archive.unpack(tmp_path / "out" / "state.tar.gz", returned)
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
    run_archive.unpack(tmp_path / "out" / "state.tar.gz", returned)
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
    axes = yaml.safe_load((REPO / "configs" / "table1_scl_gpu.yaml").read_text())["axes"]
    tiny = yaml.safe_load((REPO / "configs" / "table1_scl_tiny.yaml").read_text())["axes"]
    assert axes == tiny and axes["setup"] == ["ce", "ce_aux_dense", "ce_aux_sparse", "mlcl", "mlcl_aug"]


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
    newer = slice_folder("newer", {"main/a": 6, "main/b": 3, "main/c": 1}, 4000)
    assert record.record(newer)["slice"] == 2
    assert (results / "state.tar.gz").read_bytes() == (newer / "state.tar.gz").read_bytes()
    # a run restarted on purpose (say after a change of method): recorded when asked, with a warning
    restarted = slice_folder("restarted", {"main/a": 6, "main/b": 1, "main/c": 2}, 5000)
    assert record.record(restarted, accept_behind=True)["slice"] == 3
    assert "warning: recorded although it holds less" in capsys.readouterr().err


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
    assert (results / "state.tar.gz").read_bytes() == (calls["second"] / "state.tar.gz").read_bytes()


def test_a_slice_whose_mps_daemon_will_not_start_trains_with_the_runs_taking_turns(tmp_path: Path) -> None:
    # MPS is the campaign's default on a GPU: a control program that refuses to start its daemon cost the whole slice
    # (rpm-batch stops with one line, status 2, before any run); now the time left goes to the runs without MPS
    driver = tmp_path / "driver-bin"
    driver.mkdir()
    control = driver / "nvidia-cuda-mps-control"
    control.write_text("#!/bin/sh\necho 'An instance of this daemon is already running' >&2\nexit 1\n")
    control.chmod(0o755)
    status, log = _dry_campaign(tmp_path / "work", tmp_path / "out", 600, CAMPAIGN_BUDGETS="400", CAMPAIGN_CUDA_MPS="1",
                                PATH=f"{driver}{os.pathsep}{os.environ['PATH']}")
    assert status == 0, log[-3000:]
    assert "-d exited with status 1: An instance of this daemon is already running" in log, log[-3000:]
    assert "gpu_campaign: MPS did not work (above); the runs take turns on the GPU for the 400 s left" in log, log[-3000:]
    assert "gpu_campaign: slice 0 ended with status 0" in log and "Traceback" not in log, log[-3000:]
