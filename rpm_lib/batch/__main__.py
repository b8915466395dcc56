"""``python -m rpm_lib.batch``: the same as ``rpm-batch`` (a kernel or a job without the console script on PATH)."""
from __future__ import annotations

import sys

from rpm_lib.batch.cli import main

if __name__ == "__main__":
    sys.exit(main())
