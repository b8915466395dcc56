"""A JupyterLab server and a headless Chromium page on it, for the browser tests (tests/browser/).

The system Chromium (Debian package ``chromium``) is driven by Playwright for Python; no browser is
downloaded. JupyterLab runs on 127.0.0.1 with a random port and token, on a folder of notebook copies.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Chromium as root in a container, offline: no sandbox, no background connections (they are refused here).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def why_not_available() -> str | None:
    """None when browser tests can run here, else the reason and how to fix it."""
    if CHROMIUM is None:
        return "Chromium not found: install it (Debian: `apt-get install -y chromium`; .ci/run does) to run these"
    for module in ("playwright", "jupyterlab"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed in this environment (`make install` installs it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_parameters(notebook: Path, values: dict[str, Any]) -> None:
    """Rewrite assignments in the notebook's ``parameters`` cell (``name: type = value  # help`` lines)."""
    nb = json.loads(notebook.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    lines = "".join(cell["source"]).splitlines()
    for name, value in values.items():
        for i, line in enumerate(lines):
            if line.startswith(f"{name}:") or line.startswith(f"{name} ="):
                head = line.split("=", 1)[0]
                lines[i] = f"{head}= {value!r}"
                break
        else:
            raise KeyError(f"{notebook.name}: no parameter {name!r}")
    cell["source"] = [line + "\n" for line in lines]
    notebook.write_text(json.dumps(nb, indent=1))


@contextmanager
def jupyterlab(root: Path) -> Iterator[str]:
    """Run JupyterLab on ``root``; yields the base URL with the token (``http://127.0.0.1:P/lab?token=T``)."""
    port, token = _free_port(), secrets.token_hex(16)
    # Every cell rendered (JupyterLab 4 draws only the visible ones by default, so a prompt off screen has no
    # text), and no news pop-up over the page.
    settings = root / ".jupyterlab-settings"
    for plugin, values in (("@jupyterlab/notebook-extension/tracker", {"windowingMode": "none"}),
                           ("@jupyterlab/apputils-extension/notification", {"fetchNews": "false"})):
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "JUPYTER_CONFIG_DIR": str(root / ".jupyter"),
           "JUPYTER_RUNTIME_DIR": str(root / ".runtime"), "JUPYTERLAB_SETTINGS_DIR": str(settings)}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=open(root / "jupyterlab.log", "w"))
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError(f"JupyterLab did not start; see {root / 'jupyterlab.log'}") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
