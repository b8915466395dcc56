"""The shell scripts of ``tools/`` run on a GPU machine that may be offline and time-limited, where a typo costs the
machine's whole time: they must parse, explain themselves, refuse unknown arguments, and install the carried wheels
once per machine."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"


@pytest.mark.parametrize("script", sorted(p.relative_to(TOOLS).as_posix() for p in TOOLS.rglob("*.sh")))
def test_every_tools_shell_script_parses(script: str) -> None:
    done = subprocess.run(["bash", "-n", str(TOOLS / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_campaign_slice_explains_itself_and_refuses_unknown_arguments(tmp_path: Path) -> None:
    # Regression: `--help` started the real campaign (70,000 problems into data/).
    # CAMPAIGN_OUT and CAMPAIGN_WORK point into tmp_path so that a regression cannot write into the checkout.
    script = str(TOOLS / "campaign" / "gpu_slice.sh")
    env = {"PATH": "/usr/bin:/bin", "CAMPAIGN_OUT": str(tmp_path / "out"), "CAMPAIGN_WORK": str(tmp_path / "work")}
    shown = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert shown.returncode == 0 and "GPU machine" in shown.stdout and not shown.stdout.startswith("#"), shown
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
    for wrong in (["--bogus"], ["--cpu-dry-run", "-x"]):
        refused = subprocess.run(["bash", script, *wrong], capture_output=True, text=True, timeout=60, env=env)
        assert refused.returncode == 2, refused
        assert refused.stderr.count("\n") == 1 and "unknown argument" in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_a_warm_machine_installs_the_carried_wheels_once(tmp_path: Path) -> None:
    # A second run on the same machine found them installed and installed them again (~7 s of a short slice).
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    (repo / "tools" / "gpu_env.sh").write_text((TOOLS / "gpu_env.sh").read_text())
    (repo / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    wheels = repo / ".gpu" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"one")
    record = tmp_path / "calls.txt"
    stub = tmp_path / "python"
    stub.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {record}\n")
    stub.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(stub), "HOME": str(tmp_path),
           "RPM_GPU_SITE": str(tmp_path / "site")}

    def installs() -> tuple[int, str]:
        record.unlink(missing_ok=True)
        done = subprocess.run(["bash", "-c", "source tools/gpu_env.sh"], cwd=repo, capture_output=True, text=True,
                              timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return sum("pip install" in line for line in record.read_text().splitlines()), done.stderr

    (tmp_path / "site").mkdir()
    assert installs()[0] == 2  # the wheels, then rpm_lib's console scripts
    again, said = installs()
    assert again == 0 and "installed already (a warm machine)" in said
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"two")  # other wheels carried: installed again
    assert installs()[0] == 2
