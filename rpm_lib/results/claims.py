"""The paper's qualitative claims about its setups, checked against aggregated runs.

The MLCL paper's Table 1 supports orderings that do not depend on scale: an auxiliary rule loss beats
none, the sparse rule encoding beats the dense one, MLCL+AUG is the best setup, and each of its parts
matters (removing the auxiliary loss, the contrastive loss or the wrong-completion negatives hurts).
:func:`check_claims` tests each of them on :class:`rpm_lib.results.Table1Row` rows (e.g. from
``configs/reproduction_cpu.yaml``) and says how clearly it holds.

Verdicts compare mean test accuracies (percent, the paper's Average over configurations):

* ``holds``: the difference is in the claimed direction and larger than twice its standard error;
* ``same direction, not significant``: in the claimed direction but within two standard errors;
* ``does not hold``: zero or reversed.

The standard error of a difference of seed means is ``sqrt(s_a^2/n_a + s_b^2/n_b)`` (sample std over
seeds); with one seed on a side, or seeds of identical accuracy (std 0: a model that collapsed to one answer,
or one run copied), its binomial error ``sqrt(p (1 - p) / N)`` over the N test problems is used instead, so
that no difference "holds" on a zero error.

Rows are matched by setup (``row_key``): rows of several encoders, or of one setup split by a setting
(``rpm_lib.results.table1``), are refused rather than one of them picked; check each encoder's rows apart.
:func:`reproduction_report` instead sets such rows aside: the claims about them say ``not judged`` and why.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rpm_lib.results.accuracies import run_accuracies
from rpm_lib.results.aggregate import Table1Row, row_name, table1
from rpm_lib.results.gather import left_out_markdown
from rpm_lib.results.paper import canonical_setup
from rpm_lib.results.records import RunRecord, load_runs
from rpm_lib.results.render import table1_markdown
from rpm_lib.run_folder import RunStatus

#: Verdict strings of :class:`ClaimCheck`.
HOLDS, WEAK, FAILS, MISSING = "holds", "same direction, not significant", "does not hold", "not measured"
#: The verdict where a side has several rows (its runs differ in a setting, e.g. their test sets' sizes).
SPLIT = "not judged: its runs differ in settings (see the table's notes)"


@dataclass(frozen=True)
class Claim:
    """``better`` should beat every one of ``worse``; each side names a setup (paper spelling) or an ablation."""

    text: str
    better: str
    worse: tuple[str, ...]


#: The claims, as (row key of the better side, row keys it should beat). Row keys: setup labels, or
#: ``"MLCL+AUG beta=0"``-style keys for the ablation grid's ``variant`` label.
CLAIMS: tuple[Claim, ...] = (
    Claim("an auxiliary rule loss beats none (CE+AUX-sparse > CE)", "CE+AUX-sparse", ("CE",)),
    Claim("an auxiliary rule loss beats none (CE+AUX-dense > CE)", "CE+AUX-dense", ("CE",)),
    Claim("the sparse rule encoding beats the dense one (CE+AUX-sparse > CE+AUX-dense)", "CE+AUX-sparse",
          ("CE+AUX-dense",)),
    Claim("augmentation helps MLCL (MLCL+AUG > MLCL)", "MLCL+AUG", ("MLCL",)),
    Claim("MLCL+AUG is the best setup", "MLCL+AUG", ("CE", "CE+AUX-dense", "CE+AUX-sparse", "MLCL")),
    Claim("removing the auxiliary loss hurts (MLCL+AUG > MLCL+AUG beta=0)", "MLCL+AUG", ("MLCL+AUG beta=0",)),
    Claim("removing the contrastive loss hurts (MLCL+AUG > MLCL+AUG gamma=0)", "MLCL+AUG", ("MLCL+AUG gamma=0",)),
    Claim("removing the wrong-completion negatives hurts (MLCL+AUG > MLCL+AUG negatives=none)", "MLCL+AUG",
          ("MLCL+AUG negatives=none",)),
)


@dataclass(frozen=True)
class ClaimCheck:
    """Outcome of one claim against one rival: accuracies in percent, difference in percentage points."""

    claim: str
    better: str
    worse: str
    better_accuracy: float | None
    worse_accuracy: float | None
    difference: float | None
    standard_error: float | None
    verdict: str


def _key(setup: str, variant: str | None) -> str:
    return f"{setup} {variant}" if variant else setup


def row_key(row: Table1Row) -> str:
    """``"MLCL+AUG"`` for a main-grid row, ``"MLCL+AUG beta=0"`` for an ablation row (its ``variant`` label)."""
    return _key(row.setup, row.group.get("variant"))


def _standard_error(row: Table1Row, num_test: int) -> float:
    if len(row.seeds) > 1 and not math.isnan(row.std) and row.std > 0:
        return row.std / math.sqrt(len(row.seeds))
    p = row.average / 100.0
    return 100.0 * math.sqrt(max(p * (1 - p), 1e-12) / num_test)


def split_keys(rows: Iterable[Table1Row]) -> set[str]:
    """The row keys that more than one of ``rows`` share (one setup whose runs differ in a setting)."""
    seen: set[str] = set()
    shared: set[str] = set()
    for row in rows:
        key = row_key(row)
        (shared if key in seen else seen).add(key)
    return shared


def check_claims_setting_split_rows_aside(rows: Sequence[Table1Row], num_test: int,
                                         claims: Sequence[Claim] = CLAIMS,
                                         reference: dict[str, Table1Row] | None = None) -> list[ClaimCheck]:
    """:func:`check_claims`, except that a key shared by several rows is not refused: every claim with that key
    on a side gets the verdict :data:`SPLIT` (never one of the rows picked)."""
    shared = split_keys(rows)
    checks = check_claims([r for r in rows if row_key(r) not in shared], num_test, claims, reference)
    return [dataclasses.replace(c, verdict=SPLIT) if {c.better, c.worse} & shared and c.verdict == MISSING else c
            for c in checks]


def check_claims(rows: Iterable[Table1Row], num_test: int, claims: Sequence[Claim] = CLAIMS,
                 reference: dict[str, Table1Row] | None = None) -> list[ClaimCheck]:
    """Check every claim on ``rows``.

    Args:
        rows: aggregated runs (``rpm_lib.results.table1``); one row per setup / ablation variant.
        num_test: test problems per run (for the binomial error of single-seed rows).
        claims: the claims to check.
        reference: optional rows to use for a side instead (e.g. MLCL+AUG restricted to the ablations'
            seed, so that an ablation is compared with the same seed).

    Returns:
        One :class:`ClaimCheck` per (claim, rival), in order.

    Raises:
        ValueError: ``num_test`` below 1, or two rows with one key (e.g. SCL's and CoPINet's CE rows).
    """
    if not isinstance(num_test, int) or num_test < 1:
        raise ValueError(f"check_claims: num_test must be the number of test problems per run (>= 1), got {num_test!r}")
    by_key: dict[str, Table1Row] = {}
    for row in rows:
        key = row_key(row)
        if key in by_key:
            raise ValueError(f"check_claims: two rows for {key!r} ({row_name(by_key[key])}; {row_name(row)}): "
                             "pass the rows of one encoder and one setting at a time")
        by_key[key] = row
    out = []
    for claim in claims:
        for worse in claim.worse:
            better_row = (reference or {}).get(worse, by_key.get(claim.better))
            worse_row = by_key.get(worse)
            if better_row is None or worse_row is None:
                out.append(ClaimCheck(claim.text, claim.better, worse, None, None, None, None, MISSING))
                continue
            diff = better_row.average - worse_row.average
            se = math.hypot(_standard_error(better_row, num_test), _standard_error(worse_row, num_test))
            verdict = FAILS if diff <= 0 else (HOLDS if diff > 2 * se else WEAK)
            out.append(ClaimCheck(claim.text, claim.better, worse, better_row.average, worse_row.average, diff,
                                  se, verdict))
    return out


def claims_markdown(checks: Sequence[ClaimCheck]) -> str:
    """The checks as a Markdown table."""
    lines = ["| claim | better | worse | acc better | acc worse | difference (pp) | 2 SE | verdict |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for c in checks:
        if c.difference is None:
            lines.append(f"| {c.claim} | {c.better} | {c.worse} | – | – | – | – | {c.verdict} |")
        else:
            lines.append(f"| {c.claim} | {c.better} | {c.worse} | {c.better_accuracy:.1f} | {c.worse_accuracy:.1f} | "
                         f"{c.difference:+.1f} | {2 * c.standard_error:.1f} | {c.verdict} |")
    return "\n".join(lines)


@dataclass
class ReproductionReport:
    """A ``configs/reproduction_cpu.yaml`` batch, aggregated: what ``bench_reproduction_cpu.py`` and notebook 07 show.

    Attributes:
        setups: one row per setup of the ``main`` grid (mean ± std over seeds).
        ablations: one row per ``variant`` of the ``ablation`` grid.
        reference: MLCL+AUG restricted to the ablations' seed(s): what each ablation is compared with.
        checks: :func:`check_claims` on all of them.
        num_test: test problems per run; where runs were tested on different numbers, the smallest, so that no
            claim's error is understated (``test_sizes`` lists them all).
        finished, total: run counts; ``seed_values``: row key -> per-seed average accuracies (percent; a seed
            copied twice counted once, as in the rows).
        left_out: Markdown naming each run that is not counted (unfinished, failed, damaged), and why.
    """

    setups: list[Table1Row]
    ablations: list[Table1Row]
    reference: list[Table1Row]
    checks: list[ClaimCheck]
    num_test: int
    finished: int
    total: int
    seed_values: dict[str, list[float]]
    left_out: str = ""
    test_sizes: tuple[int, ...] = ()


def test_sizes_phrase(report: ReproductionReport) -> str:
    """``"14000 test problems per run"``, or, where the runs' test sets differ in size, the range and which one the
    claims' errors use."""
    sizes = report.test_sizes or (report.num_test,)
    if len(sizes) == 1:
        return f"{sizes[0]} test problems per run"
    return (f"{sizes[0]} to {sizes[-1]} test problems per run (the claims' errors use the smallest, "
            f"{report.num_test})")


#: Ablation variants of ``configs/reproduction_cpu.yaml`` (labels of its ``variant`` axis).
ABLATION_VARIANTS: tuple[str, ...] = ("beta=0", "gamma=0", "negatives=none")


def reproduction_report(batch_dir) -> ReproductionReport:
    """Aggregate the finished runs of a reproduction batch folder (grids ``main`` and ``ablation``)."""
    records = load_runs(batch_dir)
    done = [r for r in records if r.status == RunStatus.DONE]
    main = [r for r in done if r.grid == "main"]
    ablation = [r for r in done if r.grid == "ablation"]
    ablation_seeds = {r.seed for r in ablation} or {"0"}
    excluded: list[tuple[RunRecord, str]] = []  # runs whose metrics.json contradicts their run.json
    setups, ablations = table1(main, excluded=excluded), table1(ablation, excluded=excluded)
    main = [r for r in main if r.conflict is None]
    # any spelling of the setup label ("mlcl_aug", "MLCL+AUG"): the ablations are compared with their own seed(s)
    reference = table1([r for r in main if canonical_setup(r.setup) == "MLCL+AUG"
                                and r.seed in ablation_seeds])
    sizes = sorted({int(r.metrics.get("test_num_samples", 0)) for r in done} - {0})
    num_test = sizes[0] if sizes else 1
    # several reference rows (MLCL+AUG's runs differ in a setting): none is picked; those claims are not judged
    by_variant = {f"MLCL+AUG {v}": reference[0] for v in ABLATION_VARIANTS} if len(reference) == 1 else {}
    seed_values: dict[str, list[float]] = {}
    seen: set[tuple[str, str]] = set()
    for record in main + [r for r in ablation if r.conflict is None]:
        key = _key(canonical_setup(record.setup), record.labels.get("variant"))
        if (key, record.seed) in seen:  # a run folder copied twice: table1 names the copy in the row's notes
            continue
        seen.add((key, record.seed))
        seed_values.setdefault(key, []).append(run_accuracies(record.metrics)["Average"])
    left_out = left_out_markdown(records, excluded)
    return ReproductionReport(setups, ablations, reference,
                              check_claims_setting_split_rows_aside(setups + ablations, num_test,
                                                                    reference=by_variant), num_test,
                              len(done), len(records), seed_values, left_out, tuple(sizes))


def report_markdown(report: ReproductionReport) -> str:
    """The report as Markdown: setups beside the paper, ablations, claims."""
    seeds = ", ".join(sorted({s for row in report.reference for s in row.seeds})) or "–"
    return "\n".join([
        f"{report.finished} of {report.total} runs finished; {test_sizes_phrase(report)}; "
        "accuracies in percent." + ("\n" + report.left_out.rstrip("\n") if report.left_out else ""), "",
        "### Setups (mean ± std over seeds)", "", table1_markdown(report.setups, with_paper=True), "",
        f"### MLCL+AUG ablations (seed {seeds})", "",
        table1_markdown(report.reference + report.ablations, with_paper=False), "",
        "### The paper's claims at this scale", "", claims_markdown(report.checks), ""])
