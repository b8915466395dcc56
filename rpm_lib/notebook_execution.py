"""Headless notebook execution with papermill, without its known ways to hang or flood the log.

Every notebook rpm_lib executes (``make demo``, ``rpm-batch``, the test suite) goes through
:func:`execute_notebook`. It runs papermill with an engine of our own, :class:`RpmNotebookEngine`,
which differs from papermill's default ``nbclient`` engine in three places (see ``docs/notebook-execution.md``):

1. **No unbounded wait on a reply the kernel has already sent (or never will).** papermill's client ends every execution with
   ``wait_for_reply(kc.kernel_info())`` and no timeout, only to copy ``language_info`` into the notebook's
   metadata. A ``kernel_info_reply`` that never arrives therefore blocks the caller forever after all
   cells have finished (papermill issue 711). :class:`RpmNotebookClient` waits at most
   ``KERNEL_INFO_TIMEOUT`` seconds for that reply and otherwise writes the kernelspec's language
   (``{"name": "python"}``) as ``language_info``. In the same way, nbclient waits for a cell's
   ``execute_reply`` with no limit even after the kernel has announced on IOPub that the cell is done;
   the client gives such a reply ``EXECUTE_REPLY_AFTER_IDLE_TIMEOUT`` seconds and then rebuilds it from
   the cell's outputs (an ``error`` output makes it an error reply). Cell execution keeps nbclient's own waits, which poll the kernel's
   liveness every few seconds, so a dead kernel is still an error and a long cell is never cut short:
   there is no per-cell timeout unless the caller asks for one.
2. **The kernel's own standard error can go to a file** (``kernel_stderr``): ipykernel's log lines and what
   C libraries write to descriptor 2 (ipykernel copies that into the notebook as well). ``rpm-batch`` and
   ``rpm-notebook`` give each kernel such a file (:func:`kernel_log_of`), so that several kernels do not
   interleave their chatter in one terminal. **The shutdown's interrupt leaves nothing there:** jupyter_client
   sends the kernel SIGINT before asking it to shut down, and papermill shuts down as soon as the reply to its
   final ``kernel_info_request`` arrives, while the kernel is still finishing that request. Depending on
   timing, the interrupt then made ipykernel log "KeyboardInterrupt caught in kernel." or escaped and left a
   tornado "Uncaught exception in ZMQStream callback" traceback, in the log of a run that went well.
   :class:`RpmNotebookClient` also waits (within the same ``KERNEL_INFO_TIMEOUT``) for the kernel's ``idle``
   status after that request; an idle ipykernel ignores SIGINT.
3. **IPC transport.** Kernels listen on Unix-domain sockets in a private runtime folder instead of
   loopback TCP ports. That removes the "Kernel is running over TCP without encryption" warning that
   ipykernel 7 prints at every start, the chance of two kernels racing for the same free port, and
   exposure of unencrypted kernel traffic to other users of the machine.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from queue import Empty
from typing import Any

#: Seconds to wait for the ``kernel_info_reply`` after the last cell (it only fills metadata), and then for
#: the kernel's ``idle`` status after it (so that shutting it down does not interrupt it).
KERNEL_INFO_TIMEOUT = 30
#: Seconds to wait for a cell's ``execute_reply`` once the kernel has reported that cell finished (its
#: ``idle`` status on IOPub). The kernel sends both within milliseconds, so a longer gap means the reply
#: was lost; the reply is then rebuilt from the cell's outputs. A cell that is still running is never
#: given up on: the kernel is busy and this clock has not started.
EXECUTE_REPLY_AFTER_IDLE_TIMEOUT = 30
#: papermill engine name under which :class:`RpmNotebookEngine` is registered.
ENGINE_NAME = "rpm_lib"
#: Kernel transport: ``ipc`` (Unix sockets) or ``tcp`` (papermill's default; set RPM_LIB_KERNEL_TRANSPORT=tcp).
DEFAULT_TRANSPORT = "ipc"

_registered = False


def kernel_log_of(executed_notebook: str | Path) -> Path:
    """Where ``rpm-batch`` and ``rpm-notebook`` have the kernel that executes ``executed_notebook`` write its standard
    error: ``<stem>.kernel.log`` beside it (:func:`execute_notebook` removes it again when nothing was written)."""
    executed_notebook = Path(executed_notebook)
    return executed_notebook.with_name(f"{executed_notebook.stem}.kernel.log")


def _short_runtime_dir() -> str:
    """A private folder for kernel connection files and IPC sockets, with a short path.

    Unix socket paths are limited to ~107 bytes, and the IPC socket names are the connection file's path
    plus a suffix, so a deep home folder or TMPDIR could overflow; /tmp (or the shortest writable folder)
    keeps them short.
    """
    base = "/tmp" if os.access("/tmp", os.W_OK) else tempfile.gettempdir()
    path = Path(base) / f"rpm-kernels-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    path.mkdir(mode=0o700, exist_ok=True)
    return str(path)


def _engine_classes():
    """Build (client, engine) classes lazily: papermill / nbclient take ~2 s to import."""
    from nbclient.client import timestamp
    from nbclient.exceptions import CellTimeoutError
    from nbclient.util import ensure_async, run_sync
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine
    from papermill.log import logger
    from papermill.utils import merge_kwargs, remove_args
    from traitlets.config import Config

    class RpmNotebookClient(PapermillNotebookClient):
        """papermill's client without unbounded waits on replies once the kernel is done (module docstring)."""

        def execute(self, **kwargs: Any):
            self.reset_execution_trackers()
            with self.setup_kernel(**kwargs):
                self.log.info(f"Executing notebook with kernel: {self.kernel_name}")
                self.papermill_execute_cells()
                info = run_sync(self._kernel_info_or_none)()
                if info is not None:
                    self.nb.metadata["language_info"] = info["content"]["language_info"]
                elif "language_info" not in self.nb.metadata:
                    language = self.nb.metadata.get("kernelspec", {}).get("language", "python")
                    self.nb.metadata["language_info"] = {"name": language}
                self.set_widgets_metadata()
            return self.nb

        async def _async_poll_for_reply(self, msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive):
            """nbclient's wait for ``execute_reply``, bounded once the cell is known to be finished."""
            if timeout is not None:  # an explicit per-cell limit: nbclient's own handling
                return await super()._async_poll_for_reply(msg_id, cell, timeout, task_poll_output_msg,
                                                           task_poll_kernel_alive)
            idle_since = None
            while True:
                try:
                    msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=1.0))
                except Empty:
                    if task_poll_output_msg.done():
                        task_poll_output_msg.result()  # re-raise what the IOPub reader raised, if anything
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since > EXECUTE_REPLY_AFTER_IDLE_TIMEOUT:
                            task_poll_kernel_alive.cancel()
                            self.log.warning("cell finished (idle on IOPub) but its execute_reply did not arrive "
                                             "within %s s; rebuilt from its outputs",
                                             EXECUTE_REPLY_AFTER_IDLE_TIMEOUT)
                            return _reply_from_outputs(msg_id, cell)
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if self.record_timing:
                    cell["metadata"]["execution"]["shell.execute_reply"] = timestamp(msg)
                try:
                    await asyncio.wait_for(task_poll_output_msg, self.iopub_timeout)
                except (TimeoutError, Empty):
                    if self.raise_on_iopub_timeout:
                        task_poll_kernel_alive.cancel()
                        raise CellTimeoutError.error_from_timeout_and_cell(
                            "Timeout waiting for IOPub output", self.iopub_timeout, cell) from None
                    self.log.warning("Timeout waiting for IOPub output")
                task_poll_kernel_alive.cancel()
                return msg

        async def _kernel_info_or_none(self) -> dict | None:
            """The ``kernel_info_reply``, or None when none arrives within ``KERNEL_INFO_TIMEOUT`` s.

            Returns only once the kernel has also reported itself idle after that request (or the same
            deadline has passed): the kernel is shut down next, and that must not happen while it is still
            finishing the request (module docstring, point 2).
            """
            msg_id = await ensure_async(self.kc.kernel_info())
            deadline = time.monotonic() + KERNEL_INFO_TIMEOUT
            while (left := deadline - time.monotonic()) > 0:
                try:
                    msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=min(left, 1.0)))
                except Empty:
                    continue
                if msg["parent_header"].get("msg_id") == msg_id:
                    await self._settled_after(msg_id, deadline)
                    return msg
            self.log.warning("no kernel_info_reply within %s s after the last cell; language_info taken "
                             "from the kernelspec", KERNEL_INFO_TIMEOUT)
            return None

        async def _settled_after(self, msg_id: str, deadline: float) -> None:
            """Wait (until ``deadline``, a ``time.monotonic()`` value) for the kernel's ``idle`` status on IOPub
            for request ``msg_id``.

            Why: on shutdown jupyter_client first sends the kernel SIGINT. ipykernel ignores SIGINT while idle,
            but from the start of a request until just before it publishes ``idle`` it turns SIGINT into
            KeyboardInterrupt, and it sends the reply before that window closes. Shutting down as soon as
            the reply arrives (as nbclient does after papermill's final kernel_info) therefore races the
            kernel: the interrupt lands either inside the request handler ("KeyboardInterrupt caught in
            kernel.") or just after it, where nothing catches it: the kernel's main loop then ends in the
            middle of the shutdown, which can leave tracebacks such as tornado's "Uncaught exception in
            ZMQStream callback".
            After ``idle`` the signal is ignored and the kernel shuts down in silence. Cells need no such
            wait: nbclient already waits for each cell's ``idle``.
            """
            while (left := deadline - time.monotonic()) > 0:
                try:
                    msg = await ensure_async(self.kc.iopub_channel.get_msg(timeout=min(left, 1.0)))
                except Empty:
                    continue
                if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                        and msg["content"].get("execution_state") == "idle"):
                    return
            self.log.warning("the kernel did not report idle after kernel_info within %s s; shutting it down "
                             "anyway", KERNEL_INFO_TIMEOUT)

    class RpmNotebookEngine(NBClientEngine):
        """papermill's nbclient engine, executing with :class:`RpmNotebookClient` over IPC sockets."""

        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None,
                                     stderr_file=None, start_timeout=60, execution_timeout=None,
                                     kernel_stderr=None, **kwargs):
            kwargs = remove_args(["input_path"], **kwargs)
            safe_kwargs = remove_args(["timeout", "startup_timeout"], **kwargs)
            transport = os.environ.get("RPM_LIB_KERNEL_TRANSPORT", DEFAULT_TRANSPORT)
            settings: dict[str, Any] = {"transport": transport}
            if transport == "ipc":
                # jupyter_client names IPC sockets "<ip>-<n>" with n = 1, 2, ... and, before the connection
                # file exists, ip = "kernel-ipc" in the working folder: two kernels started at once (rpm-batch
                # --jobs 2) then share sockets and read each other's messages ("Invalid Signature"). A unique
                # absolute prefix per kernel rules that out.
                settings["ip"] = str(Path(os.environ["JUPYTER_RUNTIME_DIR"]) / uuid.uuid4().hex)
            config = Config({"KernelManager": settings})
            final_kwargs = merge_kwargs(
                safe_kwargs,
                timeout=execution_timeout if execution_timeout else kwargs.get("timeout"),
                startup_timeout=start_timeout,
                kernel_name=kernel_name,
                log=logger,
                log_output=log_output,
                stdout_file=stdout_file,
                stderr_file=stderr_file,
            )
            client = RpmNotebookClient(nb_man, config=config, **final_kwargs)
            if kernel_stderr is None:
                return client.execute()
            # start_kernel's keywords reach the kernel's Popen: its descriptor 2 is this file
            with open(kernel_stderr, "ab") as log:
                return client.execute(stderr=log)

    return RpmNotebookClient, RpmNotebookEngine


def _reply_from_outputs(msg_id: str, cell) -> dict:
    """An ``execute_reply`` for ``cell`` built from its outputs: ``error`` if it shows an error output."""
    errors = [output for output in cell.get("outputs", []) if output.get("output_type") == "error"]
    content: dict[str, Any] = {"status": "ok", "execution_count": cell.get("execution_count")}
    if errors:
        content.update(status="error", ename=errors[-1].get("ename", ""), evalue=errors[-1].get("evalue", ""),
                       traceback=list(errors[-1].get("traceback", [])))
    return {"header": {"msg_type": "execute_reply", "date": datetime.now(UTC)},
            "parent_header": {"msg_id": msg_id}, "metadata": {}, "content": content, "msg_type": "execute_reply"}


def register_engine() -> str:
    """Register :class:`RpmNotebookEngine` with papermill (idempotent); returns its name."""
    global _registered
    if not _registered:
        from papermill.engines import papermill_engines

        papermill_engines.register(ENGINE_NAME, _engine_classes()[1])
        _registered = True
    return ENGINE_NAME


def execute_notebook(template: str | Path, out_path: str | Path, parameters: Mapping[str, Any] | None = None, *,
                     kernel_name: str = "python3", cwd: str | Path | None = None,
                     execution_timeout: int | None = None, log_output: bool = False,
                     kernel_stderr: str | Path | None = None) -> Path:
    """Execute ``template`` with papermill into ``out_path`` (parent folders created).

    The kernel is always named (``python3`` = the interpreter that runs this code), the progress bar is
    off, the kernel inherits ``NO_ALBUMENTATIONS_UPDATE=1``, and execution uses :class:`RpmNotebookEngine`
    (bounded final ``kernel_info`` wait, IPC sockets). (Notebooks select the inline matplotlib backend
    themselves, so an inherited ``MPLBACKEND=Agg`` does not hide figures.)

    Args:
        execution_timeout: seconds per cell, or None (default) for no limit: long training cells on slow
            machines must never be cut short; a dead kernel is detected without a timeout.
        kernel_stderr: a file that receives the kernel process's standard error (module docstring, point 2;
            emptied first, removed afterwards if nothing was written), or None (default): the kernel shares this
            process's.

    Raises:
        papermill.PapermillExecutionError: a cell raised; ``out_path`` still holds the executed notebook
            with the traceback.
    """
    import papermill as pm  # 2.5 s import: only when executing

    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", _short_runtime_dir())
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {}
    if execution_timeout is not None:
        kwargs["execution_timeout"] = execution_timeout
    plain = os.environ.get("RPM_LIB_PLAIN_PAPERMILL") == "1"  # papermill's own engine, for the stall bench
    if kernel_stderr is not None and not plain:
        kernel_stderr = Path(kernel_stderr)
        kernel_stderr.unlink(missing_ok=True)  # an earlier execution's log would read as this one's
        kwargs["kernel_stderr"] = str(kernel_stderr)
    try:
        pm.execute_notebook(
            str(template),
            str(out_path),
            parameters=dict(parameters or {}),
            engine_name=None if plain else register_engine(),
            kernel_name=kernel_name,
            progress_bar=False,
            log_output=log_output,
            # saved after each cell (and every 30 s of a long one): a kernel killed mid-cell (the out-of-memory
            # killer, kill -9) still leaves the executed notebook, with the outputs up to then
            request_save_on_cell_execute=True,
            cwd=None if cwd is None else str(cwd),
            **kwargs,
        )
    finally:
        log = kwargs.get("kernel_stderr")
        if log is not None and os.path.isfile(log) and os.path.getsize(log) == 0:
            os.unlink(log)
    return out_path
