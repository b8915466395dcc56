"""`make gpu-wheels` picks exactly what the GPU machine lacks, pinned like requirements.txt (no download here)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("gpu_wheels", REPO / "tools" / "gpu_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _requirements() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_pins_cover_the_roots_at_the_requirements_versions_and_never_the_cuda_stack():
    wheels = _module()
    pins = wheels.needed_pins()
    requirements = _requirements()
    assert set(wheels.ROOTS) <= set(pins)
    for root in set(wheels.ROOTS) & set(requirements):
        assert pins[root] == requirements[root], root
    assert not set(pins) & wheels.NEVER
    assert not set(pins) & wheels.device_packages()
    # Their own needs come along when the device lacks them (albumentations -> albucore -> stringzilla).
    assert {"albucore", "stringzilla", "jupyter-client", "pyzmq"} <= set(pins)


def test_a_package_the_device_has_is_not_carried():
    wheels = _module()
    present = wheels.device_packages() | {"pyzmq"}
    assert "pyzmq" not in wheels.needed_pins(present=present)
