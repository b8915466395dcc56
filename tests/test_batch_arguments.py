"""``rpm-batch`` argument errors: each is one line on stderr and exit 2, also when a value holds a line break, and an
empty path is refused instead of being taken as the current folder."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rpm_lib import batch
from rpm_lib.batch.config import SlurmSettings


def test_an_argument_error_stays_one_line_when_the_value_holds_a_line_break(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        batch.main(["--gather", "a\nb"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rpm-batch: error: --gather"), err


@pytest.mark.parametrize("argv", [["progress", ""], ["pack", "", "--out", "s.tar.gz"], ["pack", "runs", "--out", ""],
                                  ["unpack", "", "--out", "runs"], ["unpack", "s.tar.gz", "--out", " "]])
def test_an_empty_path_is_refused_not_taken_as_the_current_folder(argv: list[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # `rpm-batch progress ""` listed the current folder; pack / unpack would have packed or unpacked it
    with pytest.raises(SystemExit) as stopped:
        batch.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "empty path" in err[0], err


# ----------------------------------------------------------------------------------------------
# hostile SLURM settings and numbers: refused in one line before any work (prepare steps, runs, submission)
# ----------------------------------------------------------------------------------------------
INJECTED = "\ntouch INJECTED\n#"
TEMPLATE = Path(__file__).resolve().parents[1] / "notebooks" / "03_train.ipynb"


def _config(tmp_path: Path, **fields: Any) -> Path:
    """A one-run batch whose prepare step would write ``PREPARED`` (JSON is YAML: the strings stay exact)."""
    raw = {"name": "hostile", "template": str(TEMPLATE), "out": str(tmp_path / "out"), "axes": {"seed": [0]},
           "prepare": [{"run": ["python", "-c", f"open({str(tmp_path / 'PREPARED')!r}, 'w')"]}], **fields}
    path = tmp_path / "batch.yaml"
    path.write_text(json.dumps(raw))
    return path


def _refusal(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``rpm-batch argv`` refuses with (exit 2), having started nothing."""
    try:
        code = batch.main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith("rpm-batch: error: ") and len(err[0]) < 400, err
    assert not (tmp_path / "PREPARED").exists() and not (tmp_path / "out").exists()
    return err[0]


def _job_script(config_path: Path, out: Path, settings: Any) -> str:
    """The job script submitit would write for the batch's array (what sbatch reads)."""
    from submitit.slurm.slurm import _make_sbatch_string

    from rpm_lib.batch import slurm

    config = batch.load_batch_config(config_path)
    return _make_sbatch_string(command="python -m rpm_lib.slurm_start", folder=out / "slurm" / "%j", map_count=2,
                               **slurm.sbatch_parameters(config, out, settings))


@pytest.mark.parametrize("fields, argv, named", [
    ({"slurm": {"partition": "gpu" + INJECTED}}, [], "slurm setting 'partition'"),
    ({"slurm": {"account": "lab" + INJECTED}}, [], "slurm setting 'account'"),
    ({"name": "demo" + INJECTED}, [], "'name'"),
    ({"slurm": {"extra": {"qos": "high" + INJECTED}}}, [], "slurm setting 'extra': 'qos'"),
    ({"slurm": {"extra": {"qos" + INJECTED: "high"}}}, [], "slurm setting 'extra': an sbatch option name"),
    ({"slurm": {"extra": {"output": "/tmp/elsewhere"}}}, [], "'output' is set by rpm-batch"),
    ({"slurm": {"extra": {"mem": "0"}}}, [], "'mem' is set by rpm-batch; use the slurm setting 'mem_gb'"),
    ({}, ["--slurm", 'partition="gpu\\ntouch INJECTED\\n#"'], "--slurm: slurm setting 'partition'"),
    ({}, ["--slurm", "extra={qos: \"a\\nb\"}"], "--slurm: slurm setting 'extra': 'qos'"),
    ({"out": "/tmp/batch" + INJECTED}, [], "the batch folder"),
    ({}, ["--out", "/tmp/batch" + INJECTED], "the batch folder"),
], ids=["partition", "account", "name", "extra-value", "extra-key", "extra-reserved", "extra-mem", "--slurm",
        "--slurm-extra", "out", "--out"])
def test_no_value_can_start_a_command_in_the_job_script(fields: dict[str, Any], argv: list[str], named: str,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, **fields)
    for executor in (["--executor", "slurm", "--dry-run"], ["--executor", "slurm"]):
        line = _refusal([str(config), *executor, *argv], tmp_path, capsys)
        assert named in line and ("\\n" in line or "set by rpm-batch" in line), line  # shown escaped
    if "slurm" not in fields and "--slurm" not in argv:
        return  # the name and the folder: below and in test_a_batch_name_made_in_code_cannot_reach_the_job_script
    # the job script itself, from settings made in code (not through the YAML's checks)
    if argv:
        key, value = argv[1].split("=", 1)
        hostile = {key: yaml.safe_load(value)}
    else:
        hostile = fields["slurm"]
    with pytest.raises(batch.BatchConfigError, match=re.escape(named.replace("--slurm: ", ""))) as refused:
        pytest.fail(f"accepted; the job script:\n{_job_script(_config(tmp_path), tmp_path / 'out', SlurmSettings(**hostile))}")
    assert "\n" not in str(refused.value)


def test_a_batch_name_or_folder_made_in_code_cannot_reach_the_job_script(tmp_path: Path) -> None:
    from rpm_lib.batch import slurm

    config = batch.load_batch_config(_config(tmp_path))
    with pytest.raises(batch.BatchConfigError, match="'name'"):
        slurm.sbatch_parameters(dataclasses.replace(config, name="demo" + INJECTED), tmp_path / "out",
                                SlurmSettings())
    with pytest.raises(batch.BatchConfigError, match="the batch folder"):
        slurm.sbatch_parameters(config, tmp_path / ("out" + INJECTED), SlurmSettings())


def test_a_plain_job_script_keeps_its_settings(tmp_path: Path) -> None:
    settings = SlurmSettings(partition="gpu", mem_gb=0.0015, extra={"qos": "high", "exclusive": True})
    script = _job_script(_config(tmp_path), tmp_path / "out", settings)
    lines = script.splitlines()
    assert "#SBATCH --partition=gpu" in lines and "#SBATCH --qos=high" in lines and "#SBATCH --exclusive" in lines
    assert "#SBATCH --mem=2MB" in lines  # rounded up: never below what was asked
    assert "#SBATCH --job-name=rpm-hostile" in lines and "touch INJECTED" not in script


@pytest.mark.parametrize("fields, argv, named", [
    ({}, ["--slurm", "mem_gb=0.0001"], "--slurm: slurm setting 'mem_gb': expected at least 1 MB"),
    ({"slurm": {"mem_gb": 0.0001}}, [], "slurm setting 'mem_gb': expected at least 1 MB"),
    ({}, ["--slurm", "mem_gb=.nan"], "'mem_gb': expected a finite number of GB, got nan"),
    ({}, ["--slurm", "mem_gb=.inf"], "'mem_gb': expected a finite number of GB, got inf"),
    ({}, ["--cuda-devices", ""], "--cuda-devices: empty list ''"),
    ({}, ["--cuda-devices", " "], "--cuda-devices: empty list ' '"),
    ({"slurm": {"extra": {"exclusive": False}}}, [], "leave a flag out instead of setting it false"),
], ids=["mem-cli", "mem-yaml", "nan", "inf", "cuda-empty", "cuda-blank", "extra-false"])
def test_a_silently_wrong_value_is_refused(fields: dict[str, Any], argv: list[str], named: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, **fields)
    for executor in (["--dry-run"], []):  # the local executor too
        assert named in _refusal([str(config), *executor, *argv], tmp_path, capsys)


HUGE = "9" * 5000  # more digits than int() takes: no traceback, and not echoed whole


@pytest.mark.parametrize("argv, named", [
    (["--time-budget", "1e9"], "--time-budget must be at most 2592000 seconds (30 days), got 1e+09"),
    (["--time-budget", "inf"], "--time-budget must be a positive, finite number of seconds, got inf"),
    (["--time-budget", HUGE], "--time-budget must be a positive, finite number of seconds, got inf"),
    (["--time-budget", "x" * 5000], "argument --time-budget: expected a number, got 'xxx"),
    (["--jobs", "0"], "--jobs must be >= 1, got 0"),
    (["--jobs", "5000"], "--jobs must be at most 4096, got 5000"),
    (["--jobs", HUGE], "argument --jobs/-j: expected a whole number, got '999"),
    (["--workers-per-run", "1025"], "argument --workers-per-run: expected a count from 0 to 1024 or 'auto'"),
    (["--workers-per-run", HUGE], "argument --workers-per-run: expected a count from 0 to 1024 or 'auto'"),
    (["--workers-per-run", "-1"], "argument --workers-per-run: expected a count from 0 to 1024 or 'auto'"),
    (["--stall-minutes", "inf"], "--stall-minutes must be at most 43200 (30 days), got inf"),
    (["--slurm", "cpus_per_task=100000"], "'cpus_per_task': expected at most 1024 CPUs, got 100000"),
    (["--slurm", "cpus_per_task=0"], "'cpus_per_task': expected a whole number >= 1, got 0"),
    (["--slurm", "gpus_per_task=-1"], "'gpus_per_task': expected a whole number >= 0, got -1"),
    (["--slurm", "gpus_per_task=65"], "'gpus_per_task': expected at most 64 GPUs, got 65"),
    (["--slurm", f"time_min={HUGE}"], "argument --slurm: 'time_min': not a YAML value (or a number too long): '999"),
    (["--slurm", f"time_min={HUGE[:400]}"], "'time_min': expected at most 43200 minutes, got a number of 400 digits"),
    (["--slurm", "time_min=1.5"], "'time_min': expected a whole number >= 1, got 1.5"),
    (["--slurm", "max_requeues=1000000"], "'max_requeues': expected at most 1000 requeues"),
    (["--slurm", "array_parallelism=0"], "'array_parallelism': expected a whole number >= 1, got 0"),
    (["--slurm", "signal_delay_s=-1"], "'signal_delay_s': expected a whole number >= 0, got -1"),
    (["--slurm", "mem_gb=1e308"], "'mem_gb': expected a number of GB, got '1e308'"),  # YAML 1.1: a string
    (["--slurm", "mem_gb=1.0e+308"], "'mem_gb': expected 0.000976562 to 65536 GB, got 1e+308"),
    (["--slurm", "time_min=1", "--slurm", "signal_delay_s=60"],
     "--slurm: slurm setting 'signal_delay_s' (60 s) must be smaller than 'time_min' (1 min) x 60 = 60 s"),
    (["--slurm", "time_min=1"], "'signal_delay_s' (120 s) must be smaller than 'time_min' (1 min)"),
    (["--slurm", "partition=" + "x" * 5000], "'partition': expected a name"),
    (["--slurm", "partition=["], "argument --slurm: 'partition': not a YAML value (or a number too long): '['"),
], ids=lambda value: str(value)[:40])
def test_every_number_has_a_range(argv: list[str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path)
    for executor in (["--dry-run"], ["--executor", "slurm", "--dry-run"], []):
        line = _refusal([str(config), *executor, *argv], tmp_path, capsys)
        assert named in line, line


def test_a_signal_delay_as_long_as_the_yaml_time_limit_is_refused_at_load(tmp_path: Path) -> None:
    config = _config(tmp_path, slurm={"time_min": 2, "signal_delay_s": 120})
    with pytest.raises(batch.BatchConfigError, match=r"'signal_delay_s' \(120 s\) must be smaller than 'time_min' "
                                                     r"\(2 min\) x 60 = 120 s"):
        batch.load_batch_config(config)
    assert batch.load_batch_config(_config(tmp_path, slurm={"time_min": 2, "signal_delay_s": 119})).slurm


def test_a_number_too_long_for_int_in_the_yaml_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path)
    config.write_text(config.read_text()[:-1] + f', "slurm": {{"time_min": {HUGE}}}}}')
    assert "unreadable value: Exceeds the limit" in _refusal([str(config), "--dry-run"], tmp_path, capsys)


def test_a_slurm_record_naming_its_job_by_a_number_or_nested_deep_reads_as_no_record(tmp_path: Path) -> None:
    # `"job_id": 4242` in a shared folder's slurm.json made `rpm-batch status` end in a TypeError
    from rpm_lib.batch import slurm

    record = tmp_path / slurm.JOB_RECORD
    record.write_text('{"job_id": 4242}')
    assert slurm.job_record(tmp_path) is None
    record.write_text("[" * 100_000 + "]" * 100_000)
    assert slurm.job_record(tmp_path) is None
    record.write_text('{"job_id": "4242"}')
    assert slurm.job_record(tmp_path) == {"job_id": "4242"}
