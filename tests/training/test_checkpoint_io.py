"""Checkpoints are written beside their target and renamed into place: a kill never leaves a half-written one, and
a stale ``.partial`` left by an earlier kill (a symbolic link, a read-only file) or a folder where the checkpoint
goes never makes a save write elsewhere or fail without naming the file."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rpm_lib.training.checkpoint_io import PARTIAL_SUFFIX, SameFolderCheckpointIO
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.run import train


def test_a_run_writes_its_checkpoints_without_the_system_temporary_folder(
        tiny_config: Callable[..., TrainConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's own writer goes through tempfile.mkstemp (a file in /tmp, then a move that is a copy across
    # filesystems); here that path is closed, so the run only finishes when its checkpoints bypass it.
    def no_system_temporary_file(*args: object, **kwargs: object) -> tuple[int, str]:
        raise AssertionError("a checkpoint went through the system temporary folder")

    monkeypatch.setattr(tempfile, "mkstemp", no_system_temporary_file)
    config = tiny_config(setup="ce_aux_sparse")
    train(config)
    stage = Path(config.run_dir) / "checkpoints" / "supervised"
    assert (stage / "last.ckpt").is_file() and (stage / "best.ckpt").is_file()
    assert not list(stage.glob(f"*{PARTIAL_SUFFIX}"))


def test_storage_options_are_refused_as_lightning_refuses_them(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="storage_options"):
        SameFolderCheckpointIO().save_checkpoint({"a": 1}, tmp_path / "x.ckpt", storage_options={"b": 2})


_WRITER = textwrap.dedent("""
    import sys, torch
    from rpm_lib.training.checkpoint_io import SameFolderCheckpointIO
    target, ready = sys.argv[1], sys.argv[2]
    io = SameFolderCheckpointIO()
    round = 0
    while True:
        round += 1
        io.save_checkpoint({"round": round, "weights": torch.full((6_000_000,), float(round))}, target)
        if round == 1:
            open(ready, "w").close()
""")


@pytest.mark.parametrize("delay", [0.05, 0.13, 0.21, 0.37])
def test_a_writer_killed_at_any_moment_leaves_a_whole_checkpoint(tmp_path: Path, delay: float) -> None:
    """SIGKILL (a scheduler past its grace period, the out-of-memory killer) during a stream of 24 MB saves."""
    target, ready = tmp_path / "last.ckpt", tmp_path / "ready"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), str(ready)])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert writer.poll() is None, "the writer ended before its first save"
            assert time.monotonic() < deadline, "the writer made no save in 120 s"
            time.sleep(0.01)
        time.sleep(delay)
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    checkpoint = torch.load(target, weights_only=True)
    assert checkpoint["round"] >= 1
    assert torch.equal(checkpoint["weights"], torch.full((6_000_000,), float(checkpoint["round"])))


def test_a_disk_that_fills_up_during_a_save_is_one_line_and_keeps_the_last_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    from rpm_lib.training import checkpoint_io, cli

    fields = dict(data_root=str(tmp_path / "data"), generate=True, generate_num_per_config=10, generate_seed=3,
                  progress_bar=False, setup="ce", encoder="scl", batch_size=4, max_epochs=2, max_train_samples=16,
                  max_val_samples=4, max_test_samples=6, image_size=32, run_dir=str(tmp_path / "run"))
    TrainConfig(**fields).to_yaml(tmp_path / "run.yaml")
    real_save, saves, refused = torch.save, [], []

    def save_until_the_disk_is_full(checkpoint: dict, handle: object) -> None:
        saves.append(checkpoint["global_step"])
        if len(saves) > 2:  # epoch 1's best and last went through; epoch 2's first save meets a full disk
            refused.append(Path(handle.name))  # type: ignore[attr-defined]
            handle.write(b"half a checkpoint")  # type: ignore[attr-defined]
            raise OSError(errno.ENOSPC, "No space left on device", str(handle.name))  # type: ignore[attr-defined]
        real_save(checkpoint, handle)

    monkeypatch.setattr(checkpoint_io.torch, "save", save_until_the_disk_is_full)
    assert cli.main(["--config", str(tmp_path / "run.yaml")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    stage = tmp_path / "run" / "checkpoints" / "supervised"
    # Epoch 2's first save is best.ckpt where its validation loss improved, else last.ckpt: which one depends on the
    # CPU's rounding, so the message is checked against the file the save was writing.
    assert refused[0] in (stage / "best.ckpt.partial", stage / "last.ckpt.partial"), refused
    assert err[-1] == (f"rpm-train: error: {refused[0]}: No space left on device; the checkpoints "
                       f"written so far stay in {tmp_path / 'run'}: rerun with resume=true once that is fixed"), err
    assert not any("Traceback" in line for line in err), err
    assert not list(stage.glob(f"*{PARTIAL_SUFFIX}"))  # the half-written file does not keep the disk full
    assert torch.load(stage / "last.ckpt", weights_only=True)["global_step"] == saves[0]  # epoch 1's, whole

    monkeypatch.setattr(checkpoint_io.torch, "save", real_save)  # space freed
    assert cli.main(["--config", str(tmp_path / "run.yaml"), "resume=true"]) == 0
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_a_stale_partial_that_is_a_symlink_is_not_written_through(tmp_path: Path) -> None:
    import torch

    from rpm_lib.training.checkpoint_io import SameFolderCheckpointIO

    victim = tmp_path / "thesis.tex"
    victim.write_text("my thesis\n")
    stage = tmp_path / "run" / "checkpoints" / "supervised"
    stage.mkdir(parents=True)
    (stage / "last.ckpt.partial").symlink_to(victim)
    SameFolderCheckpointIO().save_checkpoint({"step": 3}, stage / "last.ckpt")
    assert victim.read_text() == "my thesis\n"
    assert not (stage / "last.ckpt").is_symlink()
    assert torch.load(stage / "last.ckpt", weights_only=True) == {"step": 3}


_READ_ONLY_PARTIAL = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from rpm_lib.training.checkpoint_io import SameFolderCheckpointIO
    stage = Path(sys.argv[1])
    SameFolderCheckpointIO().save_checkpoint({"step": 3}, stage / "last.ckpt")
    print("saved")
""")


def test_a_stale_read_only_partial_does_not_fail_the_save(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "last.ckpt.partial").write_bytes(b"left by a kill")
    os.chmod(stage / "last.ckpt.partial", 0o444)
    command = [sys.executable, "-c", _READ_ONLY_PARTIAL, str(stage)]
    if os.geteuid() == 0:  # root writes read-only files anyway: drop the capability that lets it
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        command = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"})
    assert done.returncode == 0 and "saved" in done.stdout, done.stderr[-800:]
    assert (stage / "last.ckpt").is_file() and not (stage / "last.ckpt.partial").exists()


def test_a_folder_where_last_ckpt_goes_is_named_in_the_error(tmp_path: Path) -> None:
    from rpm_lib.training.checkpoint_io import SameFolderCheckpointIO

    (tmp_path / "last.ckpt").mkdir()
    with pytest.raises(OSError) as caught:
        SameFolderCheckpointIO().save_checkpoint({"step": 3}, tmp_path / "last.ckpt")
    # it named last.ckpt.partial, which the user cannot find (it is removed on the way out)
    assert caught.value.filename == str(tmp_path / "last.ckpt"), caught.value
    assert not (tmp_path / "last.ckpt.partial").exists()
