"""The paper's orderings at CPU scale: SCL × {CE, CE+AUX-dense, CE+AUX-sparse, MLCL, MLCL+AUG} × 3 seeds
plus MLCL+AUG's ablations, then which of the paper's claims hold.

    python bench/bench_reproduction_cpu.py                 # run configs/reproduction_cpu.yaml (resumable), summarise
    python bench/bench_reproduction_cpu.py --summary-only  # summarise what has finished so far
    python bench/bench_reproduction_cpu.py --jobs 1        # one run at a time (default 2: one per core)

The runs go through ``rpm-batch`` (so an interrupted bench continues where it stopped) into
``runs/reproduction_cpu``; the summary is written to ``runs/reproduction_cpu/summary.md`` and
``summary.json`` and printed. ``notebooks/07_reproduction_cpu.ipynb`` (the batch's report notebook) draws
the same table and a figure. See ``docs/reproduction-cpu.md`` for the regime and the measured results.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "reproduction_cpu.yaml"


def summarise(batch_dir: Path) -> str:
    """Markdown summary (``rpm_lib.results.claims.report_markdown``), also written to summary.md / summary.json."""
    from rpm_lib.results import claims

    report = claims.reproduction_report(batch_dir)
    text = claims.report_markdown(report)
    (batch_dir / "summary.md").write_text(text)
    rows = report.setups + report.ablations
    (batch_dir / "summary.json").write_text(json.dumps(
        {"runs_finished": report.finished, "runs": report.total, "num_test": report.num_test,
         "rows": [{"key": claims.row_key(r), "seeds": r.seeds, "average": r.average, "std": r.std,
                   "per_configuration": r.per_configuration} for r in rows],
         "claims": [c.__dict__ for c in report.checks]}, indent=2, default=str))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2; each gets cores / jobs threads)")
    parser.add_argument("--out", default=str(REPO / "runs" / "reproduction_cpu"), help="batch folder")
    parser.add_argument("--summary-only", action="store_true", help="only summarise the finished runs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not args.summary_only:
        from rpm_lib.batch import run_batch

        began = time.perf_counter()
        os.chdir(REPO)  # the YAML's relative paths (data, notebooks) are relative to the repository
        results = run_batch(CONFIG, jobs=args.jobs, out=out)
        failed = [r for r in results if r.status == "failed"]
        print(f"batch finished in {(time.perf_counter() - began) / 60:.1f} min; {len(failed)} failed run(s)"
              + "".join(f"\n  {r.run_dir}/error.txt" for r in failed), flush=True)
    if not out.is_dir():
        print(f"bench_reproduction_cpu: {out} does not exist; run without --summary-only first", file=sys.stderr)
        return 2
    print(summarise(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
