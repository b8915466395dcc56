"""Run folders seen from the outside: where each run stands, a live line per epoch, and portable run state.

``rpm_lib.runs`` reads the folders that ``rpm-train`` writes (``rpm_lib.run_folder`` says what one holds) without
ever talking to a run, so it works the same on runs in local processes, jobs on a cluster and folders unpacked from
an archive:

* ``progress``: where each run of a batch folder stands (``rpm-batch progress``: table, JSON, figure);
* ``live``: a line per finished epoch of the runs a batch is executing, with ETAs, and a notice for a quiet run;
* ``plan``: a run's training plan as its ``config.yaml`` describes it (stages, epoch limits, views);
* ``archive`` (with ``archive_pack`` and ``archive_manifest``): ``rpm-batch pack`` / ``unpack``, what resuming
  needs packed into one small, checked archive.

Importing the package imports none of them; ``progress``, ``live`` and ``plan`` stay light (no Lightning).
"""
