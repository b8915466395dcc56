"""Resuming a run from its folder (``resume=true``): what it reads before training on (progress.json,
history.csv, config.yaml, the stage's last.ckpt, the run lock, the data fingerprint) and how each damaged,
edited or contested file is refused in one line naming it, never a traceback and never a run that goes on with
other settings or other data. Most cases resume a copy of the ``stopped`` run of tests/conftest.py."""
from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import copy_run
from rpm_lib.folder_lock import exclusive_writer
from rpm_lib.run_folder import RUN_LOCK
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.run import train


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
    config = copy_run(stopped, tmp_path)
    path = _edit_progress(config, edit)
    last = Path(config.run_dir) / "checkpoints" / "linear" / "last.ckpt"
    before = last.read_bytes()
    with pytest.raises(ConfigError) as error:
        train(config)
    message = str(error.value)
    assert message.startswith(f"{path}: field {field}") and "\n" not in message, message
    assert last.read_bytes() == before  # refused before the stage trained


@pytest.mark.parametrize(("edit", "keep_last", "reason"), [
    # found: the 99 epochs were copied into metrics.json (and from there into a shipped model's record)
    ({"epochs": 99}, False, "'stages.pretrain.epochs' is 99, more than this config's limit for stage pretrain (1 "),
    ({"global_step": 7}, True, "'stages.pretrain.global_step' is 7, but {last} shows 2"),
])
def test_a_completed_stage_whose_record_is_not_what_it_trained_is_refused_not_copied_into_metrics(
        stopped: TrainConfig, tmp_path: Path, edit: dict, keep_last: bool, reason: str) -> None:
    config = copy_run(stopped, tmp_path)
    run_dir = Path(config.run_dir)
    last = run_dir / "checkpoints" / "pretrain" / "last.ckpt"
    if not keep_last:
        last.unlink()  # as a packed run keeps it: the stage's limit still bounds its record
    path = _edit_progress(config, lambda p: p["stages"]["pretrain"].update(edit))
    with pytest.raises(ConfigError) as error:
        train(config)
    message = str(error.value)
    assert message.startswith(f"{path}: field {reason.format(last=last)}") and "\n" not in message, message
    assert not (run_dir / "metrics.json").exists()


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda text: text.replace("\nlinear,0,", "\nlinear,abc,"), "line 3: epoch 'abc' is not a whole number"),
    (lambda text: text.replace("stage,epoch", "stagex,epoch"), "no 'stage' and 'epoch' columns"),
    (lambda text: b"\x8e\xff\x00 not text", "unreadable (UnicodeDecodeError"),
    # found: one NUL byte in the header made a column the stage's writer does not have, a ValueError traceback
    (lambda text: text.replace(",lr\n", ",l\x00r\n"), "line 1: holds a NUL byte"),
    (lambda text: text.replace(",lr\n", ",lrx\n"), "line 1: column 'lrx' is not one of stage, epoch"),
    (lambda text: text.replace("\nlinear,0,", "\nlinear,0,9,"), "line 3: 8 cells where the header names 7"),
    # found: ValueError when the stage ended and looked up its best epoch's accuracy
    (lambda text: re.sub(r"\nlinear,0,(\w+),([^,]*),[^,]*,", r"\nlinear,0,\1,\2,abc,", text),
     "line 3: val_loss 'abc' is not a number"),
])
def test_a_damaged_history_file_is_one_line_before_a_resumed_stage_reads_it(stopped: TrainConfig, tmp_path: Path,
                                                                             damage, reason: str) -> None:
    # found: ValueError / KeyError / UnicodeDecodeError tracebacks from the stage's history callback
    config = copy_run(stopped, tmp_path, linear_eval_epochs=2)  # stage linear has an epoch left to train
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
    config = copy_run(stopped, tmp_path, seed=7, lr=0.1)
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
    config = copy_run(stopped, tmp_path, resume=False, overwrite=True)
    run_dir = Path(config.run_dir)
    files = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*") if p.is_file())
    with exclusive_writer(run_dir / RUN_LOCK, "rpm-train"):  # what the running process holds
        with pytest.raises(ConfigError, match="another rpm-train is writing here") as error:
            train(config)
    assert "\n" not in str(error.value)
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*") if p.is_file()) == files


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
    # found: progress.json, and with it the data fingerprint, was written only when a stage ended, so a run killed
    # earlier resumed on any data at its data_root
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


# ----------------------------------------------------------------------------------------------
# the stage's checkpoint and progress.json of a run stopped in its first stage
# ----------------------------------------------------------------------------------------------
def _stopped_run(tiny_config: Callable[..., TrainConfig]) -> TrainConfig:
    """A run whose first stage has a last.ckpt to resume from (killed after its first epoch, progress kept)."""
    config = tiny_config(setup="ce", max_steps=-1, max_epochs=2, max_train_samples=4, batch_size=2)
    train(config)
    run_dir = Path(config.run_dir)
    progress = json.loads((run_dir / "progress.json").read_text())
    progress["status"] = "unfinished"
    progress["stages"]["supervised"]["completed"] = False
    (run_dir / "progress.json").write_text(json.dumps(progress))
    (run_dir / "metrics.json").unlink()
    return TrainConfig(**{**config.to_dict(), "resume": True})


@pytest.mark.parametrize(("content", "reason"), [
    (b"not a checkpoint at all, just text", "holds Python objects other than tensors"),
    ("truncate", "truncated or damaged file"),
])
def test_a_damaged_resume_checkpoint_is_one_line_without_unsafe_advice(tiny_config: Callable[..., TrainConfig],
                                                                       content: bytes | str, reason: str) -> None:
    resumed = _stopped_run(tiny_config)
    last = Path(resumed.run_dir) / "checkpoints" / "supervised" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:2000] if content == "truncate" else content)
    with pytest.raises(ConfigError) as error:
        train(resumed)
    message = str(error.value)
    assert message.startswith(f"checkpoint {last}: not loadable as plain weights") and reason in message, message
    assert "weights_only=False" not in message and "\n" not in message
    # the stage had recorded steps: the same choices as for a missing file
    assert message.endswith(f"; {_CHOICES}"), message


#: The choices a refusal to resume stage supervised from its last.ckpt offers.
_CHOICES = ("restore it, pass restart_stage=true to train stage supervised again from step 0, or overwrite=true to "
            "start the whole run again")


def _files(run_dir: Path) -> dict[str, bytes]:
    """The run's files and their bytes, but the lock (each call writes its holder there)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != RUN_LOCK}


def test_a_stage_whose_recorded_steps_have_no_last_ckpt_is_refused_not_started_again(
        tiny_config: Callable[..., TrainConfig]) -> None:
    # found: the stage started again at step 0 after a note, its steps lost and progress.json's slices reading as
    # if it had gone on
    resumed = _stopped_run(tiny_config)
    run_dir = Path(resumed.run_dir)
    last = run_dir / "checkpoints" / "supervised" / "last.ckpt"
    last.unlink()
    before = _files(run_dir)
    step = json.loads((run_dir / "progress.json").read_text())["stages"]["supervised"]["global_step"]
    assert step > 0
    with pytest.raises(ConfigError) as error:
        train(resumed)
    assert str(error.value) == (f"resume: {last} is missing, but {run_dir / 'progress.json'} records stage "
                                f"supervised at step {step}; {_CHOICES}")
    assert _files(run_dir) == before


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_restart_stage_trains_the_stage_again_from_step_0_and_records_it(tiny_config: Callable[..., TrainConfig],
                                                                         capsys: pytest.CaptureFixture[str],
                                                                         damage: str) -> None:
    resumed = _stopped_run(tiny_config)
    run_dir = Path(resumed.run_dir)
    last = run_dir / "checkpoints" / "supervised" / "last.ckpt"
    step = json.loads((run_dir / "progress.json").read_text())["stages"]["supervised"]["global_step"]
    if damage == "missing":
        last.unlink()
    else:
        last.write_bytes(last.read_bytes()[:2000])
    capsys.readouterr()
    metrics = train(TrainConfig(**{**resumed.to_dict(), "restart_stage": True}))
    assert metrics["status"] == "finished"
    err = [line for line in capsys.readouterr().err.splitlines() if "restart_stage" in line]
    assert len(err) == 1 and err[0].startswith("rpm-train: note: ") and str(last) in err[0], err
    assert "stage supervised starts again at step 0 (restart_stage=true" in err[0], err
    assert ("the damaged file removed" in err[0]) is (damage == "truncated"), err
    entry = json.loads((run_dir / "progress.json").read_text())["stages"]["supervised"]
    # trained again from step 0: as many steps as the first time, and the history holds this attempt's epochs once
    assert entry["completed"] is True and entry["global_step"] == step
    history = (run_dir / "history.csv").read_text().splitlines()[1:]
    assert [line.split(",")[:2] for line in history] == [["supervised", "0"], ["supervised", "1"]], history
    assert entry["restarted"] == {"slice": 2, "lost_global_step": step,
                                  "last_ckpt": "missing" if damage == "missing" else "damaged",
                                  "by": "restart_stage=true"}
    assert metrics["stages"][0]["restarted"] == entry["restarted"]
    assert last.is_file()  # the restarted stage's own resume point


def test_a_stage_without_recorded_steps_still_starts_or_resumes_as_before(tiny_config: Callable[..., TrainConfig],
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # a run killed in its first stage (SIGKILL) has no entry for it: with a last.ckpt it resumes from it, without
    # one it starts at step 0 -- no steps were recorded, so none are lost
    resumed = _stopped_run(tiny_config)
    run_dir = Path(resumed.run_dir)
    progress = json.loads((run_dir / "progress.json").read_text())
    del progress["stages"]["supervised"]
    (run_dir / "progress.json").write_text(json.dumps(progress))
    assert train(resumed)["status"] == "finished"
    progress["status"] = "unfinished"
    (run_dir / "progress.json").write_text(json.dumps(progress))
    (run_dir / "metrics.json").unlink()
    (run_dir / "checkpoints" / "supervised" / "last.ckpt").unlink()
    capsys.readouterr()
    metrics = train(resumed)
    assert metrics["status"] == "finished" and "restarted" not in metrics["stages"][0]
    assert "restart" not in capsys.readouterr().err


@pytest.mark.parametrize("content", ["[1, 2]", '{"stages": [1]}', '{"stages": {"supervised": 3}}'])
def test_a_progress_file_of_the_wrong_shape_is_one_line(tiny_config: Callable[..., TrainConfig], content: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    resumed = _stopped_run(tiny_config)
    progress = Path(resumed.run_dir) / "progress.json"
    progress.write_text(content)
    with pytest.raises(ConfigError, match=f"{progress}: (expected a JSON object|field 'stages')"):
        train(resumed)
