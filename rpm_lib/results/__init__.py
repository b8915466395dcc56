"""Training runs gathered into the paper's Table 1 layout, beside the published numbers; the paper's claims checked.

A *run folder* is what ``rpm-batch`` (``rpm_lib.batch``) or ``rpm-train`` leaves for one run
(``rpm_lib.run_folder``); ``rpm-batch --gather`` turns a batch folder of them into tables. Accuracies are in
**percent** everywhere in this package (the paper's unit). Its modules, each importing only those above it:

* ``paper``: the paper's Table 1 and ablation numbers, its names for encoders and setups;
* ``accuracies``: a run's accuracies from its ``metrics.json``, checked;
* ``records``: one run folder read back (``load_run``), every run folder below a folder (``load_runs``);
  nothing in a folder is trusted: damaged records, symbolic links and a ``metrics.json`` that contradicts its
  ``run.json`` are named, never counted;
* ``aggregate``: runs into Table 1 rows (``table1``) and ablation series (``ablation_series``);
* ``render``: Markdown and CSV tables;
* ``gather``: a batch folder's tables (``write_tables``), naming every run they leave out;
* ``claims``: the paper's orderings between setups checked on Table 1 rows; the CPU-scale reproduction report.

Every public name but the claims' is importable from ``rpm_lib.results`` itself; the claims from
``rpm_lib.results.claims``.
"""
from __future__ import annotations

from rpm_lib.results.accuracies import run_accuracies
from rpm_lib.results.aggregate import AblationPoint, Table1Row, ablation_series, row_name, table1, table1_records
from rpm_lib.results.gather import left_out_markdown, table1_and_left_out, write_tables
from rpm_lib.results.paper import (CONFIGURATION_COLUMNS, ENCODER_NAMES, LITERATURE, OTHER_PUBLISHED_ROWS,
                                   PAPER_ABLATIONS, PAPER_TABLE1,
                                   SETUP_LABELS, PaperRow, canonical_encoder, canonical_setup, paper_row)
from rpm_lib.results.records import MAX_RECORD_BYTES, NOT_COMPARED, SYMLINK_PROBLEM, RunRecord, load_run, load_runs
from rpm_lib.results.render import (eval_sets_table, markdown_table, runs_table, spreadsheet_safe, table1_cells,
                                    table1_header, table1_markdown, write_csv, write_table1)

__all__ = [
    "CONFIGURATION_COLUMNS", "ENCODER_NAMES", "LITERATURE", "OTHER_PUBLISHED_ROWS", "PAPER_ABLATIONS", "PAPER_TABLE1",
    "SETUP_LABELS",
    "PaperRow", "canonical_encoder", "canonical_setup", "paper_row",
    "run_accuracies",
    "MAX_RECORD_BYTES", "NOT_COMPARED", "SYMLINK_PROBLEM", "RunRecord", "load_run", "load_runs",
    "AblationPoint", "Table1Row", "ablation_series", "row_name", "table1", "table1_records",
    "eval_sets_table", "markdown_table", "runs_table", "spreadsheet_safe", "table1_cells", "table1_header",
    "table1_markdown", "write_csv", "write_table1",
    "left_out_markdown", "table1_and_left_out", "write_tables",
]
