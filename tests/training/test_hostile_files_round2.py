"""Hostile files a run reads (issue 22): a checkpoint that is not one, a truncated one, a progress.json of the wrong
shape, an .npz header that promises more than its file holds, a data folder of other generator settings. Each is
one line naming the file (or field); none is a traceback, and none suggests loading an untrusted pickle."""
from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from rpm_lib.data import DataFormatError
from rpm_lib.data.npz import read_npz
from rpm_lib.training import ConfigError, TrainConfig
from rpm_lib.training.cli import main as rpm_train
from rpm_lib.training.run import train


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


@pytest.mark.parametrize("content", ["[1, 2]", '{"stages": [1]}', '{"stages": {"supervised": 3}}'])
def test_a_progress_file_of_the_wrong_shape_is_one_line(tiny_config: Callable[..., TrainConfig], content: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    resumed = _stopped_run(tiny_config)
    progress = Path(resumed.run_dir) / "progress.json"
    progress.write_text(content)
    with pytest.raises(ConfigError, match=f"{progress}: (expected a JSON object|field 'stages')"):
        train(resumed)


def test_an_npz_header_promising_more_than_the_file_is_refused_before_allocation(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f8", "fortran_order": False,
                                                  "shape": (60_000, 60_000, 2)})  # 53 GiB promised
    buffer.write(b"\0" * 64)
    path = tmp_path / "RAVEN_0_train.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("image.npy", buffer.getvalue())
    with pytest.raises(DataFormatError, match=r"member 'image' claims \(60000, 60000, 2\) float64 "
                                              r"\(57600000000 bytes\) but holds"):
        read_npz(path, ("image",))


def test_a_data_folder_of_another_regime_is_one_line_from_rpm_train(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "a-color"
    common = [f"data_root={data}", "generate=true", "generate_num_per_config=10", "setup=ce", "max_steps=1",
              "max_epochs=1", "batch_size=2", "progress_bar=false", "image_size=32"]
    assert rpm_train([*common, f"run_dir={tmp_path / 'a'}", "generate_regime=A/Color"]) == 0
    capsys.readouterr()
    assert rpm_train([*common, f"run_dir={tmp_path / 'b'}"]) == 2  # the same folder, asked for plain I-RAVEN
    err = capsys.readouterr().err.strip()
    assert err.startswith("rpm-train: error: config field 'data_root': ") and "\n" not in err, err
