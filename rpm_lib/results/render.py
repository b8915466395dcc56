"""Tables as text and files: Markdown (``markdown_table``, ``table1_markdown``) and CSV (``write_csv``,
``write_table1``), and the per-run views of a batch (``runs_table``: one row per run; ``eval_sets_table``: one row
per run and evaluated set).

Cells may hold labels from someone else's ``run.json``: a line break, a ``|`` or a formula (``=HYPERLINK(...)``)
must not add a row or a column, nor run in a spreadsheet; texts are escaped here, once, for every table.
Accuracies are in percent.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rpm_lib.results.accuracies import recorded_test_sets, run_accuracies, set_accuracies
from rpm_lib.results.aggregate import Table1Row, row_name
from rpm_lib.results.paper import CONFIGURATION_COLUMNS
from rpm_lib.results.records import RunRecord, clean_text
from rpm_lib.run_folder import METRICS, RunStatus


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells are ``str()``-ed, ``|`` escaped, line breaks made spaces (a label
    from someone's run.json must not add a row or a column)."""
    def cell(v: Any) -> str:
        return clean_text(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"markdown_table: row has {len(row)} cells, header has {len(header)}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def table1_header(with_paper: bool = True) -> list[str]:
    """Column names of ``table1_cells``."""
    head = ["Encoder", "Setup", "Group", "Seeds", "Average ± Std"]
    if with_paper:
        head += ["Paper avg ± std", "Δ avg"]
    return head + list(CONFIGURATION_COLUMNS)


def table1_cells(rows: Sequence[Table1Row], with_paper: bool = True) -> list[list[str]]:
    """Table 1 as strings. Configuration cells read ``ours`` or, with the paper, ``ours (paper)``."""
    out = []
    for r in rows:
        paper = r.paper if with_paper else None
        cells = [
            r.encoder,
            r.setup,
            ", ".join(f"{k}={v}" for k, v in sorted(r.group.items())) or "–",
            str(len(r.seeds)),
            f"{_fmt(r.average)} ± {_fmt(r.std)}",
        ]
        if with_paper:
            cells.append(f"{_fmt(paper.average)} ± {_fmt(paper.std)}" if paper else "–")
            cells.append(f"{r.average - paper.average:+.1f}" if paper else "–")
        for col in CONFIGURATION_COLUMNS:
            ours = _fmt(r.per_configuration.get(col))
            if paper is not None:
                ours += f" ({_fmt(paper.per_configuration.get(col))})"
            cells.append(ours)
        out.append(cells)
    return out


def table1_markdown(rows: Sequence[Table1Row], with_paper: bool = True) -> str:
    """Table 1 layout in Markdown; with the paper, each configuration cell is ``ours (paper)``."""
    note = (
        "Test accuracy (%), mean over seeds; Average ± sample std over seeds"
        + ("; paper values (Table 1 of the MLCL paper) in parentheses." if with_paper else ".")
        + "\n\n"
    )
    return note + markdown_table(table1_header(with_paper), table1_cells(rows, with_paper)) + _row_notes(rows)


def _row_notes(rows: Sequence[Table1Row]) -> str:
    """The rows' ``notes`` as a Markdown list under the table ("" when there are none)."""
    lines = [f"- {clean_text(row_name(r))}: {clean_text(note)}" for r in rows for note in r.notes]
    lines += [f"- {clean_text(row_name(r))}: the published numbers beside it are the {r.paper.source}'s, not the "
              "MLCL paper's" for r in rows if r.paper is not None and r.paper.source]
    return "\nNotes:\n\n" + "\n".join(lines) + "\n" if lines else ""


def write_table1(rows: Sequence[Table1Row], csv_path: str | Path, with_paper: bool = True) -> Path:
    """Write Table 1 as CSV with numeric columns (ours and, optionally, paper side by side)."""
    header = ["encoder", "setup", "group", "seeds", "average", "std"]
    if with_paper:
        header += ["paper_average", "paper_std"]
    for col in CONFIGURATION_COLUMNS:
        header += [col] + ([f"paper_{col}"] if with_paper else [])
    header.append("notes")
    lines = []
    for r in rows:
        line: list[Any] = [r.encoder, r.setup, ";".join(f"{k}={v}" for k, v in sorted(r.group.items())),
                           len(r.seeds), round(r.average, 4), "" if math.isnan(r.std) else round(r.std, 4)]
        if with_paper:
            line += [r.paper.average, r.paper.std] if r.paper else ["", ""]
        for col in CONFIGURATION_COLUMNS:
            v = r.per_configuration.get(col)
            line.append("" if v is None else round(v, 4))
            if with_paper:
                line.append(r.paper.per_configuration.get(col, "") if r.paper else "")
        lines.append([*line, "; ".join(r.notes)])
    return write_csv(header, lines, csv_path)


def _label_axes(records: Sequence[RunRecord]) -> list[str]:
    """Every grid axis the runs are labelled with, in order of first appearance (the table columns)."""
    return list(dict.fromkeys(k for rec in records for k in rec.labels))


def runs_table(records: Iterable[RunRecord], split: str = "test") -> tuple[list[str], list[list[Any]]]:
    """One row per run (finished, failed, pending, damaged or skipped): header and rows for CSV / display.

    Columns: ``name, grid, status``, every label axis seen, ``Average`` and the 7 configurations (percent,
    empty when not finished), ``folder`` (the run folder below the gathered one: runs copied from two machines
    share a name), and the last line of the error for failed runs (why, for damaged or skipped ones).
    """
    records = list(records)
    axes = _label_axes(records)
    header = ["name", "grid", "status", *axes, "Average", *CONFIGURATION_COLUMNS, "folder", "error"]
    rows = []
    for rec in records:
        status, acc = rec.status, {}
        err = (rec.problem or rec.conflict or rec.error or "").strip().splitlines()
        if status == RunStatus.DONE:
            try:
                acc = run_accuracies(rec.metrics or {}, split, str(rec.run_dir / METRICS))
            except ValueError as exc:  # e.g. a damaged val accuracy, with split="val"
                status, err = RunStatus.DAMAGED, [str(exc)]
        rows.append(
            [rec.name, rec.grid, status, *(rec.labels.get(a, "") for a in axes),
             *("" if acc.get(c) is None else round(acc[c], 4) for c in ["Average", *CONFIGURATION_COLUMNS]),
             rec.folder or rec.name, clean_text(err[-1]) if err else ""]
        )
    return header, rows


def eval_sets_table(records: Iterable[RunRecord]) -> tuple[list[str], list[list[Any]]]:
    """One row per (finished run, evaluated set) from the runs' ``metrics.json`` ``test_sets``
    (``rpm_lib.training.eval_sets``): the "train regime x test set" view of a batch.

    Columns: ``name, grid``, every label axis seen, ``set, split, regime, distribution, num_samples``,
    ``accuracy`` (over all problems of the set), ``Average`` and the 7 configurations (percent; ``Average`` is the
    mean over the configurations present, as in Table 1, and the overall accuracy when the set has no
    per-configuration accuracy). Runs without ``test_sets`` are left out, and damaged ones (``runs_table`` and
    table1.md name them).
    """
    records = [r for r in records
               if r.status == RunStatus.DONE and r.metrics is not None and r.metrics.get("test_sets")]
    axes = _label_axes(records)
    header = ["name", "grid", *axes, "set", "split", "regime", "distribution", "num_samples", "accuracy",
              "Average", *CONFIGURATION_COLUMNS]
    rows = []
    for rec in records:
        where = str(rec.run_dir / METRICS)
        for entry in recorded_test_sets(rec.metrics or {}, where):
            overall, acc = set_accuracies(entry, where)
            rows.append([rec.name, rec.grid, *(rec.labels.get(a, "") for a in axes),
                         *(clean_text(entry.get(k) or "") for k in ("name", "split", "regime", "distribution")),
                         entry.get("num_samples"), round(overall, 4),
                         *("" if acc.get(c) is None else round(acc[c], 4)
                           for c in ["Average", *CONFIGURATION_COLUMNS])])
    return header, rows


def spreadsheet_safe(value: Any) -> Any:
    """``value`` for a CSV cell that a spreadsheet opens as text, never as a formula: a text starting with ``=``,
    ``+``, ``-``, ``@``, a tab or a carriage return (a label from someone's run.json, ``=HYPERLINK(...)``) gets a
    leading ``'``; numbers, and texts that read as numbers (``-0.5``), are left as they are."""
    if not isinstance(value, str) or not value or value[0] not in "=+-@\t\r":
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def write_csv(header: Sequence[str], rows: Iterable[Sequence[Any]], path: str | Path) -> Path:
    """Write ``header`` + ``rows`` as CSV (creating the parent folder); texts through ``spreadsheet_safe``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8", errors="backslashreplace") as fh:
        writer = csv.writer(fh)
        writer.writerow([spreadsheet_safe(v) for v in header])
        writer.writerows([spreadsheet_safe(v) for v in row] for row in rows)
    return path
