"""rpm_lib.notebook_execution: no unbounded wait after the last cell, no TCP warning, long cells not cut short."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from rpm_lib import notebook_execution

REPO = Path(__file__).resolve().parents[1]

#: The last cell makes the kernel ignore every later kernel_info_request: the reply papermill's own client
#: waits for without a timeout after the last cell (the hang of papermill issue 711) never comes.
DROP_KERNEL_INFO = (
    "kernel = get_ipython().kernel\n"
    "async def _ignore(*args, **kwargs):\n"
    "    return None\n"
    "kernel.shell_handlers['kernel_info_request'] = _ignore\n"
    "print('cells done', value)\n"
)


def _notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("value: int = 0", metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(cell) for cell in cells]
    nbformat.write(nb, path)
    return path


def test_a_kernel_info_reply_that_never_comes_does_not_block(tmp_path, monkeypatch):
    monkeypatch.setattr(notebook_execution, "KERNEL_INFO_TIMEOUT", 2)
    template = _notebook(tmp_path / "drop.ipynb", DROP_KERNEL_INFO)
    began = time.perf_counter()
    out = notebook_execution.execute_notebook(template, tmp_path / "out.ipynb", {"value": 7})
    assert time.perf_counter() - began < 60
    executed = nbformat.read(out, as_version=4)
    assert executed.cells[-1].outputs[0]["text"] == "cells done 7\n"
    assert executed.metadata["language_info"]["name"] == "python"  # from the kernelspec


def test_kernels_start_without_the_tcp_warning(tmp_path):
    template = _notebook(tmp_path / "tiny.ipynb", "print('hello', value)")
    script = (f"from rpm_lib.notebook_execution import execute_notebook\n"
              f"execute_notebook({str(template)!r}, {str(tmp_path / 'out.ipynb')!r}, {{'value': 1}})\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "without encryption" not in done.stderr and "[IPKernelApp] WARNING" not in done.stderr, done.stderr
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert executed.cells[-1].outputs[0]["text"] == "hello 1\n"


def test_a_cell_longer_than_every_internal_poll_runs_to_the_end(tmp_path, monkeypatch):
    """With no execution_timeout a slow cell is waited for (nbclient polls liveness, it does not give up)."""
    monkeypatch.setattr(notebook_execution, "KERNEL_INFO_TIMEOUT", 1)
    template = _notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(7)\nprint('slept', value)")
    out = notebook_execution.execute_notebook(template, tmp_path / "out.ipynb", {"value": 3})
    assert nbformat.read(out, as_version=4).cells[-1].outputs[0]["text"] == "slept 3\n"


def test_a_cell_error_still_raises_with_the_executed_notebook_written(tmp_path):
    import papermill

    template = _notebook(tmp_path / "bad.ipynb", "raise ValueError('bad value')")
    with pytest.raises(papermill.PapermillExecutionError, match="bad value"):
        notebook_execution.execute_notebook(template, tmp_path / "out.ipynb")
    assert (tmp_path / "out.ipynb").is_file()


#: The cell widens, to 2 s after every reply, the window in which ipykernel turns SIGINT into KeyboardInterrupt
#: (from a request's start until its ``idle`` status; normally microseconds after the reply). jupyter_client
#: sends SIGINT when it shuts a kernel down; landing in that window it used to put "KeyboardInterrupt caught in
#: kernel." or a ZMQStream traceback into the kernel's log now and then. Here it would land there every time,
#: and the cell writes what it caught to descriptor 2 (the kernel log) before letting it go on.
SLOW_TO_SETTLE = (
    "import os, time, traceback\n"
    "kernel = get_ipython().kernel\n"
    "_settle = kernel.post_handler_hook\n"
    "def _slow_to_settle():\n"
    "    try:\n"
    "        time.sleep(2)\n"
    "    except KeyboardInterrupt:\n"
    "        os.write(2, ('interrupted before idle:\\n' + traceback.format_exc()).encode())\n"
    "        raise\n"
    "    finally:\n"
    "        _settle()\n"
    "kernel.post_handler_hook = _slow_to_settle\n"
    "print('settling slowly', value)\n"
)


def test_shutting_the_kernel_down_leaves_nothing_in_the_kernel_log(tmp_path):
    log = tmp_path / "out.kernel.log"
    template = _notebook(tmp_path / "slow.ipynb", "import os\nos.write(2, b'a cell wrote this\\n')", SLOW_TO_SETTLE)
    out = notebook_execution.execute_notebook(template, tmp_path / "out.ipynb", {"value": 4}, kernel_stderr=log)
    assert nbformat.read(out, as_version=4).cells[-1].outputs[0]["text"] == "settling slowly 4\n"
    assert log.read_text() == "a cell wrote this\n"  # what cells write stays; nothing from the shutdown


#: The cell makes the kernel drop its own execute_reply (once): the kernel reports the cell done on IOPub,
#: but the reply nbclient waits for without a limit never comes.
DROP_EXECUTE_REPLY = (
    "kernel = get_ipython().kernel\n"
    "_send = kernel.session.send\n"
    "def _drop_one_reply(stream, msg_or_type, *args, **kwargs):\n"
    "    if msg_or_type == 'execute_reply' and not getattr(kernel, '_dropped', False):\n"
    "        kernel._dropped = True\n"
    "        content = kwargs.get('content', args[0] if args else None)\n"
    "        return kernel.session.msg('execute_reply', content=content)  # built, never sent\n"
    "    return _send(stream, msg_or_type, *args, **kwargs)\n"
    "kernel.session.send = _drop_one_reply\n"
    "print('dropping', value)\n"
)


@pytest.mark.parametrize("fails", [False, True])
def test_a_lost_execute_reply_is_rebuilt_from_the_cell_outputs(tmp_path, monkeypatch, fails):
    import papermill

    monkeypatch.setattr(notebook_execution, "EXECUTE_REPLY_AFTER_IDLE_TIMEOUT", 2)
    cells = [DROP_EXECUTE_REPLY, "print('next cell ran')"]
    if fails:
        cells[0] += "raise RuntimeError('the cell failed')\n"
    template = _notebook(tmp_path / "drop.ipynb", *cells)
    began = time.perf_counter()
    if fails:
        with pytest.raises(papermill.PapermillExecutionError, match="the cell failed"):
            notebook_execution.execute_notebook(template, tmp_path / "out.ipynb", {"value": 2})
    else:
        notebook_execution.execute_notebook(template, tmp_path / "out.ipynb", {"value": 2})
    assert time.perf_counter() - began < 60
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert executed.cells[-2].outputs[0]["text"] == "dropping 2\n"
    assert (executed.cells[-1].get("outputs") or [{}])[0].get("text") == (None if fails else "next cell ran\n")


def test_parallel_kernels_over_ipc_do_not_share_sockets(tmp_path):
    """Two processes starting kernels at the same moment each talk to their own kernel."""
    template = _notebook(tmp_path / "tiny.ipynb", "import os\nprint(value, os.getpid())")
    script = ("import sys\nfrom rpm_lib.notebook_execution import execute_notebook\n"
              "for i in range(3):\n"
              f"    execute_notebook({str(template)!r}, f'{tmp_path}/out-{{sys.argv[1]}}-{{i}}.ipynb', "
              "{'value': int(sys.argv[1])})\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(k)], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
             for k in (1, 2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    for k in (1, 2):
        for i in range(3):
            text = nbformat.read(tmp_path / f"out-{k}-{i}.ipynb", as_version=4).cells[-1].outputs[0]["text"]
            assert text.split()[0] == str(k)
    assert not list(tmp_path.glob("kernel-ipc*"))  # no sockets in the working folder
