"""Hostile round 6: time-limited, resumable, portable runs (``time_budget``, ``resume=true``, ``rpm-batch pack`` /
``unpack``) on run folders that were edited, damaged, shared or written by two processes at once.

Every test here was "found": it failed before its fix (a traceback, a run that went on with other settings, a
second process writing over or deleting a running run's files, an archive holding a file from outside the
packed folder). The cases that already held are listed in the round's report, not repeated here."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rpm_lib import batch, run_archive
from rpm_lib.folder_lock import exclusive_writer
from rpm_lib.run_archive import ArchiveError
from rpm_lib.run_progress import RUN_LOCK
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.run import train


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> TrainConfig:
    """An MLCL run stopped in its second stage (linear): pre-training finished, linear's last.ckpt to resume from,
    history rows of both stages. Its config has ``resume=true``; each test copies the folder (:func:`_copy`)."""
    root = tmp_path_factory.mktemp("round6")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = TrainConfig(run_dir=str(root / "run"), data_root=str(root / "data"), generate=True,
                             generate_num_per_config=10, generate_seed=3, progress_bar=False, setup="mlcl",
                             encoder="scl", batch_size=4, max_epochs=1, linear_eval_epochs=1,
                             max_train_samples=8, max_val_samples=4, max_test_samples=4, image_size=32,
                             limit_val_batches=1, limit_test_batches=1)
        train(config)
    finally:
        torch.set_num_threads(previous)
    run_dir = Path(config.run_dir)
    progress = json.loads((run_dir / "progress.json").read_text())
    progress["status"] = "unfinished"
    progress["stages"]["linear"] = {"name": "linear", "completed": False, "global_step": 1}
    (run_dir / "progress.json").write_text(json.dumps(progress))
    (run_dir / "metrics.json").unlink()
    return TrainConfig(**{**config.to_dict(), "resume": True})


def _copy(stopped: TrainConfig, tmp_path: Path, **fields) -> TrainConfig:
    """A copy of the stopped run's folder in ``tmp_path/run``, and its resume config there (with ``fields``)."""
    shutil.copytree(stopped.run_dir, tmp_path / "run")
    return TrainConfig(**{**stopped.to_dict(), "run_dir": str(tmp_path / "run"), **fields})


def _edit_progress(config: TrainConfig, edit) -> Path:
    path = Path(config.run_dir) / "progress.json"
    progress = json.loads(path.read_text())
    edit(progress)
    path.write_text(json.dumps(progress))
    return path


# ----------------------------------------------------------------------------------------------
# progress.json and history.csv edited by hand: one line before training, not a traceback after it
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("edit", "field"), [
    (lambda p: p.update(slices="abc"), "'slices' must be a list of objects"),  # found: AttributeError after the slice
    (lambda p: p.update(data_fingerprint=5), "'data_fingerprint' must be a fingerprint string"),  # found: TypeError
    (lambda p: p["stages"]["pretrain"].update(epochs="abc"),  # found: ValueError before the second stage
     "'stages.pretrain.epochs' must be a whole number >= 0"),
])
def test_a_progress_file_with_a_field_of_the_wrong_type_is_one_line_before_training(
        stopped: TrainConfig, tmp_path: Path, edit, field: str) -> None:
    config = _copy(stopped, tmp_path)
    path = _edit_progress(config, edit)
    last = Path(config.run_dir) / "checkpoints" / "linear" / "last.ckpt"
    before = last.read_bytes()
    with pytest.raises(ConfigError) as error:
        train(config)
    message = str(error.value)
    assert message.startswith(f"{path}: field {field}") and "\n" not in message, message
    assert last.read_bytes() == before  # refused before the stage trained


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda text: text.replace("\nlinear,0,", "\nlinear,abc,"), "line 3: epoch 'abc' is not a whole number"),
    (lambda text: text.replace("stage,epoch", "stagex,epoch"), "no 'stage' and 'epoch' columns"),
    (lambda text: b"\x8e\xff\x00 not text", "unreadable (UnicodeDecodeError"),
])
def test_a_damaged_history_file_is_one_line_before_a_resumed_stage_reads_it(stopped: TrainConfig, tmp_path: Path,
                                                                             damage, reason: str) -> None:
    # found: ValueError / KeyError / UnicodeDecodeError tracebacks from the stage's history callback
    config = _copy(stopped, tmp_path)
    history = Path(config.run_dir) / "history.csv"
    damaged = damage(history.read_text())
    history.write_bytes(damaged if isinstance(damaged, bytes) else damaged.encode())
    with pytest.raises(ConfigError) as error:
        train(config)
    message = str(error.value)
    assert message.startswith(f"resume: {history}: ") and reason in message and "\n" not in message, message


def test_resuming_a_run_whose_config_yaml_is_gone_is_refused_not_continued_with_other_settings(
        stopped: TrainConfig, tmp_path: Path) -> None:
    # found: with config.yaml deleted, nothing compared the configs: seed=7 lr=0.1 trained the rest of the run and
    # metrics.json recorded only those
    config = _copy(stopped, tmp_path, seed=7, lr=0.1)
    (Path(config.run_dir) / "config.yaml").unlink()
    with pytest.raises(ConfigError, match=r"holds a run \(checkpoints, progress.json, history.csv.*\) but no "
                                          r"config.yaml") as error:
        train(config)
    assert "\n" not in str(error.value)
    assert not (Path(config.run_dir) / "metrics.json").exists()


# ----------------------------------------------------------------------------------------------
# two processes on one run folder
# ----------------------------------------------------------------------------------------------
def test_a_second_process_on_a_running_run_folder_is_refused_and_deletes_nothing(stopped: TrainConfig,
                                                                                tmp_path: Path) -> None:
    # found: overwrite=true (or a second resume) in a folder another process trained in deleted its checkpoints
    config = _copy(stopped, tmp_path, resume=False, overwrite=True)
    run_dir = Path(config.run_dir)
    files = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*") if p.is_file())
    with exclusive_writer(run_dir / RUN_LOCK, "rpm-train"):  # what the running process holds
        with pytest.raises(ConfigError, match="another rpm-train is writing here") as error:
            train(config)
    assert "\n" not in str(error.value)
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*") if p.is_file()) == files


def test_unpack_overwrite_is_refused_while_a_run_trains_in_the_folder(stopped: TrainConfig, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # found: the archive's older state replaced the files under the running process, which went on writing
    config = _copy(stopped, tmp_path)
    run_dir = Path(config.run_dir)
    run_archive.pack(run_dir, tmp_path / "state.tar.gz")
    (run_dir / "history.csv").write_text((run_dir / "history.csv").read_text() + "linear,1,9,1,1,0.5,0.002\n")
    went_on = (run_dir / "history.csv").read_bytes()
    with exclusive_writer(run_dir / RUN_LOCK, "rpm-train"):
        assert batch.main(["unpack", str(tmp_path / "state.tar.gz"), "--out", str(run_dir), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another rpm-train is writing here" in err[0] and "nothing unpacked" in err[0], err
    assert (run_dir / "history.csv").read_bytes() == went_on
    # released (the process ended): the unpack goes ahead as before
    assert batch.main(["unpack", str(tmp_path / "state.tar.gz"), "--out", str(run_dir), "--overwrite"]) == 0


# ----------------------------------------------------------------------------------------------
# pack: only files inside the packed folder
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("link", ["run/history.csv", "run/checkpoints/linear/last.ckpt", "linked"])
def test_pack_refuses_a_symbolic_link_instead_of_packing_what_it_points_at(stopped: TrainConfig, tmp_path: Path,
                                                                          link: str) -> None:
    # found: history.csv -> a secret elsewhere, or a run folder linked in, was packed into the shareable archive
    batch_dir = tmp_path / "batch"
    shutil.copytree(stopped.run_dir, batch_dir / "run")
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    place = batch_dir / link
    if link == "linked":
        place.symlink_to(stopped.run_dir, target_is_directory=True)
    else:
        place.unlink()
        place.symlink_to(secret)
    with pytest.raises(ArchiveError, match="a symbolic link; pack copies only files that lie inside") as error:
        run_archive.pack(batch_dir, tmp_path / "state.tar.gz")
    assert str(error.value).startswith(f"{place}: ") and "\n" not in str(error.value)
    assert not (tmp_path / "state.tar.gz").exists()


class _Crash(RuntimeError):
    pass


class _CrashAfterFirstEpoch:
    """A Lightning callback standing in for SIGKILL: the process dies after the first epoch's checkpoint, before the
    stage ends (so before anything but the start of the run records it)."""

    def __new__(cls):
        import lightning as L

        class Crash(L.Callback):
            def on_train_epoch_end(self, trainer, pl_module):
                if trainer.current_epoch == 0:
                    trainer.save_checkpoint(Path(trainer.default_root_dir) / "last.ckpt")
                    raise _Crash("killed")

        return Crash()


def test_a_run_killed_in_its_first_stage_has_recorded_its_data_and_refuses_other_data(tmp_path: Path) -> None:
    # found by round 6 (case 50) and fixed after it: progress.json, and with it the data fingerprint, was written
    # only when a stage ended, so a run killed earlier resumed on any data at its data_root
    config = TrainConfig(run_dir=str(tmp_path / "run"), data_root=str(tmp_path / "data"), generate=True,
                         generate_num_per_config=10, generate_seed=3, progress_bar=False, setup="ce", encoder="wren",
                         batch_size=4, max_epochs=3, image_size=32, limit_val_batches=1, limit_test_batches=1,
                         configurations=("center_single",))
    with pytest.raises(_Crash):
        train(config, callbacks=[_CrashAfterFirstEpoch()])
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["data_fingerprint"].startswith("sha256-")
    # other data at the same place: a training problem more (the generator, run again on resume, leaves it there)
    problem = sorted((tmp_path / "data").rglob("*_train.npz"))[0]
    shutil.copyfile(problem, problem.with_name("RAVEN_999_train.npz"))
    with pytest.raises(ConfigError, match="not the data this run started on"):
        train(TrainConfig(**{**config.to_dict(), "resume": True}))
