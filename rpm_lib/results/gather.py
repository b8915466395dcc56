"""A batch folder's tables: what ``rpm-batch --gather`` writes (``write_tables``) and what a report shows.

``write_tables`` writes ``results.csv`` (one row per run), ``table1.csv`` and ``table1.md`` (Table 1 beside the
published numbers) and, when runs report extra test sets, ``test_sets.csv``. One run never stops the tables:
table1.md names under the table every run it leaves out (unfinished, failed, damaged, a symbolic link,
contradicting its ``run.json``), and why (``left_out_markdown``).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rpm_lib.results.aggregate import Table1Row, table1, table1_records
from rpm_lib.results.records import RunRecord, clean_text
from rpm_lib.results.render import eval_sets_table, runs_table, table1_markdown, write_csv, write_table1
from rpm_lib.run_folder import ERROR, METRICS, PROGRESS, RunStatus, stopped_by_budget


def left_out_markdown(records: Sequence[RunRecord], excluded: Sequence[tuple[RunRecord, str]]) -> str:
    """A Markdown list of the runs among ``records`` that Table 1 does not count, with why ("" when none)."""
    why = {id(rec): reason for rec, reason in excluded}
    lines = []
    for rec in records:
        if id(rec) in why:
            reason = why[id(rec)]
        elif rec.status == RunStatus.PENDING:
            reason = (f"unfinished ({PROGRESS}): run it again to continue" if stopped_by_budget(rec.run_dir)
                      else f"not finished (no {METRICS} yet)")
        elif rec.status == RunStatus.FAILED:
            last = (rec.error or "").strip().splitlines()
            reason = "failed: " + (last[-1] if last else f"see {ERROR}")
        elif rec.status in (RunStatus.DAMAGED, RunStatus.SKIPPED):
            reason = rec.problem or rec.status
        else:
            continue
        lines.append(f"- {clean_text(rec.folder or rec.name)}: {clean_text(reason)}")
    if not lines:
        return ""
    return f"\nNot in the table ({len(lines)} run{'s' if len(lines) > 1 else ''}):\n\n" + "\n".join(lines) + "\n"


def table1_and_left_out(records: Sequence[RunRecord], main_grid: str | None = "main") -> tuple[list[Table1Row], str]:
    """Table 1 of ``table1_records(records, main_grid)``, and the Markdown list (``left_out_markdown``) of every
    run it does not count: unfinished, failed, damaged, skipped, or contradicting its run.json. What ``table1.md``
    and the report notebook show, so that no run leaves the table without a word."""
    excluded: list[tuple[RunRecord, str]] = []
    candidates = table1_records(records, main_grid)
    table = table1(candidates, excluded=excluded)
    # damaged or linked folders of unknown grid are named too: which grid they were is what cannot be read
    unknown = [r for r in records if r.status in (RunStatus.DAMAGED, RunStatus.SKIPPED) and r not in candidates]
    return table, left_out_markdown(candidates + unknown, excluded)


def write_tables(records: Sequence[RunRecord], out_dir: str | Path, main_grid: str | None = "main",
                 with_paper: bool = True) -> dict[str, Path]:
    """Write ``results.csv`` (one row per run), ``table1.csv`` and ``table1.md`` (Table 1 of
    :func:`table1_records`, beside the published numbers when ``with_paper``) into ``out_dir``.

    With runs that report ``test_sets`` (every run of a current ``rpm_lib.training``) also ``test_sets.csv``
    (:func:`eval_sets_table`).

    One run never stops the tables: a damaged run is left out of Table 1, and table1.md names under the table
    every run of Table 1's grid that it leaves out (unfinished, failed, damaged, a symbolic link), and why: a
    row of 3 seeds where 4 were planned must say so where it is read.

    Returns:
        ``{"results_csv", "table1_csv", "table1_md"}`` (+ ``"test_sets_csv"``) -> the paths written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header, rows = runs_table(records)
    table, left_out = table1_and_left_out(records, main_grid)
    md = out_dir / "table1.md"
    md.write_text(table1_markdown(table, with_paper=with_paper) + left_out, encoding="utf-8",
                  errors="backslashreplace")
    paths = {"results_csv": write_csv(header, rows, out_dir / "results.csv"),
             "table1_csv": write_table1(table, out_dir / "table1.csv", with_paper=with_paper), "table1_md": md}
    sets_header, sets_rows = eval_sets_table(records)
    if sets_rows:
        paths["test_sets_csv"] = write_csv(sets_header, sets_rows, out_dir / "test_sets.csv")
    return paths
