"""The MLCL paper's published numbers, and the paper's names for encoders and setups.

Owns Table 1 of the paper (``PAPER_TABLE1``: test accuracy in percent on Balanced-RAVEN / I-RAVEN, per encoder and
training setup, with the best result reported in the literature), the ablation averages quoted in its text
(``PAPER_ABLATIONS``), the table's column and row names, and the translation of any spelling of an encoder or
setup name into the paper's (``canonical_encoder``, ``canonical_setup``), so that runs and published rows meet.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES
from rpm_lib.training.setups import SETUPS

#: Table 1 configuration columns, in the paper's order (``Center`` .. ``O-IG``).
CONFIGURATION_COLUMNS: tuple[str, ...] = tuple(SHORT_NAMES[c] for c in CONFIGURATIONS)

#: The paper's training setups (Table 1 row names), from the setup registry.
SETUP_LABELS: tuple[str, ...] = tuple(spec.label for spec in SETUPS.values())

#: Encoder registry names -> the paper's spelling.
ENCODER_NAMES: dict[str, str] = {"scl": "SCL", "hrinet": "HriNet", "copinet": "CoPINet", "wren": "WReN",
                                 "predrnet": "PredRNet"}

#: Row label of the "best result reported in the literature" rows of Table 1.
LITERATURE = "literature"


@dataclass(frozen=True)
class PaperRow:
    """One row of the paper's Table 1 (test accuracy on Balanced-RAVEN / I-RAVEN, percent).

    Attributes:
        encoder: paper spelling, e.g. ``"SCL"``.
        setup: one of ``SETUP_LABELS`` or ``LITERATURE``.
        average: "Average" column.
        std: "± Std" over 4 seeds; ``None`` for literature rows.
        per_configuration: short configuration name (``CONFIGURATION_COLUMNS``) -> accuracy; only the
            configurations the source reports (all 7 in the MLCL paper).
        source: where the numbers are published, when not the MLCL paper's Table 1.
    """

    encoder: str
    setup: str
    average: float
    std: float | None
    per_configuration: dict[str, float]
    source: str | None = None


def _paper_row(encoder: str, setup: str, average: float, std: float | None, *cells: float) -> PaperRow:
    if len(cells) != len(CONFIGURATION_COLUMNS):
        raise ValueError(f"paper row {encoder}/{setup}: expected {len(CONFIGURATION_COLUMNS)} cells, got {len(cells)}")
    return PaperRow(encoder, setup, average, std, dict(zip(CONFIGURATION_COLUMNS, cells)))


#: Table 1 of the paper, transcribed from ``mlcl-paper.tex`` (``tab:balanced-raven``).
PAPER_TABLE1: tuple[PaperRow, ...] = (
    _paper_row("SCL", "CE", 82.8, 0.7, 99.0, 80.3, 74.7, 83.9, 84.4, 87.3, 69.8),
    _paper_row("SCL", "CE+AUX-dense", 86.9, 3.5, 98.9, 86.9, 80.6, 88.4, 88.8, 92.0, 72.7),
    _paper_row("SCL", "CE+AUX-sparse", 95.9, 0.3, 99.8, 97.0, 91.8, 99.1, 99.1, 98.7, 85.8),
    _paper_row("SCL", "MLCL", 95.7, 0.5, 99.6, 96.4, 90.7, 99.2, 99.1, 99.1, 85.9),
    _paper_row("SCL", "MLCL+AUG", 96.8, 0.4, 99.8, 97.6, 93.8, 99.3, 99.4, 99.1, 88.9),
    _paper_row("SCL", LITERATURE, 95.0, None, 99.0, 96.2, 89.5, 97.9, 97.1, 97.6, 87.7),
    _paper_row("HriNet", "CE", 50.6, 1.3, 66.3, 41.0, 35.6, 56.0, 54.9, 58.5, 41.8),
    _paper_row("HriNet", "CE+AUX-dense", 51.6, 1.5, 75.7, 41.2, 36.5, 55.0, 55.4, 57.0, 40.2),
    _paper_row("HriNet", "CE+AUX-sparse", 57.0, 1.6, 84.5, 43.2, 36.9, 65.4, 66.1, 60.5, 42.6),
    _paper_row("HriNet", "MLCL", 56.2, 1.5, 78.9, 44.5, 38.2, 64.4, 64.1, 60.5, 42.9),
    _paper_row("HriNet", "MLCL+AUG", 65.7, 2.4, 94.4, 57.3, 46.8, 75.3, 76.0, 64.2, 45.8),
    _paper_row("HriNet", LITERATURE, 63.9, None, 80.1, 53.3, 46.0, 72.8, 74.5, 71.0, 49.6),
    _paper_row("CoPINet", "CE", 44.8, 0.8, 53.6, 35.9, 30.2, 51.0, 52.1, 51.1, 39.9),
    _paper_row("CoPINet", "CE+AUX-dense", 32.2, 1.9, 37.1, 30.1, 27.6, 33.4, 35.8, 33.3, 28.0),
    _paper_row("CoPINet", "CE+AUX-sparse", 46.8, 2.3, 52.7, 37.6, 34.2, 52.6, 55.7, 55.5, 39.0),
    _paper_row("CoPINet", "MLCL", 57.1, 0.4, 68.5, 42.8, 36.3, 68.8, 71.4, 68.7, 42.9),
    _paper_row("CoPINet", "MLCL+AUG", 58.0, 0.4, 68.3, 44.6, 38.9, 69.0, 71.7, 69.0, 44.4),
    _paper_row("CoPINet", LITERATURE, 46.3, None, 54.4, 33.4, 30.1, 56.8, 55.6, 54.3, 39.0),
)

#: Published I-RAVEN results of encoders the MLCL paper did not train, beside the runs of the same encoder and setup
#: as "paper" numbers (the row's ``source`` says whose). PredRNet: the official README at its ICML 2023 release
#: (ZjjConan/AVR-PredRNet, commit 0005ec3): I-RAVEN 96.5 %, trained with its own per-answer binary cross-entropy,
#: average over configurations only (its 2025 update reports 97.2 % with other settings).
OTHER_PUBLISHED_ROWS: tuple[PaperRow, ...] = (
    PaperRow("PredRNet", "CE", 96.5, None, {}, source="PredRNet README (ICML 2023)"),
)

#: Ablation numbers quoted in the paper's text (Sec. "Ablation study"), average test accuracy in percent.
#: ``beta=0``: contrastive loss only; ``gamma=0``: auxiliary loss only; ``no_choice_negatives``: MLCL
#: without the incorrectly-completed RPMs as extra negatives.
PAPER_ABLATIONS: dict[str, dict[str, float]] = {
    "beta=0": {"SCL": 35.3, "HriNet": 20.7, "CoPINet": 19.0},
    "gamma=0": {"SCL": 46.7, "HriNet": 31.9, "CoPINet": 24.2},
    "no_choice_negatives": {"SCL": 58.0, "HriNet": 37.2, "CoPINet": 26.5},
}


def _squash(name: str) -> str:
    """Lower-case and drop everything but letters and digits: ``"CE+AUX-dense"`` -> ``"ceauxdense"``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


_SETUP_BY_SQUASHED = {_squash(s): s for s in SETUP_LABELS}
_ENCODER_BY_SQUASHED = {_squash(k): v for k, v in ENCODER_NAMES.items()}


def canonical_setup(name: str) -> str:
    """The paper's spelling of a setup name (``"mlcl_aug"`` -> ``"MLCL+AUG"``); unknown names are returned as is.

    A fine-tuned variant keeps its suffix (``"mlcl_aug_ft"`` -> ``"MLCL+AUG+FT"``): it is not a Table 1 row.
    """
    squashed = _squash(name)
    if squashed.endswith("ft") and squashed[:-2] in _SETUP_BY_SQUASHED:
        return _SETUP_BY_SQUASHED[squashed[:-2]] + "+FT"
    return _SETUP_BY_SQUASHED.get(squashed, name)


def canonical_encoder(name: str) -> str:
    """The paper's spelling of an encoder name (``"copinet"`` -> ``"CoPINet"``); unknown names are returned as is."""
    return _ENCODER_BY_SQUASHED.get(_squash(name), name)


def paper_row(encoder: str, setup: str) -> PaperRow | None:
    """The published row for ``(encoder, setup)`` (any spelling): the paper's Table 1, else
    ``OTHER_PUBLISHED_ROWS``; ``None`` when neither has one."""
    enc, stp = canonical_encoder(encoder), canonical_setup(setup)
    for row in PAPER_TABLE1 + OTHER_PUBLISHED_ROWS:
        if row.encoder == enc and row.setup == stp:
            return row
    return None


