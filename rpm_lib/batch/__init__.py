"""``rpm-batch``: run a grid of papermill notebook executions, resumably, and gather the results.

A batch is described by a YAML file (``configs/table1.yaml``, ``configs/demo.yaml``): its format and how it is read
and checked are in ``rpm_lib.batch.config``. Every grid point becomes one run folder ``<out>/<grid>/<axis>-<label>...``
where its template notebook (``03_train``), then its ``then`` notebooks, are executed; a run whose folder holds
``metrics.json`` is finished and skipped the next time, and a failing run leaves ``error.txt`` while the others go on.
At the end the batch folder gets its tables (``results.csv``, ``table1.csv`` / ``table1.md``, ``test_sets.csv``).

Relative paths in the YAML (template, out, prepare) and relative paths passed to notebooks are relative to the
current working directory (run from the repository root); kernels run in that directory.

The modules, each importing only those after it:

* ``cli``: the ``rpm-batch`` command line and its subcommands (``pack``, ``unpack``, ``progress``, ``status``,
  ``cancel``);
* ``run``: one call on a batch YAML (:func:`run_batch`): plan, prepare, execute, tables, report; a time budget;
* ``local``: the cells executed on this machine (worker processes, CUDA MPS, live progress);
* ``slurm``: the cells as one SLURM job array through submitit, requeued at time limits; status and cancel;
* ``prepare``: the YAML's ``prepare`` commands that make the data;
* ``cell``: one cell (:func:`run_one`) in its run folder (:func:`run_dir_of`), its :class:`RunResult`;
* ``grid``: the grids expanded into runs (:func:`expand_grid`) and the run folders' names;
* ``notebook``: the template's parameters and the check of every run's parameters against them;
* ``config``: the batch YAML read and checked (:func:`load_batch_config`), its SLURM settings.
"""
from __future__ import annotations

from rpm_lib.batch.cell import RunResult, run_dir_of, run_one
from rpm_lib.batch.cli import main
from rpm_lib.batch.config import BatchConfig, BatchConfigError, RunSpec, load_batch_config
from rpm_lib.batch.grid import expand_grid
from rpm_lib.batch.run import gather_results, run_batch

__all__ = ["BatchConfig", "BatchConfigError", "RunResult", "RunSpec", "expand_grid", "gather_results",
           "load_batch_config", "main", "run_batch", "run_dir_of", "run_one"]
