"""Public Python API of the built-in RAVEN / I-RAVEN generator (docs/generator.md; levels, not pixels).

Seeding: problem ``k`` of a configuration is drawn from its own stream
``np.random.default_rng(np.random.SeedSequence([seed, CONFIGURATIONS.index(configuration), k]))``, so a
problem depends only on ``(seed, configuration, k)`` -- not on how many problems or workers there are.
(Deliberate deviation from the reference, which runs one legacy-RNG stream through all configurations.)
Other deliberate deviations are listed in the module docstrings of ``sampling``, ``rows``, ``candidates`` and
``fair_candidates`` (notably: candidate sets with two render-identical candidates are redrawn).

Regimes (``regimes.py``, docs/generator.md "Generalisation regimes"): ``regime`` (a ``Regime``, a name of
``regimes.REGIMES`` such as ``"A/Color"``, or None = plain I-RAVEN) and the problem's ``split`` only change
the rule tables; rows, candidates and rendering are I-RAVEN's. Plain I-RAVEN problems do not depend on
``split`` and are bit-identical to those made before regimes existed.

Example::

    from rpm_lib.generator.api import generate_problems
    for problem in generate_problems("center_single", 10, seed=1234):
        print(problem.target, [(r.name, r.attr) for r in problem.rules])
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from rpm_lib.generator.candidate_sets import make_candidates
from rpm_lib.generator.candidates import FAIR, MODES, check_mode
from rpm_lib.generator.problem import Problem
from rpm_lib.generator.regimes import Regime, check_split, resolve_regime, split_of
from rpm_lib.generator.rows import generate_matrix
from rpm_lib.generator.sampling import RandomStream, sample_rules
from rpm_lib.rules import CONFIGURATIONS

__all__ = ["MODES", "problem_rng", "generate_problem", "generate_problems"]



def _check_configuration(configuration: str) -> None:
    if configuration not in CONFIGURATIONS:
        raise ValueError(f"unknown configuration {configuration!r}; expected one of {list(CONFIGURATIONS)}")


def problem_rng(seed: int, configuration: str, index: int) -> np.random.Generator:
    """The Generator of problem ``index`` of ``configuration`` (independent of worker count)."""
    _check_configuration(configuration)
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be non-negative, got seed={seed}, index={index}")
    return np.random.default_rng(np.random.SeedSequence([seed, CONFIGURATIONS.index(configuration), index]))


def generate_problem(
    configuration: str,
    rng: np.random.Generator,
    mode: str = "balanced",
    regime: "Regime | str | None" = None,
    split: str = "train",
) -> Problem:
    """Generate one problem (8 context panels, 8 candidates, rules) from ``rng``.

    Args:
        configuration: one of ``rpm_lib.rules.CONFIGURATIONS`` (folder names, e.g. ``"center_single"``).
        rng: the only source of randomness used.
        mode: ``"balanced"`` (I-RAVEN, fills ``Problem.modified``), ``"original"`` (RAVEN) or ``"fair"``
            (RAVEN-FAIR; ``Problem.modified`` stays None as in its files, and ``problem.extra["fair_tree"]`` holds
            the ``fair_candidates.FairTree``: each candidate's parent and path).
        regime: a ``regimes.Regime``, a registered name (``"A/Color"``, ``"I-RAVEN-Mesh"``, ...) or None
            (plain I-RAVEN). ``"I-RAVEN-Mesh"`` adds the Mesh component (docs/generator.md, "Mesh").
        split: ``"train"``, ``"val"`` (both train-like) or ``"test"`` (out of distribution); it selects the
            held-out groups' rules and changes nothing in plain I-RAVEN.

    Raises ``ValueError`` for ``mode="original"`` or ``"fair"`` with a Mesh regime (RAVEN and RAVEN-FAIR never
    had a Mesh).
    """
    _check_configuration(configuration)
    check_mode(mode, resolve_regime(regime).mesh)
    s = RandomStream.of(rng)
    rules, ranges = sample_rules(configuration, s, regime, split)
    panels = generate_matrix(configuration, rules, ranges, s)
    candidates, target, modified = make_candidates(mode, rules, ranges, panels[8], s, context=panels[:8])
    extra = {}
    if mode == FAIR:  # RAVEN-FAIR's files record no tree: keep it beside the problem, not in what is written
        extra["fair_tree"], modified = modified, None
    return Problem(
        configuration=configuration,
        context=panels[:8],
        candidates=candidates,
        target=target,
        rules=rules,
        modified=modified,
        mode=mode,
        extra=extra,
    )


def generate_problems(
    configuration: str,
    count: int,
    seed: int = 1234,
    mode: str = "balanced",
    start: int = 0,
    render: bool = False,
    regime: "Regime | str | None" = None,
    split: str | None = None,
    val: int = 2,
    test: int = 2,
) -> Iterator[Problem]:
    """Yield problems ``start .. start + count - 1`` of ``configuration``; problem k uses
    ``problem_rng(seed, configuration, k)`` and carries ``problem.extra["index"] = k`` and
    ``problem.extra["split"]``. ``render=True`` attaches ``problem.extra["image"]``, the
    ``uint8 (16, 160, 160)`` panels from ``render.render_problem``.

    ``split=None`` gives problem k the split the writer files it under, ``regimes.split_of(k, val, test)``
    (``val``/``test`` in tenths, default 2/2: k % 10 in 0-5 train, 6-7 val, 8-9 test); a split name gives
    every problem that split. ``regime`` as in :func:`generate_problem`."""
    _check_configuration(configuration)
    if count < 0 or start < 0:
        raise ValueError(f"count and start must be non-negative, got count={count}, start={start}")
    regime = resolve_regime(regime)
    if split is not None:
        check_split(split)
    split_of(0, val, test)  # checks val and test before the first problem
    render_problem = None
    if render:
        from rpm_lib.generator.render import render_problem  # lazy: OpenCV only when pixels are wanted
    for k in range(start, start + count):
        problem_split = split if split is not None else split_of(k, val, test)
        problem = generate_problem(configuration, problem_rng(seed, configuration, k), mode, regime, problem_split)
        problem.extra["index"] = k
        problem.extra["split"] = problem_split
        if render_problem is not None:
            problem.extra["image"] = render_problem(problem)
        yield problem
