"""rpm_lib.results: paper numbers, accuracy extraction, Table 1 aggregation and formatting, ablations."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from rpm_lib import results
from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES

PAPER_TEX = Path(__file__).resolve().parents[2] / "shared" / "reference" / "mlcl-paper.tex"


def _metrics(per_config: dict[str, float]) -> dict:
    return {"test_accuracy": sum(per_config.values()) / len(per_config),
            "test_accuracy_per_configuration": per_config}


def _make_run(root: Path, grid: str, labels: dict, params: dict, acc: dict | None, error: str | None = None) -> Path:
    d = root / grid / "__".join(f"{k}-{v}" for k, v in labels.items())
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"name": d.name, "grid": grid, "labels": labels, "parameters": params}))
    if acc is not None:
        (d / "metrics.json").write_text(json.dumps(_metrics(acc)))
    if error is not None:
        (d / "error.txt").write_text(error)
    return d


def test_paper_table_matches_the_tex_source():
    """Every transcribed row appears verbatim (as numbers) in the paper's LaTeX table."""
    if not PAPER_TEX.is_file():
        pytest.skip(f"paper source not found at {PAPER_TEX}")
    tex = PAPER_TEX.read_text()
    assert len(results.PAPER_TABLE1) == 18
    for row in results.PAPER_TABLE1:
        cells = [f"{row.per_configuration[c]:.1f}" for c in results.CONFIGURATION_COLUMNS]
        line = next((ln for ln in tex.splitlines() if all(f"{v}" in ln for v in cells)
                     and f"{row.average:.1f}" in ln), None)
        assert line is not None, f"{row.encoder} {row.setup} not found in the paper"
        if row.std is not None:
            assert f"\\pm {row.std:.1f}" in line
        if row.setup != results.LITERATURE:
            assert row.setup in line


def test_canonical_names_and_paper_lookup():
    assert results.canonical_setup("mlcl_aug") == "MLCL+AUG"
    assert results.canonical_setup("ce_aux_dense") == "CE+AUX-dense"
    assert results.canonical_setup("other") == "other"
    assert results.canonical_setup("mlcl_aug_ft") == "MLCL+AUG+FT"  # fine-tuned: not a Table 1 row
    assert results.paper_row("scl", "mlcl_aug_ft") is None
    assert results.canonical_setup("left") == "left"
    assert results.canonical_encoder("copinet") == "CoPINet"
    row = results.paper_row("scl", "mlcl_aug")
    assert row is not None and row.average == 96.8 and row.per_configuration["3x3Grid"] == 93.8
    assert results.paper_row("wren", "ce") is None


def test_run_accuracies_average_and_validation():
    acc = results.run_accuracies(_metrics({c: 0.5 + 0.05 * i for i, c in enumerate(CONFIGURATIONS)}))
    assert list(acc) == ["Average", *results.CONFIGURATION_COLUMNS]
    assert acc["Center"] == pytest.approx(50.0) and acc["O-IG"] == pytest.approx(80.0)
    assert acc["Average"] == pytest.approx(65.0)
    only_overall = results.run_accuracies({"test_accuracy": 0.25})
    assert only_overall == {"Average": 25.0}
    with pytest.raises(ValueError, match="not a fraction"):
        results.run_accuracies(_metrics({"center_single": 87.0}))
    with pytest.raises(ValueError, match="unknown configuration"):
        results.run_accuracies({"test_accuracy_per_configuration": {"Center": 0.5}})
    with pytest.raises(ValueError, match="no 'test_accuracy'"):
        results.run_accuracies({"val_accuracy": 0.5})


def test_table1_mean_std_over_seeds_and_order(tmp_path):
    base = {c: 0.6 for c in CONFIGURATIONS}
    for seed, shift in enumerate((0.0, 0.1)):
        acc = {c: v + shift for c, v in base.items()}
        _make_run(tmp_path, "main", {"encoder": "scl", "setup": "ce", "seed": str(seed)}, {"seed": seed}, acc)
    _make_run(tmp_path, "main", {"encoder": "hrinet", "setup": "MLCL", "seed": "0"}, {}, base)
    _make_run(tmp_path, "main", {"encoder": "scl", "setup": "MLCL+AUG", "seed": "0"}, {}, base)
    _make_run(tmp_path, "main", {"encoder": "scl", "setup": "mlcl", "seed": "9"}, {}, None, error="boom\nKeyError: x")
    records = results.load_runs(tmp_path)
    assert [r.status for r in records].count("failed") == 1
    rows = results.table1(records)
    assert [(r.encoder, r.setup) for r in rows] == [("SCL", "CE"), ("SCL", "MLCL+AUG"), ("HriNet", "MLCL")]
    ce = rows[0]
    assert ce.average == pytest.approx(65.0)
    assert ce.std == pytest.approx(math.sqrt(((60 - 65) ** 2 + (70 - 65) ** 2) / 1))
    assert ce.per_configuration["Center"] == pytest.approx(65.0) and sorted(ce.seeds) == ["0", "1"]
    assert ce.paper is not None and ce.paper.average == 82.8
    assert math.isnan(rows[1].std)

    md = results.table1_markdown(rows)
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert lines[0].startswith("| Encoder | Setup |") and len(lines) == 2 + 3
    assert "| SCL | CE | – | 2 | 65.0 ± 7.1 | 82.8 ± 0.7 | -17.8 | 65.0 (99.0) |" in md
    assert "60.0 ± –" in md

    path = results.write_table1(rows, tmp_path / "t.csv")
    parsed = list(csv.DictReader(path.open()))
    assert parsed[0]["paper_Center"] == "99.0" and float(parsed[0]["Center"]) == pytest.approx(65.0)

    header, table = results.runs_table(records)
    assert header[:3] == ["name", "grid", "status"] and header[-1] == "error"
    failed = [r for r in table if r[2] == "failed"][0]
    assert failed[-1] == "KeyError: x"


def test_predrnet_rows_sit_beside_its_own_publication_not_the_mlcl_paper(tmp_path):
    """PredRNet is not in the MLCL paper: a CE row shows the PredRNet README's 96.5 (average only) and says whose."""
    assert results.paper_row("predrnet", "ce").source == "PredRNet README (ICML 2023)"
    assert results.paper_row("PredRNet", "mlcl_aug") is None
    acc = {c: 0.9 for c in CONFIGURATIONS}
    _make_run(tmp_path, "main", {"encoder": "predrnet", "setup": "ce", "seed": "0"}, {}, acc)
    _make_run(tmp_path, "main", {"encoder": "scl", "setup": "ce", "seed": "0"}, {}, acc)
    rows = results.table1(results.load_runs(tmp_path))
    assert [(r.encoder, r.setup) for r in rows] == [("SCL", "CE"), ("PredRNet", "CE")]
    md = results.table1_markdown(rows)
    assert "| PredRNet | CE | – | 1 | 90.0 ± – | 96.5 ± – | -6.5 | 90.0 (–) |" in md
    assert "PredRNet README (ICML 2023)'s, not the MLCL paper's" in md
    parsed = list(csv.DictReader(results.write_table1(rows, tmp_path / "t.csv").open()))
    assert parsed[1]["paper_average"] == "96.5" and parsed[1]["paper_Center"] == ""


def test_table1_keeps_other_labels_apart(tmp_path):
    acc = {c: 0.5 for c in CONFIGURATIONS}
    for data in ("iraven", "raven"):
        _make_run(tmp_path, "main", {"encoder": "scl", "setup": "ce", "data": data, "seed": "0"}, {}, acc)
    rows = results.table1(results.load_runs(tmp_path))
    assert [r.group for r in rows] == [{"data": "iraven"}, {"data": "raven"}]


def test_ablation_series_groups_by_parameter(tmp_path):
    for beta, seeds in ((0.0, (0.3, 0.4)), (10.0, (0.8,))):
        for seed, value in enumerate(seeds):
            _make_run(tmp_path, "beta", {"encoder": "scl", "setup": "mlcl", "beta": str(beta), "seed": str(seed)},
                      {"beta": beta}, {c: value for c in CONFIGURATIONS})
    _make_run(tmp_path, "main", {"encoder": "scl", "setup": "mlcl", "seed": "0"}, {"beta": 10.0},
              {c: 0.1 for c in CONFIGURATIONS})  # not an ablation run: ignored
    series = results.ablation_series(results.load_runs(tmp_path), "beta")
    assert list(series) == ["SCL MLCL"]
    pts = series["SCL MLCL"]
    assert [p.value for p in pts] == [0.0, 10.0]
    assert pts[0].mean == pytest.approx(35.0) and pts[0].seeds == 2 and pts[1].mean == pytest.approx(80.0)


def test_load_run_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        results.load_run(tmp_path / "nope")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad[/\\]metrics.json: not valid JSON"):
        results.load_run(bad)


def test_markdown_table_escapes_and_checks_width():
    md = results.markdown_table(["a", "b"], [["x|y", 1]])
    assert md.splitlines()[2] == "| x\\|y | 1 |"
    with pytest.raises(ValueError, match="2 cells"):
        results.markdown_table(["a"], [["x", "y"]])


def test_short_names_cover_configuration_columns():
    assert results.CONFIGURATION_COLUMNS == tuple(SHORT_NAMES[c] for c in CONFIGURATIONS)


def test_fine_tuned_runs_never_share_a_row_with_linear_evaluation(tmp_path):
    """A run whose metrics.json says protocol fine_tuned (the release's phase 3) gets its own +FT row, even when
    its grid label is the plain setup; one without the key but with finetune in its config too."""
    acc = {c: 0.9 for c in CONFIGURATIONS}
    linear = _make_run(tmp_path, "main", {"encoder": "scl", "setup": "mlcl", "seed": "0"}, {}, acc)
    tuned = _make_run(tmp_path, "main", {"encoder": "scl", "setup": "mlcl", "seed": "1"}, {}, acc)
    older = _make_run(tmp_path, "main", {"encoder": "scl", "setup": "mlcl", "seed": "2"}, {}, acc)
    for run, extra in ((linear, {"protocol": "linear_evaluation"}), (tuned, {"protocol": "fine_tuned"}),
                       (older, {"config": {"finetune": True}})):
        (run / "metrics.json").write_text(json.dumps({**_metrics(acc), **extra}))
    records = {r.seed: r for r in results.load_runs(tmp_path)}
    assert [records[s].protocol for s in "012"] == ["linear_evaluation", "fine_tuned", "fine_tuned"]
    rows = results.table1(list(records.values()))
    assert [(r.setup, sorted(r.seeds)) for r in rows] == [("MLCL", ["0"]), ("MLCL+FT", ["1", "2"])]
    assert rows[0].paper is not None and rows[1].paper is None  # only linear evaluation is compared with Table 1
