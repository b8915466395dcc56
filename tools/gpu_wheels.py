"""Download, here, the wheels a GPU machine without network needs to run rpm_lib (``make gpu-wheels``).

The GPU machine (Python 3.12, x86_64) already has torch, lightning, numpy, scipy, OpenCV, matplotlib, pytest
and many more (``tools/gpu_packages.txt``, copied from its documentation). This walks the requirement tree
of what rpm_lib needs beyond those (``ROOTS``) in this checkout's ``.venv``, drops every package the device
already has, pins the rest at the versions installed here (which ``requirements.txt`` pins for the top-level
ones), and downloads exactly those wheels, for CPython 3.12 on manylinux x86_64, with ``--no-deps``:

    .gpu/wheels/*.whl
    .gpu/wheels/device-requirements.txt   # name==version, one per line, what was downloaded

    make gpu-wheels                     # = python tools/gpu_wheels.py
    python tools/gpu_wheels.py --list   # print the pins, download nothing

Never torch, numpy, OpenCV or SciPy (``NEVER``): a different build of those would replace the device's CUDA
stack. Fails with a one-line error when a wheel is missing for that platform or the folder exceeds 50 MiB.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What rpm_lib needs that the device's image lacks (its own list: tools/gpu_packages.txt).
ROOTS: tuple[str, ...] = ("albumentations", "papermill", "nbclient", "nbformat", "ipykernel", "ipywidgets", "nbval")
#: Never carried, whatever the tree says: the device's builds of these are the ones its CUDA torch works with.
NEVER: frozenset[str] = frozenset({"torch", "numpy", "opencv-python-headless", "opencv-python", "scipy", "triton"})
MAX_BYTES = 50 * 2**20
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
#: Marker environment of the device's interpreter, to skip requirements that do not apply there.
DEVICE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                  "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def canonical(name: str) -> str:
    """PEP 503 name: ``"Typing_Extensions"`` -> ``"typing-extensions"``."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages(path: Path = REPO / "tools" / "gpu_packages.txt") -> set[str]:
    """Canonical names of the packages already installed on the device."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonical(line))
    return names


def needed_pins(roots: tuple[str, ...] = ROOTS, present: set[str] | None = None) -> dict[str, str]:
    """``{name: version}`` of every package in ``roots``' requirement tree that the device lacks.

    Versions are those installed in the running interpreter (run it from ``.venv``).
    """
    from packaging.requirements import Requirement

    present = device_packages() if present is None else present
    versions: dict[str, str] = {}
    stack = list(roots)
    seen: set[str] = set()
    while stack:
        name = canonical(stack.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"error: {name} is not installed in {sys.prefix}; run `make install` first") from None
        if name not in present and name not in NEVER:
            versions[name] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(DEVICE_MARKERS):
                stack.append(requirement.name)
    return dict(sorted(versions.items()))


def download(pins: dict[str, str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        if canonical(old.name.split("-", 1)[0]) not in pins:
            old.unlink()  # a wheel from an earlier pin would give pip two versions to choose from
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
               "--abi", "abi3", "--abi", "none", "-d", str(out)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    command += [f"{name}=={version}" for name, version in pins.items()]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip download failed"])[-1]
        raise SystemExit(f"error: pip download into {out} failed: {last}")
    (out / "device-requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / ".gpu" / "wheels", help="folder (default .gpu/wheels)")
    parser.add_argument("--list", action="store_true", help="print the pins and exit")
    args = parser.parse_args(argv)
    pins = needed_pins()
    if args.list:
        print("".join(f"{n}=={v}\n" for n, v in pins.items()), end="")
        return 0
    download(pins, args.out)
    wheels = sorted(args.out.glob("*.whl"))
    total = sum(p.stat().st_size for p in wheels)
    print(f"{len(wheels)} wheels for {len(pins)} packages, {total / 2**20:.1f} MiB in {args.out}")
    if total > MAX_BYTES:
        print(f"error: {args.out} holds {total / 2**20:.1f} MiB, over the {MAX_BYTES / 2**20:.0f} MiB budget",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
