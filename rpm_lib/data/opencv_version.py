"""Which OpenCV made a dataset's pixels: recorded beside the data, named when a resumed run's data differ.

The generator draws every panel with OpenCV (lines, circles, filled polygons, rotations by ``warpAffine``) and a
cache resizes panels with ``cv2.resize``. Two OpenCV versions may set some edge pixels differently. Measured on the
Table 1 campaign's recipe (70,000 I-RAVEN problems, seed 1234, cached at 80 px): OpenCV 4.14.0 and 5.0.0 give caches
whose labels, answers, rules and splits are identical, while 1.62 % of the pixels differ, by at most 3 grey levels
of 255, in 67,480 of the 70,000 problems. The data fingerprint (:mod:`rpm_lib.data.fingerprint`) therefore differs,
and a run resumed on the regenerated data is refused. This record lets that refusal say why.

Layout, in a raw folder's ``generator.json``: ``"opencv": "5.0.0"`` (the version that rendered its problems); in a
cache's ``manifest.json`` ``plan``: ``"opencv": {"rendered": "5.0.0" | null, "resized": "4.14.0"}`` (``rendered``
is null when the source folder did not record it, e.g. the official generators' data). Folders made before this
record have neither key: their versions are unknown, not assumed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from rpm_lib.data.records import MANIFEST, SETTINGS_FILE
from rpm_lib.json_files import read_object_or_empty

#: The key of the record in ``generator.json`` and in a cache plan.
KEY = "opencv"


def current() -> str:
    """The OpenCV version of this process (``cv2.__version__``)."""
    import cv2

    return str(cv2.__version__)


def rendered_by(raw_root: str | Path) -> str | None:
    """The OpenCV version ``raw_root/generator.json`` says rendered the folder's problems, or None (not recorded)."""
    value = read_object_or_empty(Path(raw_root) / SETTINGS_FILE).get(KEY)
    return value if isinstance(value, str) else None


def recorded(root: str | Path) -> dict[str, str | None]:
    """What made the pixels of ``root`` (a cache or a raw folder): ``{"rendered": v | None, "resized": v | None}``.

    A raw folder is never resized (``"resized": None``); an unreadable or absent record gives Nones.
    """
    root = Path(root)
    manifest = read_object_or_empty(root / MANIFEST)
    if manifest:
        plan = manifest.get("plan")
        entry = plan.get(KEY) if isinstance(plan, dict) else None
        if isinstance(entry, dict):
            return {part: entry.get(part) if isinstance(entry.get(part), str) else None
                    for part in ("rendered", "resized")}
        return {"rendered": None, "resized": None}
    return {"rendered": rendered_by(root), "resized": None}


def describe(record: Mapping[str, Any] | None) -> str:
    """``"rendered and resized with OpenCV 5.0.0"``, ``"rendered with OpenCV 5.0.0 and resized with OpenCV 4.14.0"``,
    ``"resized with OpenCV 4.14.0"``; ``"with an unrecorded OpenCV"`` when nothing is recorded."""
    record = record or {}
    rendered, resized = record.get("rendered"), record.get("resized")
    if rendered and rendered == resized:
        return f"rendered and resized with OpenCV {rendered}"
    said = [f"{part} with OpenCV {record[part]}" for part in ("rendered", "resized") if record.get(part)]
    return " and ".join(said) if said else "with an unrecorded OpenCV"
