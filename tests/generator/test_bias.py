"""Context-blind bias probe: chance on I-RAVEN (balanced), far above chance on RAVEN (original); its command line
refuses a bad count or seed in one line."""
from __future__ import annotations

import numpy as np
import pytest

from rpm_lib.generator.bias import CHANCE, chance_interval, context_blind_choice, main, run_probe
from rpm_lib.generator.problem import ComponentPanel, Entity, Panel

COUNT = 2000


@pytest.fixture(scope="module")
def results():
    return {mode: run_probe(mode, COUNT, seed=1234) for mode in ("balanced", "original")}


def test_balanced_candidates_give_chance_accuracy(results) -> None:
    low, high = chance_interval(COUNT)
    assert low < CHANCE < high
    result = results["balanced"]
    assert result.total == COUNT
    assert sum(seen for _, seen in result.per_configuration.values()) == COUNT
    assert low <= result.accuracy <= high, result.accuracy


def test_original_candidates_are_solved_context_blind(results) -> None:
    _, high = chance_interval(COUNT)
    assert results["original"].accuracy > max(0.8, high)


def panel(type_level: int, size: int, color: int, slots=(0,)) -> Panel:
    return Panel([ComponentPanel("Distribute_Four", 0, list(slots),
                                 [Entity(type_level, size, color, 0) for _ in slots])])


def test_choice_picks_the_mode_and_breaks_ties_at_random() -> None:
    answer = panel(2, 3, 4)
    one_off = [panel(3, 3, 4), panel(2, 4, 4), panel(2, 3, 5), panel(2, 3, 4, (1,)),
               panel(4, 3, 4), panel(2, 1, 4), panel(2, 3, 6)]
    rng = np.random.default_rng(0)
    for position in range(8):
        candidates = one_off[:position] + [answer] + one_off[position:]
        assert context_blind_choice(candidates, rng) == position
    # a 2x2x2 cube over Type, Size, Color: every candidate ties, so choices spread over all 8
    cube = [panel(2 + t, 3 + s, 4 + c) for t in (0, 1) for s in (0, 1) for c in (0, 1)]
    picks = {context_blind_choice(cube, rng) for _ in range(200)}
    assert picks == set(range(8))


def test_script_prints_both_modes_and_the_interval(capsys) -> None:
    assert main(["--count", "70", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "99% binomial interval" in out
    assert "balanced" in out and "original" in out
    assert out.count("%") >= 2 + 2 * 7


@pytest.mark.parametrize("argv", [["--count", "0"], ["--count", "-1"], ["--seed", "-1", "--count", "1"]])
def test_bias_probe_refuses_a_bad_count_or_seed_in_one_line(capsys: pytest.CaptureFixture[str],
                                                            argv: list[str]) -> None:
    # a ValueError traceback after printing the probe's header
    from rpm_lib.generator import bias

    with pytest.raises(SystemExit) as stopped:
        bias.main([*argv, "--configuration", "center_single"])
    assert stopped.value.code == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "Warning" not in line]
    assert len(err) == 1 and err[0].startswith("python -m rpm_lib.generator.bias: error: --"), err
