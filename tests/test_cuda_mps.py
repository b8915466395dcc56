"""``rpm_lib.cuda_mps`` (a private CUDA MPS daemon for runs sharing one GPU), ``rpm-batch --cuda-mps`` and the
MPS rounds of ``experiments/concurrency/bench_concurrent_runs.py`` (their arguments and environment: the experiment
is a record of the commit it was measured at and is not run end to end here), against a stand-in for NVIDIA's
control program: no GPU here, so what is checked is our side of it: the daemon is started with private folders, its
clients get those folders, it is always told to quit, the clients are counted from its log, and a missing or
failing daemon is one line."""
from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rpm_lib import batch, cuda_mps as mps

REPO = Path(__file__).resolve().parents[1]

#: The stand-in control program: ``-d`` starts a "daemon" (a file standing for its socket in the pipe folder, a line
#: in control.log); without arguments it reads one command; every call is appended to $FAKE_MPS_RECORD.
FAKE_CONTROL = textwrap.dedent('''\
    import os, sys
    from pathlib import Path
    pipe, log = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"]), Path(os.environ["CUDA_MPS_LOG_DIRECTORY"])
    record = Path(os.environ["FAKE_MPS_RECORD"])
    def note(text):
        with record.open("a") as f:
            f.write(text + "\\n")
    if sys.argv[1:] == ["-d"]:
        if os.environ.get("FAKE_MPS_FAIL"):
            print("An instance of this daemon is already running", file=sys.stderr)
            sys.exit(1)
        (pipe / "control").write_text("socket")
        with (log / "control.log").open("a") as f:
            f.write("[2026-11-28 00:00:00.000 Control 1] Starting control daemon\\n")
        note(f"start {pipe} {log}")
        sys.exit(0)
    command = sys.stdin.readline().strip()
    if not (pipe / "control").exists():
        print("Cannot find MPS control daemon process", file=sys.stderr)
        sys.exit(1)
    note(command)
    if command == "quit":
        (pipe / "control").unlink()
    ''')


@pytest.fixture
def fake_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``nvidia-cuda-mps-control`` first on PATH; returns the file its calls are recorded in."""
    folder = tmp_path / "driver-bin"
    folder.mkdir()
    script = folder / mps.CONTROL
    script.write_text(f"#!{sys.executable}\n" + FAKE_CONTROL)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "calls.txt"
    record.touch()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    return record


@pytest.fixture
def short_folder() -> Iterator[Path]:
    """A folder for the daemon: its socket path must stay short, and pytest's tmp_path may be long."""
    folder = Path(tempfile.mkdtemp(prefix="mps-test-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_no_control_program_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(mps, "DRIVER_FOLDERS", (str(tmp_path / "nothing"),))
    with pytest.raises(mps.MpsUnavailable) as raised:
        mps.find_control()
    assert "\n" not in str(raised.value) and mps.CONTROL in str(raised.value)


def test_the_daemon_gets_private_folders_and_is_told_to_quit_even_when_the_block_fails(
        fake_control: Path, short_folder: Path) -> None:
    folder = short_folder
    with pytest.raises(KeyError):
        with mps.mps_daemon(folder) as daemon:
            assert daemon.env == {mps.PIPE_VARIABLE: str(folder / "pipe"), mps.LOG_VARIABLE: str(folder / "log")}
            assert (folder / "pipe" / "control").exists()
            raise KeyError("the runs broke")
    calls = fake_control.read_text().splitlines()
    assert calls[0] == f"start {folder / 'pipe'} {folder / 'log'}"
    assert "get_server_list" in calls and calls[-1] == "quit"
    assert not (folder / "pipe" / "control").exists()


def test_a_daemon_that_will_not_start_is_one_line_with_its_own_message(
        fake_control: Path, short_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.raises(mps.MpsUnavailable) as raised:
        with mps.mps_daemon(short_folder):
            pytest.fail("the block must not run")
    assert "exited with status 1: An instance of this daemon is already running" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_private_daemon_lives_in_a_short_folder_that_is_removed_afterwards(fake_control: Path) -> None:
    with mps.private_mps_daemon() as daemon:
        folder = daemon.pipe_dir.parent
        assert folder.is_dir() and len(str(daemon.pipe_dir)) <= 90
    assert not folder.exists() and fake_control.read_text().splitlines()[-1] == "quit"


def test_a_socket_path_too_long_is_one_line(fake_control: Path, tmp_path: Path) -> None:
    with pytest.raises(mps.MpsUnavailable, match="too long a path .* shorter TMPDIR"):
        with mps.mps_daemon(tmp_path / ("x" * 100)):
            pytest.fail("the block must not run")


def test_clients_and_a_failed_server_are_read_from_the_logs(tmp_path: Path) -> None:
    daemon = mps.MpsDaemon("control", tmp_path / "pipe", tmp_path / "log")
    assert daemon.clients() == 0 and daemon.server_failure() is None
    (tmp_path / "log" / "server").mkdir(parents=True)
    (tmp_path / "log" / "control.log").write_text(
        "[2026-11-28 01:00:00.000 Control 7] Starting new server 9 for user 0\n"
        "[2026-11-28 01:00:00.100 Control 7] NEW CLIENT 11 from user 0: Server is not ready, push client to pending\n"
        "[2026-11-28 01:00:01.000 Control 7] NEW SERVER 9: Ready\n"
        "[2026-11-28 01:00:02.000 Control 7] NEW CLIENT 12 from user 0: Server already exists\n")
    (tmp_path / "log" / "server" / "server.log").write_text(
        "[2026-11-28 01:00:00.500 Server 9] MPS server failed to start\n")
    assert daemon.clients() == 2
    assert daemon.server_failure() == "[2026-11-28 01:00:00.500 Server 9] MPS server failed to start"


def _env_template(path: Path) -> Path:
    """A template notebook that writes the MPS pipe folder its kernel sees into its output folder."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    parameters = nbformat.v4.new_code_cell('run_dir: str = ""\noutput_dir: str = ""\nseed: int = 0')
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, nbformat.v4.new_code_cell(
        "import os, json\nfrom pathlib import Path\nPath(run_dir).mkdir(parents=True, exist_ok=True)\n"
        "Path(run_dir, 'seen.txt').write_text(os.environ.get('CUDA_MPS_PIPE_DIRECTORY', 'none'))\n"
        "Path(run_dir, 'metrics.json').write_text(\n"
        "    json.dumps({'test_accuracy': 0.5, 'encoder': 'scl', 'setup': 'ce'}))")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_rpm_batch_mps_gives_every_run_the_daemon_and_says_how_many_connected(
        fake_control: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = _env_template(tmp_path / "t.ipynb")
    config = tmp_path / "b.yaml"
    config.write_text(f"template: {template}\nout: {tmp_path / 'out'}\naxes: {{seed: [0, 1]}}\n")
    assert batch.main([str(config), "--jobs", "2", "--cuda-mps", "--quiet"]) == 0
    seen = {p.parent.name: p.read_text() for p in (tmp_path / "out").rglob("seen.txt")}
    assert len(seen) == 2 and len(set(seen.values())) == 1
    pipe = next(iter(seen.values()))
    assert pipe.endswith("/pipe") and "rpm-mps-" in pipe
    assert fake_control.read_text().splitlines()[-1] == "quit"
    assert not Path(pipe).exists()  # the private folder is removed afterwards
    # the stand-in has no server, so no run connected: said, not hidden, even with --quiet
    assert "rpm-batch: warning: MPS: no process connected to the daemon" in capsys.readouterr().err
    assert mps.PIPE_VARIABLE not in os.environ


def test_rpm_batch_mps_without_a_daemon_or_on_slurm_is_one_line_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    template = _env_template(tmp_path / "t.ipynb")
    config = tmp_path / "b.yaml"
    marker = tmp_path / "prepared"
    config.write_text(f"template: {template}\nout: {tmp_path / 'out'}\naxes: {{seed: [0]}}\n"
                      f"prepare:\n  - run: [touch, {marker}]\n")
    monkeypatch.setattr(mps, "DRIVER_FOLDERS", (str(tmp_path / "nothing"),))
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not (Path(p) / mps.CONTROL).exists()))
    assert batch.main([str(config), "--cuda-mps"]) == 2
    assert batch.main([str(config), "--cuda-mps", "--executor", "slurm"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 2 and all(line.startswith("rpm-batch: error: ") for line in errors)
    assert mps.CONTROL in errors[0] and "local runs only" in errors[1]
    assert not marker.exists() and not (tmp_path / "out").exists()


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_concurrent_runs",
                                                  REPO / "experiments" / "concurrency" / "bench_concurrent_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_mps_round_passes_the_daemon_environment_to_each_process(
        fake_control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _bench_module()
    seen: list[dict[str, str]] = []

    def fake_processes(count, args, data, out, code, label, extra_env, prefix=None):
        seen.append(dict(extra_env))
        return {"code": label, "runs": count, "rpms_per_s_per_run": [1.0] * count, "aggregate_rpms_per_s": count,
                "failed": []}

    monkeypatch.setattr(module, "_run_processes", fake_processes)
    row = module.run_together(2, None, "data", tmp_path, None, module.THIS_VERSION_MPS, mps=True)
    assert set(seen[0]) == {mps.PIPE_VARIABLE, mps.LOG_VARIABLE} and row["mps_clients"] == 0
    module.run_together(2, None, "data", tmp_path, None, module.THIS_VERSION, mps=False)
    assert seen[1] == {}


def test_bench_mps_without_a_daemon_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # in this process, so that the driver folders can be emptied whatever this machine has installed
    module = _bench_module()
    monkeypatch.setattr(mps, "DRIVER_FOLDERS", (str(tmp_path / "nothing"),))
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not (Path(p) / mps.CONTROL).exists()))
    for extra, said in (([], "--cuda-mps: "), (["--runs", "1"], "has no count above one")):
        with pytest.raises(SystemExit) as exited:
            module.main(["--cpu-dry-run", "--cuda-mps", "--out", str(tmp_path / "out"), *extra])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and said in err.strip().splitlines()[-1], err
