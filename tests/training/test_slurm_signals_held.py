"""SLURM signals every process of a job, and its SIGUSR2 may come up to a minute before the time limit it announces.
A notebook kernel still starting had no handler yet and died of it ("Kernel died before replying to kernel_info",
seen in tests/test_slurm.py). A SLURM task therefore holds SIGUSR2 and SIGTERM blocked while its kernel runs
(``held_from_the_kernel``), and ``stop_on_signals`` unblocks them while ``train`` runs, turning any that arrived
meanwhile into stop requests. Each test runs in a fresh interpreter: signal masks are per process and thread."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="POSIX signal masks (SLURM runs on Linux)")


def _python(code: str, tmp_path: Path, slurm: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if slurm:
        env["SLURM_JOB_ID"] = "7"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CHILD_MASK = ("import signal; print(sorted(signal.Signals(s).name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])"
              " if s in (signal.SIGUSR2, signal.SIGTERM)))")


def test_a_kernel_started_by_a_slurm_task_inherits_the_stop_signals_blocked_and_the_task_takes_its_own(
        tmp_path: Path) -> None:
    result = _python(f"""
        import json, os, signal, subprocess, sys, threading
        from rpm_lib.training.stop_signals import held_from_the_kernel
        handled = []
        signal.signal(signal.SIGUSR2, lambda *a: handled.append("USR2"))
        with held_from_the_kernel() as arrived:
            child = subprocess.run([sys.executable, "-c", {CHILD_MASK!r}], capture_output=True, text=True).stdout
            # SLURM's early signal, to this task too. Sent to the main thread: one sent to the process may be
            # delivered to any thread that does not block it (the importing of torch started some), and that
            # thread's delivery runs the handler instead, which is what happens in a task too (the run is stopping
            # on the same signal then). The test pins what the block does, whatever the threads.
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)
        after = subprocess.run([sys.executable, "-c", {CHILD_MASK!r}], capture_output=True, text=True).stdout
        print(json.dumps({{"child": child.strip(), "after": after.strip(), "arrived": arrived, "handled": handled}}))
    """, tmp_path)
    assert result["child"] == "['SIGTERM', 'SIGUSR2']"  # the kernel cannot be killed by them before train()
    assert result["after"] == "[]"  # and the task's later children are as before
    # taken, not delivered late: a stop request written after the run would stop the next task's run at once
    assert result["arrived"] == ["SIGUSR2"] and result["handled"] == []


def test_outside_slurm_nothing_is_blocked(tmp_path: Path) -> None:
    result = _python(f"""
        import json, subprocess, sys
        from rpm_lib.training.stop_signals import held_from_the_kernel
        with held_from_the_kernel() as arrived:
            child = subprocess.run([sys.executable, "-c", {CHILD_MASK!r}], capture_output=True, text=True).stdout
        print(json.dumps({{"child": child.strip(), "arrived": arrived}}))
    """, tmp_path, slurm=False)
    assert result == {"child": "[]", "arrived": []}


def test_training_in_a_kernel_started_with_them_blocked_turns_one_that_arrived_early_into_a_stop_request(
        tmp_path: Path) -> None:
    result = _python("""
        import json, os, signal
        # as a SLURM task's kernel starts: blocked before any thread exists (every later thread inherits the mask)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGTERM})
        from pathlib import Path
        from rpm_lib.training.stop_signals import stop_on_signals  # imports torch, which starts threads
        os.kill(os.getpid(), signal.SIGUSR2)  # early, while the kernel was still starting: pending, not fatal
        stop = Path("stop.request")
        with stop_on_signals(stop):
            for _ in range(1000):  # Python runs the handler at its next check
                if stop.exists():
                    break
            requested = stop.exists()
            inside = signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        outside = sorted(signal.Signals(s).name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])
                         if s in (signal.SIGUSR2, signal.SIGTERM))
        print(json.dumps({"requested": requested, "blocked_inside": inside, "blocked_after": outside}))
    """, tmp_path)
    assert result == {"requested": True, "blocked_inside": False, "blocked_after": ["SIGTERM", "SIGUSR2"]}


def test_a_slurm_task_still_loading_its_work_survives_an_early_usr2(tmp_path: Path) -> None:
    import signal
    import time

    # submitit waits up to a minute for the job's pickle to appear: a task still loading, as in its first seconds
    env = {**os.environ, "_TEST_CLUSTER_": "slurm", "SLURM_JOB_ID": "7", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node",
           "SLURMD_NODENAME": "node"}
    task = subprocess.Popen([sys.executable, "-m", "rpm_lib.slurm_start", "-u", "-m", "submitit.core._submit",
                             str(tmp_path)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        time.sleep(3)
        assert task.poll() is None, task.stderr.read().decode()[-2000:]
        task.send_signal(signal.SIGUSR2)
        time.sleep(1)
        assert task.poll() is None  # before: killed by it (srun: "task 0: User defined signal 2")
    finally:
        task.kill()
        task.wait()


def test_the_slurm_start_refuses_arguments_it_does_not_expect_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rpm_lib.slurm_start", "-m", "other"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "rpm_lib.slurm_start: error: expected -u -m submitit.core._submit FOLDER, got -m other"]


def test_slurm_jobs_start_through_it() -> None:
    import inspect

    from rpm_lib.batch import slurm

    assert "-m rpm_lib.slurm_start" in inspect.getsource(slurm.submit)
