"""A cache's build plan (``manifest.json`` ``plan``): what it is built from and how, and whether two plans are of
the same inputs, so that an existing cache or an interrupted build is reused only for the same ones."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import rpm_lib.data.opencv_version as opencv_version
from rpm_lib.data.raw_files import RawFile


def names_sha256(names: Sequence[str]) -> str:
    """The plan's ``files_sha256``: which problems, by their names relative to the source folder, in row order."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(f"{name}\n".encode())
    return digest.hexdigest()


def raw_plan(kind: str, root: Path, files: list[RawFile], size: int, resize: str, chunk_size: int) -> dict:
    # Names say which files; size and modification time (ns) say which contents, without reading them: a file
    # regenerated or replaced under the same name changes its time, so the cache is rebuilt, not trusted.
    content = hashlib.sha256()
    names = []
    for f in files:
        name = f.path.relative_to(root)
        stat = f.path.stat()
        names.append(str(name))
        content.update(f"{name}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return {
        "kind": kind,
        "image_size": size,
        "resize": resize,
        "source_root": str(root),
        "num_rows": len(files),
        "files_sha256": names_sha256(names),
        "content_sha256": content.hexdigest(),
        "chunk_size": chunk_size,
        opencv_version.KEY: {"rendered": opencv_version.rendered_by(root) if kind == "raven" else None,
                             "resized": opencv_version.current()},
    }


#: The plan fields that say which inputs and settings a cache was built from.
INPUT_KEYS = ("kind", "image_size", "resize", "source_root", "num_rows", "files_sha256", "content_sha256")


def same_inputs(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in INPUT_KEYS)


def same_opencv(previous: dict, plan: dict) -> bool:
    """Whether a build may go on where ``previous`` stopped: another OpenCV would draw or resize some pixels
    differently (``rpm_lib.data.opencv_version``), and one cache must not mix the two. A plan from before the
    record says nothing either way."""
    return opencv_version.KEY not in previous or previous[opencv_version.KEY] == plan.get(opencv_version.KEY)


def plan_differences(previous: dict, plan: dict) -> str:
    """What differs between two plans, for a message: for two generated caches the generator settings, size and
    row count by name and value; otherwise the names of the differing input keys."""
    old, new = previous.get("generator"), plan.get("generator")
    if isinstance(old, dict) and isinstance(new, dict):
        said = [f"{k} {old.get(k)!r} there, {new.get(k)!r} asked" for k in sorted({*old, *new})
                if old.get(k) != new.get(k)]
        said += [f"{k} {previous.get(k)!r} there, {plan.get(k)!r} asked" for k in ("image_size", "resize", "num_rows")
                 if previous.get(k) != plan.get(k)]
        if previous.get("files_sha256") != plan.get("files_sha256") and previous.get("num_rows") == plan.get("num_rows"):
            said.append("the problem indices or configurations")
        if said:
            return ", ".join(said)
    return ", ".join(k for k in INPUT_KEYS if previous.get(k) != plan.get(k))
