"""rpm_lib.results.claims: the paper's orderings checked on aggregated runs (synthetic run folders), also when rows
of several encoders share a setup, seeds collapse to one accuracy, a seed was copied or a run is damaged."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from gathered_runs import run_metrics, write_run
from rpm_lib import results
from rpm_lib.results import claims
from rpm_lib.rules import CONFIGURATIONS

#: Synthetic test accuracies (fractions) per (setup or ablation variant, seed), chosen so that some claims
#: hold clearly, one is within noise and some are reversed.
FAKE_ACCURACY = {
    "ce": (0.30, 0.31, 0.29),
    "ce_aux_dense": (0.40, 0.41, 0.39),
    "ce_aux_sparse": (0.35, 0.36, 0.34),     # below dense: "sparse > dense" does not hold
    "mlcl": (0.50, 0.52, 0.48),
    "mlcl_aug": (0.60, 0.61, 0.59),
    "beta=0": (0.45,),
    "gamma=0": (0.598,),                     # within noise of MLCL+AUG's seed 0
    "negatives=none": (0.65,),               # better: "removing negatives hurts" does not hold
}


def _write_run(folder: Path, grid: str, labels: dict, parameters: dict, accuracy: float, num_test: int = 700) -> None:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"name": folder.name, "grid": grid, "labels": labels,
                                                 "parameters": parameters}))
    (folder / "metrics.json").write_text(json.dumps({
        "test_accuracy": accuracy, "test_num_samples": num_test,
        "test_accuracy_per_configuration": {c: accuracy for c in CONFIGURATIONS}}))


def write_fake_reproduction_batch(root: Path) -> Path:
    """A batch folder laid out like ``configs/reproduction_cpu.yaml``'s, with FAKE_ACCURACY as results."""
    for setup in ("ce", "ce_aux_dense", "ce_aux_sparse", "mlcl", "mlcl_aug"):
        for seed, acc in enumerate(FAKE_ACCURACY[setup]):
            _write_run(root / "main" / f"setup-{setup}__seed-{seed}", "main", {"setup": setup, "seed": str(seed)},
                       {"setup": setup, "seed": seed, "encoder": "scl"}, acc)
    for variant in ("beta=0", "gamma=0", "negatives=none"):
        _write_run(root / "ablation" / f"variant-{variant}__seed-0", "ablation", {"variant": variant, "seed": "0"},
                   {"setup": "mlcl_aug", "seed": 0, "encoder": "scl"}, FAKE_ACCURACY[variant][0])
    return root


def _checks(tmp_path: Path) -> dict[tuple[str, str], claims.ClaimCheck]:
    records = results.load_runs(write_fake_reproduction_batch(tmp_path))
    main = [r for r in records if r.grid == "main"]
    rows = results.table1(main) + results.table1([r for r in records if r.grid == "ablation"])
    seed0 = results.table1([r for r in main if r.setup == "mlcl_aug" and r.seed == "0"])[0]
    reference = {f"MLCL+AUG {v}": seed0 for v in ("beta=0", "gamma=0", "negatives=none")}
    return {(c.better, c.worse): c for c in claims.check_claims(rows, 700, reference=reference)}


def test_verdicts_follow_the_differences(tmp_path):
    checks = _checks(tmp_path)
    assert checks[("CE+AUX-sparse", "CE")].verdict == claims.HOLDS
    assert checks[("CE+AUX-sparse", "CE+AUX-dense")].verdict == claims.FAILS
    assert checks[("MLCL+AUG", "MLCL")].verdict == claims.HOLDS
    assert checks[("MLCL+AUG", "MLCL+AUG beta=0")].verdict == claims.HOLDS
    assert checks[("MLCL+AUG", "MLCL+AUG gamma=0")].verdict == claims.WEAK
    assert checks[("MLCL+AUG", "MLCL+AUG negatives=none")].verdict == claims.FAILS


def test_differences_and_standard_errors(tmp_path):
    checks = _checks(tmp_path)
    check = checks[("MLCL+AUG", "MLCL")]
    assert abs(check.difference - 10.0) < 1e-9
    # seed means: std 1.0 and 2.0 over 3 seeds -> SE of the difference sqrt(1/3 + 4/3)
    assert abs(check.standard_error - (5 / 3) ** 0.5) < 1e-9
    single = checks[("MLCL+AUG", "MLCL+AUG gamma=0")]
    # one seed on each side: binomial errors over 700 test problems
    expected = 100 * ((0.6 * 0.4 / 700) + (0.598 * 0.402 / 700)) ** 0.5
    assert abs(single.standard_error - expected) < 1e-9


def test_missing_rows_are_reported_not_guessed(tmp_path):
    records = [r for r in results.load_runs(write_fake_reproduction_batch(tmp_path)) if r.setup != "mlcl"]
    checks = claims.check_claims(results.table1([r for r in records if r.grid == "main"]), 700)
    missing = [c for c in checks if c.verdict == claims.MISSING]
    assert {c.worse for c in missing} >= {"MLCL", "MLCL+AUG beta=0"}
    assert "not measured" in claims.claims_markdown(checks)


def test_runs_tested_on_different_numbers_of_problems_are_judged_on_the_smallest(tmp_path):
    root = write_fake_reproduction_batch(tmp_path)
    for metrics in (root / "main").glob("setup-ce__seed-*/metrics.json"):
        record = json.loads(metrics.read_text())
        record["test_num_samples"] = 14000  # CE's runs tested on far more problems than the others' 700
        metrics.write_text(json.dumps(record))
    report = claims.reproduction_report(root)
    assert report.num_test == 700 and report.test_sizes == (700, 14000)
    text = claims.report_markdown(report)
    assert "700 to 14000 test problems per run (the claims' errors use the smallest, 700)" in text
    same = claims.reproduction_report(write_fake_reproduction_batch(tmp_path / "same"))
    assert same.num_test == 700 and "; 700 test problems per run;" in claims.report_markdown(same)


@pytest.mark.parametrize("split_setup", ["ce", "mlcl_aug"])
def test_a_setup_whose_runs_differ_in_a_setting_is_not_judged_and_the_rest_are(tmp_path, split_setup):
    root = write_fake_reproduction_batch(tmp_path)
    metrics = root / "main" / f"setup-{split_setup}__seed-0" / "metrics.json"
    record = json.loads(metrics.read_text())
    record["test_num_samples"] = 14000  # one seed tested on another test set: table1 gives it a row of its own
    metrics.write_text(json.dumps(record))
    report = claims.reproduction_report(root)
    label = {"ce": "CE", "mlcl_aug": "MLCL+AUG"}[split_setup]
    assert sum(claims.row_key(r) == label for r in report.setups) == 2
    for check in report.checks:
        # an ablation is compared with MLCL+AUG's run of its own seed, one row however the other seeds differ
        touches = label in (check.better, check.worse) and not check.worse.startswith("MLCL+AUG ")
        assert (check.verdict == claims.SPLIT) == touches, check
    assert any(c.verdict == claims.HOLDS for c in report.checks)
    assert claims.SPLIT in claims.report_markdown(report)


def _row(setup: str, averages: list[float], encoder: str = "SCL") -> results.Table1Row:
    mean = sum(averages) / len(averages)
    std = (math.sqrt(sum((a - mean) ** 2 for a in averages) / (len(averages) - 1)) if len(averages) > 1
           else math.nan)
    return results.Table1Row(encoder, setup, {}, [str(i) for i in range(len(averages))], mean, std, {})


def test_claims_refuse_rows_of_several_encoders_sharing_a_setup():
    # by_key kept the last row of each setup: SCL's sparse > dense was decided by CoPINet's numbers
    rows = [_row("CE+AUX-sparse", [90, 91]), _row("CE+AUX-dense", [80, 81]),
            _row("CE+AUX-sparse", [30, 31], "CoPINet"), _row("CE+AUX-dense", [40, 41], "CoPINet")]
    with pytest.raises(ValueError, match="CE\\+AUX-sparse.*SCL.*CoPINet"):
        claims.check_claims(rows, 700)


def test_a_claim_between_seeds_of_identical_accuracy_does_not_hold_on_a_zero_error():
    # three seeds collapsed to the same accuracy: std 0, standard error 0, and 0.1 pp "held"
    rows = [_row("CE+AUX-sparse", [12.6] * 3), _row("CE", [12.5] * 3)]
    (check,) = claims.check_claims(rows, 700, [claims.CLAIMS[0]])
    assert check.standard_error > 0 and check.verdict == claims.WEAK


@pytest.mark.parametrize("num_test", [0, -5])
def test_claims_with_no_test_problems_are_one_line(num_test):
    rows = [_row("CE+AUX-sparse", [60]), _row("CE", [50])]
    with pytest.raises(ValueError, match="num_test"):
        claims.check_claims(rows, num_test)


def test_the_ablation_reference_is_found_whatever_the_spelling_of_its_setup(tmp_path):
    # a main grid labelled with the paper's spelling: no seed-0 reference, so the ablation (seed 0) was compared
    # with MLCL+AUG over all seeds, and seed 1's 90 % made "removing the auxiliary loss hurts" hold
    for seed, value in ((0, 0.41), (1, 0.9)):
        write_run(tmp_path, f"main/s{seed}", {"setup": "MLCL+AUG", "seed": str(seed)}, {"setup": "mlcl_aug"},
             run_metrics(value))
    write_run(tmp_path, "ablation/b0", {"variant": "beta=0", "seed": "0"}, {"setup": "mlcl_aug"}, run_metrics(0.4),
         grid="ablation")
    report = claims.reproduction_report(tmp_path)
    assert [r.seeds for r in report.reference] == [["0"]]
    verdicts = {c.worse: c.verdict for c in report.checks}
    assert verdicts["MLCL+AUG beta=0"] == claims.WEAK, verdicts


def test_the_reproduction_report_names_runs_it_leaves_out_and_counts_a_copied_seed_once(tmp_path):
    # "5 of 6 runs finished" said nothing of the damaged one; a copied seed was a second point of seed_values
    for seed in (0, 1):
        write_run(tmp_path, f"main/s{seed}", {"setup": "ce", "seed": str(seed)}, {"setup": "ce"}, run_metrics(0.5))
    shutil.copytree(tmp_path / "main" / "s0", tmp_path / "main" / "s0-copy")
    write_run(tmp_path, "main/s2", {"setup": "ce", "seed": "2"}, {"setup": "ce"}, "{truncated")
    write_run(tmp_path, "main/s3", {"setup": "ce", "seed": "3"}, {"setup": "ce"}, run_metrics(0.9, seed=0))  # seed 0's
    report = claims.reproduction_report(tmp_path)
    assert report.seed_values["CE"] == [50.0, 50.0]
    text = claims.report_markdown(report)
    assert "main/s2" in text and "not valid JSON" in text and "main/s0-copy not counted" in text, text
    assert "main/s3" in text and "seed=0" in text and "90.0" not in text, text


def test_claims_on_an_empty_batch_say_not_measured(tmp_path):
    report = claims.reproduction_report(tmp_path)
    assert report.finished == 0 and {c.verdict for c in report.checks} == {claims.MISSING}
    assert "not measured" in claims.report_markdown(report)
