"""Time-boxed runs: a run cut into slices by ``time_budget``, each resumed in a fresh folder from the previous
slice's archive (``rpm_lib.runs.archive``) on regenerated data, ends with exactly the uninterrupted run's metrics.

The slices are cut by a fake clock (every reading advances it by one second), so where they stop is the same
on every machine; one test uses the real clock to show the stop comes before the budget ends.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest

from rpm_lib.runs import archive as run_archive
from rpm_lib.training import cli, time_budget
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.history import history_rows
from rpm_lib.run_folder import UNFINISHED_EXIT_CODE
from rpm_lib.training.run import train
from comparable_metrics import comparable as _comparable


class FakeClock:
    """Stands in for the ``time`` module of ``rpm_lib.training.time_budget``: each reading is one second later."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    def install() -> None:
        monkeypatch.setattr(time_budget, "time", FakeClock())

    yield install


def _fields(setup: str, data_root: Path) -> dict[str, Any]:
    # 16 training problems at batch 4: 4 steps an epoch, 2 epochs a stage; mlcl_aug also fine-tunes one epoch.
    return dict(data_root=str(data_root), generate=True, generate_num_per_config=10, generate_seed=3,
                progress_bar=False, setup=setup, encoder="scl", batch_size=4, max_epochs=2, linear_eval_epochs=2,
                finetune=setup == "mlcl_aug", finetune_epochs=1, max_train_samples=16, max_val_samples=4,
                max_test_samples=6, patience=5, image_size=32, limit_val_batches=1.0, limit_test_batches=1.0)




@pytest.mark.parametrize(("setup", "budgets", "stops", "workers"), [
    ("ce_aux_sparse", (12.0, 12.0), [("supervised", 3), ("supervised", 6)], 2),
    ("mlcl_aug", (20.0, 25.0), [("pretrain", 3), ("linear", 3)], 0),
])
def test_three_slices_in_fresh_folders_end_with_the_uninterrupted_metrics(
        tmp_path: Path, fake_clock: Callable[[], None], setup: str, budgets: tuple[float, float],
        stops: list[tuple[str, int]], workers: int) -> None:
    # With loader workers (CE+AUX-sparse) the resumed epoch's first batches are fetched ahead by other processes.
    def fields(data: Path) -> dict[str, Any]:
        return {**_fields(setup, data), "num_workers": workers}

    reference = train(TrainConfig(run_dir=str(tmp_path / "uninterrupted"), **fields(tmp_path / "data0")))
    assert reference["status"] == "finished"
    archive: Path | None = None
    seen = []
    for number, budget in enumerate((*budgets, None)):
        # Every slice: a fresh run folder and freshly generated data (another folder), as on another machine.
        run_dir, data = tmp_path / f"slice{number}", tmp_path / f"data{number + 1}"
        if archive is not None:
            run_archive.unpack(archive, run_dir)
        if budget is not None:
            fake_clock()
        first = _FirstStep()
        result = train(TrainConfig(run_dir=str(run_dir), resume=number > 0, time_budget=budget, **fields(data)),
                       callbacks=[first])
        if seen:  # each slice starts its stage at the step where the last one stopped
            assert first.step == seen[-1][1], (seen, first.step)
        if budget is not None:
            assert result["status"] == "unfinished"
            seen.append((result["stage"], result["global_step"]))
            progress = json.loads((run_dir / "progress.json").read_text())
            assert progress["status"] == "unfinished" and progress["data_fingerprint"].startswith("sha256-pieces-v1:")
            assert not (run_dir / "metrics.json").exists()
        archive = tmp_path / f"slice{number}.tar.gz"
        run_archive.pack(run_dir, archive)
    assert seen == stops  # mid-epoch stops (4 steps an epoch), one of them in the second stage
    assert _comparable(result) == _comparable(reference)
    final, uninterrupted = tmp_path / "slice2", tmp_path / "uninterrupted"
    assert (final / "history.csv").read_text() == (uninterrupted / "history.csv").read_text()
    a, b = np.load(uninterrupted / "predictions.npz"), np.load(final / "predictions.npz")
    assert np.array_equal(a["scores"], b["scores"])
    progress = json.loads((final / "progress.json").read_text())
    assert progress["status"] == "finished" and [s["ended_in"] for s in progress["slices"]] == [
        stops[0][0], stops[1][0], "end"]


def test_a_resumed_run_refuses_data_with_another_fingerprint(tmp_path: Path, fake_clock: Callable[[], None]) -> None:
    fields = _fields("ce", tmp_path / "data")
    fake_clock()
    assert train(TrainConfig(run_dir=str(tmp_path / "run"), time_budget=10.0, **fields))["status"] == "unfinished"
    # A folder without a recorded fingerprint (a run from before fingerprints) cannot move its data at all.
    shutil.copytree(tmp_path / "run", tmp_path / "older")
    progress_path = tmp_path / "older" / "progress.json"
    progress = json.loads(progress_path.read_text())
    del progress["data_fingerprint"]
    progress_path.write_text(json.dumps(progress))
    moved = {**fields, "data_root": str(tmp_path / "moved")}
    with pytest.raises(ConfigError, match="records no data fingerprint, so data_root cannot move"):
        train(TrainConfig(run_dir=str(tmp_path / "older"), resume=True, **moved))
    # "Regenerated" data that are not the same: two training problems swapped (a generator that is not
    # deterministic would do worse). Both files stay valid, so only the fingerprint can tell.
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "data", other)
    first, second = other / "center_single" / "RAVEN_0_train.npz", other / "center_single" / "RAVEN_1_train.npz"
    content = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(content)
    with pytest.raises(ConfigError, match="not the data this run started on"):
        train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **{**fields, "data_root": str(other)}))
    # generate_seed is part of the run's config: changing it alone is refused before the data are even read.
    with pytest.raises(ConfigError, match="differs in generate_seed"):
        train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **{**fields, "generate_seed": 4}))


def _cache_and_redrawn_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny cache, and the same problems with other pixels.

    Another OpenCV version draws some edge pixels differently (rpm_lib.data.opencv_version): here one grey level
    on every 97th pixel of a regenerated cache, whose labels are the same.
    """
    from rpm_lib.generator.cache_writer import generate_cache

    cache, redrawn = tmp_path / "cache", tmp_path / "redrawn"
    for folder in (cache, redrawn):
        generate_cache(folder, count=10, seed=3, size=32, progress=False)
    panels = np.load(redrawn / "panels.npy")
    panels.reshape(-1)[::97] ^= 1
    np.save(redrawn / "panels.npy", panels)
    return cache, redrawn


def test_a_run_resumed_on_other_pixels_of_the_same_problems_goes_on_only_when_told(
        tmp_path: Path, fake_clock: Callable[[], None]) -> None:
    cache, redrawn = _cache_and_redrawn_copy(tmp_path)
    fields = {**_fields("ce", cache), "generate": False}
    fake_clock()
    assert train(TrainConfig(run_dir=str(tmp_path / "run"), time_budget=10.0, **fields))["status"] == "unfinished"
    again = {**fields, "data_root": str(redrawn)}
    with pytest.raises(ConfigError, match="hold the problems this run started on, but other pixels"):
        train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **again))
    result = train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, data_check="problems", **again))
    assert result["status"] == "finished"
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    change, = progress["data_changes"]
    assert change["slice"] == 2 and change["accepted_by"] == "data_check=problems"
    assert progress["data_problems"].startswith("sha256-problems-v1:")


def test_only_the_writing_process_notes_a_run_going_on_with_other_pixels(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rpm_lib.data.fingerprint import data_fingerprint, problems_fingerprint
    from rpm_lib.training.progress_record import ProgressRecord

    cache, redrawn = _cache_and_redrawn_copy(tmp_path)
    started = {"data_fingerprint": data_fingerprint(cache), "data_problems": problems_fingerprint(cache)}
    for writer, notes in ((False, 0), (True, 1)):  # a DDP rank other than 0, then rank 0
        record = ProgressRecord(tmp_path / "run", dict(started), writer, data_check="problems")
        assert record.check_data(redrawn) == data_fingerprint(redrawn)
        assert capsys.readouterr().err.count("continuing on other pixels") == notes


def test_a_refusal_of_other_pixels_blames_opencv_only_when_the_versions_differ(tmp_path: Path) -> None:
    # Regression: one edited byte of a cache was put down to "OpenCV versions" that were the same.
    import rpm_lib.data.opencv_version as opencv_version
    from rpm_lib.data.fingerprint import data_fingerprint, problems_fingerprint
    from rpm_lib.training.progress_record import ProgressRecord

    cache, redrawn = _cache_and_redrawn_copy(tmp_path)
    here = opencv_version.recorded(redrawn)
    started = {"data_fingerprint": data_fingerprint(cache), "data_problems": problems_fingerprint(cache)}
    for then, cause in ((here, "the same OpenCV versions made both, so something else changed the pixels"),
                        ({"rendered": "0.0.1", "resized": "0.0.1"}, "OpenCV versions draw some edge pixels")):
        record = ProgressRecord(tmp_path / "run", {**started, "data_opencv": then}, True, data_check="exact")
        with pytest.raises(ConfigError) as refused:
            record.check_data(redrawn)
        assert cause in str(refused.value), str(refused.value)


class _SlowSteps(L.Callback):
    """Makes every training step take ``seconds`` longer (a stand-in for a bigger model)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(self.seconds)


def test_the_real_clock_stops_before_the_budget_and_the_cli_says_unfinished(
        tiny_config: Callable[..., TrainConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 10 s: on a machine loaded by other work, start-up (imports, data, the first step) alone took most of 6 s
    budget = 10.0
    config = tiny_config(setup="ce", max_steps=-1, max_epochs=80, max_train_samples=8, batch_size=2, time_budget=budget)
    began = time.monotonic()
    result = train(config, callbacks=[_SlowSteps(0.25)])
    elapsed = time.monotonic() - began
    assert result["status"] == "unfinished" and result["global_step"] >= 4
    assert elapsed < budget, f"the run took {elapsed:.2f} s of a {budget} s budget"
    config_file = tmp_path / "run.yaml"
    TrainConfig.from_yaml(Path(config.run_dir) / "config.yaml").with_overrides(
        {"time_budget": 0.5, "resume": True}).to_yaml(config_file)
    assert cli.main(["--config", str(config_file)]) == UNFINISHED_EXIT_CODE
    err = capsys.readouterr().err
    assert "rpm-train: unfinished" in err and "resume=true" in err and "Traceback" not in err


def test_a_finished_run_resumed_from_its_archive_returns_its_metrics(tiny_config: Callable[..., TrainConfig],
                                                                     tmp_path: Path) -> None:
    config = tiny_config(setup="ce")
    metrics = train(config)
    runs = run_archive.pack(config.run_dir, tmp_path / "state.tar.gz")
    assert [r.status for r in runs] == ["finished"] and not any("ckpt" in f for f in runs[0].files)
    run_archive.unpack(tmp_path / "state.tar.gz", tmp_path / "moved")
    again = train(TrainConfig(**{**config.to_dict(), "run_dir": str(tmp_path / "moved"), "resume": True}))
    assert again["test_accuracy"] == metrics["test_accuracy"] and again["runtime_s"] == metrics["runtime_s"]


def test_the_step_that_ends_an_epoch_is_never_cut_from_its_validation() -> None:
    class Trainer:
        num_training_batches = 4
        global_step = 8
        fit_loop = type("F", (), {"epoch_loop": type("E", (), {"batch_idx": 3})()})()

    stop = time_budget.TimeBudgetStop(time_budget.Deadline(10.0), "supervised", Path("last.ckpt"), max_steps=-1)
    assert stop._validates_after(Trainer(), 3)  # batch 3 of 4 ends the epoch: validation follows it
    assert not stop._validates_after(Trainer(), 2)
    limited = time_budget.TimeBudgetStop(time_budget.Deadline(10.0), "supervised", Path("last.ckpt"), max_steps=9)
    assert limited._validates_after(Trainer(), 4)  # the next step is the 9th: the step limit validates


def test_a_validation_not_yet_run_in_this_fit_is_predicted_from_the_loader_and_the_batchnorm_batches() -> None:
    # Found while looking into an overrun on the CPU: a run resumed in the middle of an epoch predicted that epoch's
    # validation at 0 batches (Lightning counts them only once a validation has run) and the BatchNorm re-estimate
    # before it not at all, so it could start the epoch's last step and overrun its budget by a whole validation.
    class Module:
        @staticmethod
        def batches_before_validation() -> int:
            return 3

    class DataModule:
        @staticmethod
        def val_dataloader() -> list[int]:
            return list(range(10))

    class Trainer:
        num_val_batches: list[int] = []
        limit_val_batches: float | int = 0.7
        lightning_module = Module()
        datamodule = DataModule()

    stop = time_budget.TimeBudgetStop(time_budget.Deadline(60.0), "pretrain", Path("last.ckpt"))
    stop._step_seconds.append(2.0)
    assert stop._predict_validation(Trainer()) == (7 + 3) * 2.0 + 1.0  # 70 % of 10 batches, 3 before, one save
    Trainer.limit_val_batches = 4
    assert time_budget.TimeBudgetStop(time_budget.Deadline(60.0), "pretrain", Path("last.ckpt"))._predict_validation(
        Trainer()) == 1.0  # no step measured yet: only the save
    fresh = time_budget.TimeBudgetStop(time_budget.Deadline(60.0), "pretrain", Path("last.ckpt"))
    fresh._step_seconds.append(2.0)
    assert fresh._predict_validation(Trainer()) == (4 + 3) * 2.0 + 1.0  # an int limit caps the batches
    Trainer.num_val_batches = [5]  # once Lightning has counted them, its count is used
    assert fresh._predict_validation(Trainer()) == (5 + 3) * 2.0 + 1.0


def test_a_deadline_allows_only_work_that_ends_before_it_with_the_safety_factor() -> None:
    deadline = time_budget.Deadline(10.0, started=time.monotonic())
    assert deadline.allows(1.0) and not deadline.allows(10.0 / time_budget.SAFETY_FACTOR + 0.1)
    assert time_budget.Deadline(None).allows(1e9) and not time_budget.Deadline(None).active


class _RequestStop(L.Callback):
    """Writes the run's stop request after ``step`` steps (what rpm-batch on SLURM does on a scheduler signal)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            (Path(trainer.default_root_dir) / time_budget.STOP_FILE).touch()


def test_a_stop_request_file_stops_a_run_without_a_budget_and_resuming_finishes_it(tmp_path: Path) -> None:
    fields = _fields("ce", tmp_path / "data")
    reference = train(TrainConfig(run_dir=str(tmp_path / "reference"), **fields))
    stopped = train(TrainConfig(run_dir=str(tmp_path / "run"), **fields), callbacks=[_RequestStop(2)])
    # The request is seen at the boundary of the step that wrote it (this callback runs before the budget check).
    assert stopped["status"] == "unfinished" and stopped["global_step"] == 2
    resumed = train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **fields))
    assert not (tmp_path / "run" / time_budget.STOP_FILE).exists()  # an obeyed request does not stop the resume
    assert _comparable(resumed) == _comparable(reference)


class _RequestStopWhenAStageEnds(L.Callback):
    """Writes the run's stop request when a stage's fit ends: the next stage has no time to begin."""

    def on_fit_end(self, trainer: L.Trainer, *args: Any) -> None:
        (Path(trainer.default_root_dir) / time_budget.STOP_FILE).touch()


def test_a_stage_without_time_to_begin_stops_before_its_start_up_work(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Linear evaluation starts by re-estimating the frozen encoder's BatchNorm statistics and embedding every
    # problem (seconds on a GPU, minutes on a CPU); the decision whether the stage begins at all came after them.
    from rpm_lib.training.module import RpmModule

    started: list[tuple[str, str]] = []
    for name in ("recalibrate_encoder_batchnorm", "_cache_features"):
        original = getattr(RpmModule, name)

        def spy(module: RpmModule, *args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            started.append((module._require_plan().name, _name))
            return _original(module, *args, **kwargs)

        monkeypatch.setattr(RpmModule, name, spy)
    fields = _fields("mlcl", tmp_path / "data")
    stopped = train(TrainConfig(run_dir=str(tmp_path / "run"), **fields), callbacks=[_RequestStopWhenAStageEnds()])
    assert (stopped["status"], stopped["stage"], stopped["global_step"]) == ("unfinished", "linear", 0)
    assert {stage for stage, _ in started} == {"pretrain"}, started
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["stages"]["pretrain"]["completed"] and progress["stages"]["linear"]["global_step"] == 0
    resumed = train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **fields))
    assert resumed["status"] == "finished"
    assert ("linear", "_cache_features") in started and ("linear", "recalibrate_encoder_batchnorm") in started


class _RequestStopAfterValidation(L.Callback):
    """Writes the run's stop request when ``epoch``'s validation ends: the run stops before the next epoch's first
    step, and its resumable state is the last.ckpt written at that validation."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.current_epoch == self.epoch:
            (Path(trainer.default_root_dir) / time_budget.STOP_FILE).touch()


class _FirstStep(L.Callback):
    """The global step at which a call's first trained stage starts."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.step is None:
            self.step = int(trainer.global_step)


def test_a_run_stopped_after_an_epoch_without_improvement_resumes_where_it_stopped(tmp_path: Path) -> None:
    # Lightning 2.6 writes last.ckpt only when best.ckpt improves; resuming then went back to the last improvement
    # and trained those epochs again (the metrics still matched, only the work was lost).
    fields = {**_fields("ce", tmp_path / "data"), "max_epochs": 6, "patience": 10}
    reference = train(TrainConfig(run_dir=str(tmp_path / "reference"), **fields))
    losses = [float(row["val_loss"]) for row in history_rows(tmp_path / "reference" / "history.csv")]
    worse = [epoch for epoch in range(1, 5) if losses[epoch] >= min(losses[:epoch])]
    assert worse, f"every epoch improved the validation loss ({losses}): this test needs one that did not"
    epoch = worse[0]
    stopped = train(TrainConfig(run_dir=str(tmp_path / "run"), **fields),
                    callbacks=[_RequestStopAfterValidation(epoch)])
    steps_per_epoch = 4
    assert stopped["status"] == "unfinished" and stopped["global_step"] == (epoch + 1) * steps_per_epoch
    first = _FirstStep()
    resumed = train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **fields), callbacks=[first])
    assert first.step == stopped["global_step"], f"stopped after step {stopped['global_step']}, resumed at {first.step}"
    assert _comparable(resumed) == _comparable(reference)


def test_rpm_train_stopped_by_a_stop_request_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # Without time_budget, only the request (rpm-batch on SLURM writes it on the scheduler's signal) can stop the run.
    import rpm_lib.training.run as run_module

    TrainConfig(run_dir=str(tmp_path / "run"), **_fields("ce", tmp_path / "data")).to_yaml(tmp_path / "run.yaml")
    original = run_module.train
    monkeypatch.setattr(run_module, "train", lambda config, **kw: original(config, callbacks=[_RequestStop(2)], **kw))
    assert cli.main(["--config", str(tmp_path / "run.yaml")]) == UNFINISHED_EXIT_CODE
    err = capsys.readouterr().err
    assert "Traceback" not in err and "TypeError" not in err, err
    assert "stop request" in err and time_budget.STOP_FILE in err and "resume=true" in err, err


class _SendSignal(L.Callback):
    """Sends ``signum`` to this process ``times`` times: after the first validation batch of the first epoch (the
    moment Lightning's own SIGTERM handler would end the process with status 0), or after training step ``step``."""

    def __init__(self, signum: int, times: int = 1, step: int | None = None) -> None:
        self.signum, self.times, self.step = signum, times, step

    def _send(self) -> None:
        for _ in range(self.times):
            os.kill(os.getpid(), self.signum)
        self.times = 0

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.step is None and trainer.current_epoch == 0:
            self._send()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self._send()


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT handled by Python's KeyboardInterrupt handler, also when the test process started with it ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_validation_stops_rpm_train_at_the_next_step_with_the_uninterrupted_metrics(
        tmp_path: Path, signum: int, ctrl_c_raises: None) -> None:
    # 2 validation batches an epoch: the signal comes after the first (regression: SIGTERM ended
    # rpm-train with status 0 and no output, SIGINT with status 1).
    fields = {**_fields("ce", tmp_path / "data"), "max_val_samples": 8}
    reference = train(TrainConfig(run_dir=str(tmp_path / "reference"), **fields))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stopped = train(TrainConfig(run_dir=str(tmp_path / "run"), **fields), callbacks=[_SendSignal(signum)],
                    stop_on_terminal_signals=True)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers  # given back after the call
    steps_per_epoch = 4
    assert stopped["status"] == "unfinished" and stopped["global_step"] == steps_per_epoch
    assert stopped["stop_requested"]
    resumed = train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **fields), stop_on_terminal_signals=True)
    assert _comparable(resumed) == _comparable(reference)


def test_rpm_train_says_what_a_signal_did_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], ctrl_c_raises: None) -> None:
    import rpm_lib.training.run as run_module

    fields = _fields("ce", tmp_path / "data")
    reference = train(TrainConfig(run_dir=str(tmp_path / "reference"), **fields))
    TrainConfig(run_dir=str(tmp_path / "run"), **fields).to_yaml(tmp_path / "run.yaml")
    original = run_module.train
    sender: list[_SendSignal] = []
    monkeypatch.setattr(run_module, "train", lambda config, **kw: original(config, callbacks=sender, **kw))

    sender[:] = [_SendSignal(signal.SIGTERM, step=2)]
    assert cli.main(["--config", str(tmp_path / "run.yaml")]) == UNFINISHED_EXIT_CODE
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "rpm-train: SIGTERM received: stopping at the next step with a resumable state"
    assert "rpm-train: unfinished: a stop request" in err and "after step 2" in err and "Traceback" not in err, err
    assert len(err.splitlines()) == 2, err

    # Ctrl-C twice: the second stops at once; the run goes on from the last epoch's checkpoint.
    sender[:] = [_SendSignal(signal.SIGINT, times=2, step=6)]
    assert cli.main(["--config", str(tmp_path / "run.yaml"), "resume=true"]) == 130
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("rpm-train: stopped at once by a second Ctrl-C; resume=true continues"), err
    assert len(err.splitlines()) == 2 and "Traceback" not in err, err

    sender[:] = []
    assert cli.main(["--config", str(tmp_path / "run.yaml"), "resume=true"]) == 0
    resumed = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert _comparable(resumed) == _comparable(reference)


def test_the_unfinished_line_names_what_stopped_the_run() -> None:
    stopped = {"status": "unfinished", "stage": "linear", "global_step": 7}
    assert time_budget.describe_unfinished(stopped, 30.0, "runs/a") == \
        "the time budget (30 s) ended the run in linear after step 7"
    by_signal = time_budget.describe_unfinished({**stopped, "stop_requested": True}, 30.0, "runs/a")
    assert by_signal.startswith(f"a stop request (runs/a/{time_budget.STOP_FILE}, ")
    assert time_budget.describe_unfinished({"stage": "evaluation", "global_step": None}, None, "r").endswith(
        "ended the run in evaluation")  # no "after step None"
    stuck = time_budget.describe_unfinished({**stopped, "made_progress": False}, 3.0, "runs/a")
    assert stuck.endswith("this call trained no step (start-up and the time a stage needs to begin used the budget): "
                          "give a larger time_budget")


def test_a_call_that_trains_no_step_says_so(tmp_path: Path, fake_clock: Callable[[], None]) -> None:
    # Regression: time_budget=3 ended call after call "after step 0" without saying why.
    fields = _fields("ce", tmp_path / "data")
    fake_clock()  # every clock reading one second later: a stage needs 3 s left to begin
    first = train(TrainConfig(run_dir=str(tmp_path / "run"), time_budget=2.0, **fields))
    assert first["status"] == "unfinished" and first["global_step"] == 0 and first["made_progress"] is False
    again = train(TrainConfig(run_dir=str(tmp_path / "run"), time_budget=2.0, resume=True, **fields))
    assert again["global_step"] == 0 and again["made_progress"] is False
    moved = train(TrainConfig(run_dir=str(tmp_path / "run"), time_budget=12.0, resume=True, **fields))
    assert moved["status"] == "unfinished" and moved["global_step"] > 0 and moved["made_progress"] is True
    same_place = train(TrainConfig(run_dir=str(tmp_path / "run"), time_budget=2.0, resume=True, **fields))
    assert same_place["global_step"] == moved["global_step"] and same_place["made_progress"] is False
    # the seconds to the first step are recorded for the one call that trained one, and for no other
    slices = json.loads((tmp_path / "run" / "progress.json").read_text())["slices"]
    assert ["first_step_s" in entry for entry in slices] == [False, False, True, False], slices
    assert 0 < slices[2]["first_step_s"] < 12.0
    # every call records when it began and how long its process had run by then (one process made all four)
    assert [entry["called_at"] for entry in slices] == sorted(entry["called_at"] for entry in slices)
    assert all(0 < slices[0]["process_s"] <= entry["process_s"] for entry in slices), slices


def test_a_folder_in_the_place_of_the_stop_request_is_one_line(tiny_config: Callable[..., TrainConfig]) -> None:
    config = tiny_config(setup="ce")
    (Path(config.run_dir) / time_budget.STOP_FILE).mkdir(parents=True)
    with pytest.raises(ConfigError, match=f"{time_budget.STOP_FILE} is a folder; remove it"):
        train(config)


def test_resuming_says_what_it_cannot_use(tmp_path: Path, fake_clock: Callable[[], None],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # Regression: both cases went on without a word. A stage whose resume point is gone is refused (it used to
    # start again at step 0 with a note, its slices reading as if it had gone on); restart_stage=true restarts it.
    fields = _fields("ce", tmp_path / "data")
    fake_clock()
    stopped = train(TrainConfig(run_dir=str(tmp_path / "run"), time_budget=12.0, **fields))
    assert stopped["status"] == "unfinished" and stopped["global_step"] > 0
    last = tmp_path / "run" / "checkpoints" / "supervised" / "last.ckpt"
    last.unlink()
    capsys.readouterr()
    with pytest.raises(ConfigError, match=f"resume: {last} is missing, but .* records stage supervised at step "
                                          f"{stopped['global_step']}; restore it, pass restart_stage=true"):
        train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **fields))
    again = train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, restart_stage=True, time_budget=12.0,
                              **fields))
    assert again["status"] == "unfinished" and again["global_step"] == stopped["global_step"]  # from step 0
    assert (f"{last} is missing, but {tmp_path / 'run' / 'progress.json'} records stage supervised at step "
            f"{stopped['global_step']}; stage supervised starts again at step 0 (restart_stage=true)"
            ) in capsys.readouterr().err
    restarted = {"slice": 2, "lost_global_step": stopped["global_step"], "last_ckpt": "missing",
                 "by": "restart_stage=true"}
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["stages"]["supervised"]["restarted"] == restarted
    # the restarted stage goes on from its own last.ckpt, and its entry keeps saying that it was restarted
    finished = train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **fields))
    assert finished["status"] == "finished" and "restart" not in capsys.readouterr().err
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["stages"]["supervised"]["restarted"] == restarted and len(progress["slices"]) == 3

    # More epochs for a finished run: its results stay, and so does its config.yaml.
    config_yaml = (tmp_path / "run" / "config.yaml").read_text()
    again = train(TrainConfig(run_dir=str(tmp_path / "run"), resume=True, **{**fields, "max_epochs": 4}))
    assert again == finished
    err = capsys.readouterr().err
    assert "is finished, so max_epochs 2 -> 4 changes nothing: its results stay those of metrics.json" in err, err
    assert (tmp_path / "run" / "config.yaml").read_text() == config_yaml


def test_a_forked_loader_worker_ignores_the_runs_signals(tmp_path: Path, ctrl_c_raises: None) -> None:
    # Found on the way: Ctrl-C in a terminal reaches the DataLoader workers too, which inherit the handler; each
    # printed the line, and a second Ctrl-C ended them, so the loader's teardown raised "worker exited unexpectedly".
    from rpm_lib.training.stop_signals import stop_on_signals

    stop_file = tmp_path / time_budget.STOP_FILE
    with stop_on_signals(stop_file, interactive=True):
        child = os.fork()
        if child == 0:  # the worker: two Ctrl-C, then say whether anything happened
            code = 0
            try:
                for _ in range(2):
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.05)
                code = 3 if stop_file.exists() else 0
            except BaseException:  # noqa: BLE001 - any exception in the worker is the failure
                code = 4
            os._exit(code)
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the worker reacted to the run's signal"
    assert not stop_file.exists()


def test_a_run_dir_that_cannot_be_a_folder_is_one_line(tiny_config: Callable[..., TrainConfig], tmp_path: Path) -> None:
    # Regression: run_dir=/proc/x and run_dir=<a file> gave tracebacks.
    (tmp_path / "a_file").write_text("x")
    for run_dir, expected in ((tmp_path / "a_file", "is a file, not a folder"),
                              (tmp_path / "a_file" / "run", "cannot make the folder")):
        with pytest.raises(ConfigError, match=f"config field 'run_dir': .*{expected}"):
            train(tiny_config(setup="ce", run_dir=str(run_dir)))
