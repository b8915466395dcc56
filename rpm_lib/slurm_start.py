"""How a SLURM task of ``rpm-batch --executor slurm`` starts: ``python -m rpm_lib.slurm_start -u -m
submitit.core._submit FOLDER`` (submitit appends ``-u -m submitit.core._submit FOLDER`` to the executor's
``python``).

SLURM may send its ``--signal`` (SIGUSR2) up to a minute before the time it announces, and it signals every
process of the job. A task that got it while still loading its pickled work (which imports torch and Lightning:
seconds), before submitit or the task had installed a handler, died of it: SIGUSR2's default action ends a process
(``srun: error: ... task 0: User defined signal 2``, seen in tests/test_slurm.py). This ignores SIGUSR2 until
submitit installs its handler, then hands over to submitit's own entry point. An ignored early signal costs nothing:
the run's own time budget ends it before the limit.
"""
from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

#: What submitit appends to the executor's ``python``, before the job folder.
SUBMITIT_ARGUMENTS: tuple[str, ...] = ("-u", "-m", "submitit.core._submit")


def main(argv: Sequence[str] | None = None) -> None:
    """Ignore SIGUSR2, then run submitit's task entry point on the job folder in ``argv`` (see the module)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if tuple(args[:3]) != SUBMITIT_ARGUMENTS or len(args) != 4:
        raise SystemExit(f"rpm_lib.slurm_start: error: expected {' '.join(SUBMITIT_ARGUMENTS)} FOLDER, got "
                         f"{' '.join(args) or 'nothing'}")
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):  # what -u did for submitit's own process
        stream.reconfigure(line_buffering=True, write_through=True)
    sys.argv = [SUBMITIT_ARGUMENTS[2], args[3]]
    from submitit.core.submission import submitit_main

    submitit_main()


if __name__ == "__main__":
    main()
