"""A problem's 8 candidates in any mode: the one entry point the generator calls (``make_candidates``).

It picks the procedure of the mode (``candidates.balanced_candidates`` for I-RAVEN and the Mesh modes,
``candidates.original_candidates`` for RAVEN, ``fair_candidates.fair_candidates`` for RAVEN-FAIR) and draws the set
again while two candidates would look identical (``lookalikes``). See docs/generator.md, "Candidate sets".
"""
from __future__ import annotations

from rpm_lib.generator.candidates import FAIR, MESH_FAITHFUL, balanced_candidates, check_mode, original_candidates
from rpm_lib.generator.constants import has_mesh
from rpm_lib.generator.fair_candidates import FairTree, NoCandidateToGrow, fair_candidates
from rpm_lib.generator.lookalikes import has_hidden_lookalikes, has_lookalikes
from rpm_lib.generator.problem import Panel, Rule
from rpm_lib.generator.sampling import ComponentRanges, RandomStream

__all__ = ["MAX_REDRAWS", "make_candidates"]

#: Candidate sets drawn at most for one problem before giving up (look-alikes are rare: a few percent of the sets of
#: one configuration at most).
MAX_REDRAWS = 100


def make_candidates(
    mode: str, rules: list[Rule], ranges: list[ComponentRanges], answer: Panel, s: RandomStream,
    context: list[Panel] | None = None,
) -> tuple[list[Panel], int, list[list[tuple[int, str]]] | FairTree | None]:
    """Candidates in ``mode`` ("balanced", "original", "fair" or, with the Mesh, "mesh-faithful"), redrawn while two
    of them would look identical. ``context``: the 8 context panels, needed in fair mode (its solver check).

    Returns ``(candidates, target, modified)``: ``modified`` is the per-candidate path of the balanced tree, ``None``
    in original mode, and in fair mode the :class:`FairTree` (parents and paths; the files store neither).
    Raises ``ValueError`` for an unknown mode, for original or fair candidates of a Mesh problem and for fair mode
    without ``context``.
    """
    mesh = has_mesh(r.layout.name for r in ranges)
    check_mode(mode, mesh)
    if mode == FAIR and (context is None or len(context) != 8):
        raise ValueError("fair (RAVEN-FAIR) candidates need the 8 context panels: make_candidates(..., context=)")
    for _ in range(MAX_REDRAWS):
        if mode == FAIR:
            try:
                candidates, target, modified = fair_candidates(rules, ranges, answer, context, s)
            except NoCandidateToGrow:  # the reference stops the whole run here; we draw the set again
                continue
        elif mode != "original":
            candidates, target, modified = balanced_candidates(rules, ranges, answer, s, mode == MESH_FAITHFUL)
        else:
            (candidates, target), modified = original_candidates(rules, ranges, answer, s), None
        if not has_lookalikes(candidates) and not (mesh and has_hidden_lookalikes(candidates)):
            return candidates, target, modified
    raise RuntimeError(f"could not draw {mode} candidates without look-alikes in {MAX_REDRAWS} attempts")
