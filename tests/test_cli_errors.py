"""A mistyped command-line argument is one line on stderr (exit status 2) in every rpm_lib command."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import rpm_lib

COMMANDS = [  # (module with main(argv), prog as the line names it, bad arguments)
    ("rpm_lib.training.cli", "rpm-train", ["--bogus"]),
    ("rpm_lib.batch.cli", "rpm-batch", ["--time-budget", "soon", "grid.yaml"]),
    ("rpm_lib.batch.cli", "rpm-batch", []),
    ("rpm_lib.batch.cli", "rpm-batch pack", ["--compact"]),
    ("rpm_lib.batch.cli", "rpm-batch unpack", ["a.tar", "--out"]),
    # an argument the sub-command does not know: its own help, not the top level's, lists what it takes
    ("rpm_lib.batch.cli", "rpm-batch progress", ["a", "b"]),
    ("rpm_lib.batch.cli", "rpm-batch pack", ["a", "--out", "b.tar.gz", "--bogus"]),
    ("rpm_lib.data.cli", "rpm-data", ["nope"]),
    ("rpm_lib.data.cli", "rpm-data prepare", ["raw", "--out", "cache", "--bogus"]),
    ("rpm_lib.generator.cli", "rpm-generate", ["--count", "many", "--out", "x"]),
    ("rpm_lib.notebook_cli", "rpm-notebook", ["only-one.ipynb"]),
    ("rpm_lib.demo", "python -m rpm_lib.demo", ["--train-size", "big"]),
    ("rpm_lib.generator.bias", "python -m rpm_lib.generator.bias", ["--count", "q"]),
]


@pytest.mark.parametrize(("module", "prog", "argv"), COMMANDS, ids=[f"{p} {' '.join(a)}" for _, p, a in COMMANDS])
def test_a_bad_argument_is_one_line_naming_the_command(module: str, prog: str, argv: list[str],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    sub = prog.split()[1:] if prog.startswith(("rpm-batch ", "rpm-data ")) else []
    with pytest.raises(SystemExit) as ended:
        importlib.import_module(module).main([*sub, *argv])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{prog}: error: ") and err.rstrip().endswith(f"(see {prog} --help)"), err


def test_every_parser_in_the_package_is_the_one_line_kind() -> None:
    # a new command made with argparse.ArgumentParser would print the usage block again
    package = Path(rpm_lib.__file__).parent
    plain = [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
             if path.name != "cli_parser.py" and re.search(r"\bArgumentParser\(", path.read_text())]
    assert plain == [], f"use rpm_lib.cli_parser.OneLineArgumentParser in {plain}"
