"""``bench/gpu_session.sh`` runs only on a lent GPU, where a typo costs a whole session: its shell scripts must
parse, and every TrainConfig override it passes must be a field with a valid value."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rpm_lib.training.config import TrainConfig, parse_overrides

REPO = Path(__file__).resolve().parents[1]
SESSION = REPO / "bench" / "gpu_session.sh"


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "bench").glob("*.sh")))
def test_every_bench_shell_script_parses(script: str) -> None:
    done = subprocess.run(["bash", "-n", str(REPO / "bench" / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _override_sets(text: str) -> list[list[str]]:
    """The key=value words of the script's `common="..."` and `extra="..."` assignments, and of its
    linear_eval_probe.py pretrain command (words computed by the shell are left out)."""
    sets = [shlex.split(value) for value in re.findall(r'\b(?:common|extra)="([^"$]*)"', text)]
    probe = re.search(r'linear_eval_probe\.py pretrain (.*?)>"\$X/pretrain\.json"', text, flags=re.S)
    assert probe, "gpu_session.sh no longer runs linear_eval_probe.py pretrain: update this test"
    words = probe.group(1).replace("\\\n", " ").split()
    sets.append([w for w in words if "=" in w and not w.startswith("-") and "$" not in w])
    return [words for words in sets if words]


def test_every_training_override_in_the_gpu_session_is_a_valid_field() -> None:
    sets = _override_sets(SESSION.read_text())
    assert len(sets) >= 4 and len(sets[-1]) >= 10, sets  # common, the profile variants, the probe's pre-training
    common = next(words for words in sets if any(w.startswith("data_root=") for w in words))
    for words in sets:
        # each variant is used on top of the common settings; ConfigError names a bad field or value
        config = TrainConfig.from_dict(parse_overrides([*common, *words]), source="gpu_session.sh")
        assert config.encoder == "scl"


def test_the_profile_options_of_the_gpu_session_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_training", REPO / "bench" / "profile_training.py")
    profile = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "profile_training", profile)  # its dataclasses look their module up
    spec.loader.exec_module(profile)
    options = re.search(r"\$\{SESSION_PROFILE:-(.*?)\}", SESSION.read_text())
    assert options, "gpu_session.sh no longer profiles with default options: update this test"
    args = profile.parse_args([*options.group(1).split(), "--out", "/tmp/unused", "encoder=scl"])
    assert args.steps >= 1 and set(args.cases) <= set("abcd")


@pytest.mark.parametrize("script", ["gpu_campaign.sh", "gpu_session.sh"])
def test_the_device_scripts_explain_themselves_and_refuse_unknown_arguments(script: str, tmp_path: Path) -> None:
    # Found by hostile testing: `gpu_campaign.sh --help` started the real campaign (70,000 problems into data/).
    # OUT and CAMPAIGN_WORK point into tmp_path so that a regression cannot write into the checkout.
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "CAMPAIGN_WORK": str(tmp_path / "work")}
    shown = subprocess.run(["bash", str(REPO / "bench" / script), "--help"], capture_output=True, text=True,
                           timeout=60, env=env)
    assert shown.returncode == 0 and "device call" in shown.stdout and not shown.stdout.startswith("#"), shown
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
    for wrong in (["--bogus"], ["--cpu-dry-run", "-x"] if script == "gpu_campaign.sh" else ["now"]):
        refused = subprocess.run(["bash", str(REPO / "bench" / script), *wrong], capture_output=True, text=True,
                                 timeout=60, env=env)
        assert refused.returncode == 2, refused
        assert refused.stderr.count("\n") == 1 and "unknown argument" in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_a_warm_machine_installs_the_carried_wheels_once(tmp_path: Path) -> None:
    # A second device call on the same machine found them installed and installed them again (~7 s of a short call).
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "device_env.sh").write_text((REPO / "bench" / "device_env.sh").read_text())
    (repo / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    wheels = repo / ".device" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"one")
    record = tmp_path / "calls.txt"
    stub = tmp_path / "python"
    stub.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {record}\n")
    stub.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(stub), "HOME": str(tmp_path),
           "RPM_DEVICE_SITE": str(tmp_path / "site")}

    def installs() -> tuple[int, str]:
        record.unlink(missing_ok=True)
        done = subprocess.run(["bash", "-c", "source bench/device_env.sh"], cwd=repo, capture_output=True, text=True,
                              timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return sum("pip install" in line for line in record.read_text().splitlines()), done.stderr

    (tmp_path / "site").mkdir()
    assert installs()[0] == 2  # the wheels, then rpm_lib's console scripts
    again, said = installs()
    assert again == 0 and "installed already (a warm machine)" in said
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"two")  # other wheels carried: installed again
    assert installs()[0] == 2


def _session_calls(tmp_path: Path, mps_control: bool = True, data_here: bool = True, baseline: bool = False,
                   **settings: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """Run gpu_session.sh from a copy of its two scripts (no .device there: no wheels, no reference version) with a
    stand-in interpreter and ``rpm-batch`` that record their arguments; returns the run and the recorded calls of
    bench scripts and of ``rpm-batch``.
    ``mps_control``: whether the interpreter finds NVIDIA's MPS control program (``rpm_lib.cuda_mps.find_control``).
    ``data_here``: whether the campaign's data are there already (a warm machine).
    ``baseline``: whether ``.device/baseline`` holds the reference version (``make device-wheels``)."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    for name in ("gpu_session.sh", "device_env.sh"):
        (repo / "bench" / name).write_text((REPO / "bench" / name).read_text())
    if baseline:
        (repo / ".device" / "baseline").mkdir(parents=True)
        (repo / ".device" / "baseline" / "REVISION").write_text("ce69914\n")
    if data_here:
        (repo / "data" / "i-raven-80").mkdir(parents=True)
        (repo / "data" / "i-raven-80" / "manifest.json").write_text("{}")
    record = tmp_path / "calls.txt"
    stub = tmp_path / "python"
    missing = "" if mps_control else 'case "$*" in *find_control*) exit 1;; esac\n'
    stub.write_text(f"#!/bin/sh\n{missing}printf '%s\\n' \"$*\" >> {record}\n")
    stub.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "rpm-batch").write_text(f"#!/bin/sh\nprintf 'rpm-batch %s\\n' \"$*\" >> {record}\n")
    (tmp_path / "bin" / "rpm-batch").chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PYTHON": str(stub), "OUT": str(tmp_path / "out"),
           "HOME": str(tmp_path), "SESSION_CAMPAIGN_SECONDS": "0", **settings}
    done = subprocess.run(["bash", str(repo / "bench" / "gpu_session.sh")], cwd=repo, capture_output=True, text=True,
                          timeout=120, env=env)
    calls = [line.split() for line in record.read_text().splitlines()] if record.is_file() else []
    return done, [call for call in calls if call and (call[0].startswith("bench/") or call[0] == "rpm-batch")]


def test_the_concurrency_part_passes_only_options_the_bench_knows_and_adds_an_mps_round(tmp_path: Path) -> None:
    done, calls = _session_calls(tmp_path, SESSION_SECOND="concurrency", SESSION_CUDA_MPS="1",
                                 SESSION_CONCURRENCY_BUDGET="35", SESSION_SECONDS="1000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [call[0] for call in calls] == ["bench/bench_concurrent_runs.py"] * 2, calls
    assert [call[call.index("--setup") + 1] for call in calls] == ["ce_aux_sparse", "mlcl_aug"]
    assert all("--cuda-mps" in call and call[call.index("--train-budget") + 1] == "35" for call in calls)
    known = subprocess.run([sys.executable, str(REPO / "bench" / "bench_concurrent_runs.py"), "--help"],
                           capture_output=True, text=True, timeout=120).stdout
    for option in {word for call in calls for word in call if word.startswith("--")}:
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", known), option  # "--mps" is not "--cuda-mps"
    # without the reference version: one run, two, two through MPS = three rounds of (35 + 40) s each; where only
    # two fit, the MPS round is left out, and where not even those, the setup
    short, without = _session_calls(tmp_path / "short", SESSION_SECOND="concurrency", SESSION_CUDA_MPS="1",
                                    SESSION_CONCURRENCY_BUDGET="35", SESSION_SECONDS="200")
    # (190 s left, or 189 when the script's clock ticks over a second; 150 of them for MLCL+AUG's two rounds)
    assert re.search(r"concurrency of ce_aux_sparse without its MPS round: (39|40) s for it beside the later "
                     r"setups' rounds, 225 needed with it", short.stdout), short.stdout
    assert without and not any("--cuda-mps" in call for call in without), without
    shorter, skipped = _session_calls(tmp_path / "shorter", SESSION_SECOND="concurrency", SESSION_CUDA_MPS="1",
                                      SESSION_CONCURRENCY_BUDGET="35", SESSION_SECONDS="150")
    assert not skipped and "2 rounds need 150" in shorter.stdout, shorter.stdout


def test_without_the_mps_control_program_the_concurrency_part_keeps_its_other_rounds(tmp_path: Path) -> None:
    # The bench refuses --cuda-mps where NVIDIA's control program is missing (a usage error): passed on such a
    # machine, it would have lost the call's reference, one-run and two-run rounds as well.
    done, calls = _session_calls(tmp_path, mps_control=False, SESSION_SECOND="concurrency", SESSION_CUDA_MPS="1",
                                 SESSION_CONCURRENCY_BUDGET="35", SESSION_SECONDS="1000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no MPS round: nvidia-cuda-mps-control is not on this machine" in done.stdout
    assert len(calls) == 2 and not any("--cuda-mps" in call for call in calls), calls
    # two rounds without the reference version (no .device here) and without MPS: (35 + 40) s each
    short, skipped = _session_calls(tmp_path / "short", mps_control=False, SESSION_SECOND="concurrency",
                                    SESSION_CUDA_MPS="1", SESSION_CONCURRENCY_BUDGET="35", SESSION_SECONDS="150")
    assert not skipped and "2 rounds need 150" in short.stdout, short.stdout


def test_a_call_without_a_slice_on_a_fresh_machine_makes_the_campaign_data_first(tmp_path: Path) -> None:
    # The throughput measurements need the campaign's data; a call without a slice had none on a fresh machine.
    done, calls = _session_calls(tmp_path / "fresh", data_here=False, SESSION_SECOND="concurrency",
                                 SESSION_CONCURRENCY_BUDGET="35", SESSION_SECONDS="1000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls[0] == ["rpm-batch", "configs/table1_scl_gpu.yaml", "--prepare-only"], calls
    assert [call[0] for call in calls[1:]] == ["bench/bench_concurrent_runs.py"] * 2, calls
    assert "the campaign's data made in" in done.stdout
    _, warm = _session_calls(tmp_path / "warm", SESSION_SECOND="concurrency", SESSION_CONCURRENCY_BUDGET="35",
                             SESSION_SECONDS="1000")
    assert all(call[0] != "rpm-batch" for call in warm), warm


def test_the_one_call_throughput_comparison_plans_its_rounds_from_the_counts_of_runs(tmp_path: Path) -> None:
    # the next lent session's first call (docs/reproduction-gpu.md): the reference version, one run, three at once
    # and three at once through MPS, for both setups, on data made in the same call
    done, calls = _session_calls(tmp_path, baseline=True, data_here=False, SESSION_SECOND="concurrency",
                                 SESSION_CUDA_MPS="1", SESSION_CONCURRENCY_BUDGET="30",
                                 SESSION_CONCURRENCY_RUNS="1,3")
    assert done.returncode == 0, done.stdout + done.stderr
    bench = [call for call in calls if call[0] == "bench/bench_concurrent_runs.py"]
    assert len(bench) == 2 and calls[0][0] == "rpm-batch", calls
    for call in bench:
        assert call[call.index("--runs") + 1] == "1,3" and call[call.index("--train-budget") + 1] == "30"
        assert call[call.index("--baseline-code") + 1] == ".device/baseline" and "--cuda-mps" in call
    # four rounds of (30 + 40) s: the reference, one run, three, three through MPS; without MPS three
    _, tight = _session_calls(tmp_path / "tight", baseline=True, SESSION_SECOND="concurrency", SESSION_CUDA_MPS="1",
                              SESSION_CONCURRENCY_BUDGET="30", SESSION_CONCURRENCY_RUNS="1,3", SESSION_SECONDS="230")
    assert len(tight) == 2 and not any("--cuda-mps" in call for call in tight), tight
    _, none = _session_calls(tmp_path / "none", baseline=True, SESSION_SECOND="concurrency", SESSION_CUDA_MPS="1",
                             SESSION_CONCURRENCY_BUDGET="30", SESSION_CONCURRENCY_RUNS="1,3", SESSION_SECONDS="219")
    assert none == [], none


def test_an_mps_round_never_crowds_out_a_later_setup(tmp_path: Path) -> None:
    # 440 s: CE+AUX-sparse with its MPS round (4 rounds of 70 s) would leave MLCL+AUG 160 s, less than its 3 rounds
    _, calls = _session_calls(tmp_path, baseline=True, SESSION_SECOND="concurrency", SESSION_CUDA_MPS="1",
                              SESSION_CONCURRENCY_BUDGET="30", SESSION_CONCURRENCY_RUNS="1,3", SESSION_SECONDS="450")
    assert [call[call.index("--setup") + 1] for call in calls] == ["ce_aux_sparse", "mlcl_aug"], calls
    assert "--cuda-mps" not in calls[0] and "--cuda-mps" in calls[1], calls  # the last setup has no one after it
