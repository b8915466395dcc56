"""``rpm-notebook``: run one notebook headless with parameters, and say in one line what went wrong.

papermill's own command (``papermill IN OUT -p NAME VALUE``) works on rpm_lib's notebooks, but when a cell fails
it prints its own Python traceback (click, papermill) above the kernel's message, even when the message is a
one-line parameter error such as ``parameter 'lr': must be a finite number, got nan``. ``rpm-notebook`` runs the
same execution (rpm_lib's engine, ``rpm_lib.notebook_execution``) and prints::

    rpm-notebook: error: runs/lr.ipynb, cell 4: ParameterError: parameter 'lr': must be a finite number, got nan

with exit status 1; the executed notebook (with the cell's full traceback, when there is one) is at OUTPUT.
Parameters the notebook does not declare are refused before a kernel starts, with the declared ones listed.

    rpm-notebook notebooks/03_train.ipynb runs/ce.ipynb -p setup ce -p max_epochs 5
    rpm-notebook notebooks/03_train.ipynb runs/ce.ipynb -f params.yaml      # a YAML mapping of name: value

``-p`` values are text; each notebook reads them as the type its ``parameters`` cell declares (YAML for lists,
numbers and booleans). Values of ``-f`` keep their YAML types; ``-p`` wins over ``-f``.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any, Sequence

from rpm_lib.cli_parser import OneLineArgumentParser

#: Exit status when a cell failed (the notebook ran and stopped); 2 is a usage error (nothing ran).
CELL_FAILED = 1


def _fail(message: str, status: int = 2) -> int:
    print(f"rpm-notebook: error: {message}", file=sys.stderr)
    return status


def _parameters_file(path: Path) -> dict[str, Any] | str:
    """The mapping in ``path``, or a one-line description of what is wrong with it."""
    import yaml

    from rpm_lib.typed_values import load_yaml_file_text, yaml_problem

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return f"{path}: cannot be read ({type(error).__name__}: {error})"
    try:
        data = load_yaml_file_text(text)
    except yaml.YAMLError as error:
        return f"{path}: not YAML ({yaml_problem(error)})"
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        return f"{path}: expected a mapping of parameter names to values, got {type(data).__name__}"
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineArgumentParser(
        prog="rpm-notebook", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("template", type=Path, help="the notebook to run (e.g. notebooks/03_train.ipynb)")
    parser.add_argument("output", type=Path, help="where the executed notebook is written (folders are created)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="set a parameter (repeatable); the value is text, read as the declared type")
    parser.add_argument("-f", "--parameters-file", type=Path, metavar="YAML",
                        help="a YAML mapping of parameters (values keep their YAML types)")
    parser.add_argument("-k", "--kernel", default="python3", help="Jupyter kernel name (default python3)")
    parser.add_argument("--cwd", type=Path, default=None,
                        help="working folder of the kernel (default: this one; relative paths in parameters "
                             "are read from there)")
    args = parser.parse_args(argv)

    if not args.template.is_file():
        return _fail(f"{args.template}: no such notebook")
    if args.output.resolve() == args.template.resolve():
        return _fail(f"{args.output}: is the template itself; write the executed notebook elsewhere")
    if args.cwd is not None and not args.cwd.is_dir():
        return _fail(f"--cwd {args.cwd}: no such folder")
    parameters: dict[str, Any] = {}
    if args.parameters_file is not None:
        read = _parameters_file(args.parameters_file)
        if isinstance(read, str):
            return _fail(read)
        parameters.update(read)
    parameters.update({name: value for name, value in args.parameter})

    from rpm_lib.batch.config import BatchConfigError
    from rpm_lib.batch.notebook import notebook_parameters

    try:
        known = notebook_parameters(args.template)
    except BatchConfigError as error:
        return _fail(str(error))
    except Exception as error:  # not a notebook: nbformat / JSON errors
        return _fail(f"{args.template}: not a readable notebook ({type(error).__name__}: {error})")
    unknown = sorted(set(parameters) - set(known))
    if unknown:
        hints = [f"{name!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(
            name, sorted(known), n=1)) else "") for name in unknown]
        return _fail(f"{args.template}: no parameter {', '.join(hints)}; its parameters are: "
                     f"{', '.join(sorted(known))}")

    from jupyter_client.kernelspec import NoSuchKernel
    from papermill.exceptions import PapermillExecutionError

    from rpm_lib.notebook_execution import execute_notebook, kernel_log_of

    try:
        # what the kernel writes to its standard error (its own log lines, C libraries' chatter) goes to a file
        # beside the output, not between this command's lines
        execute_notebook(args.template, args.output, parameters, kernel_name=args.kernel, cwd=args.cwd,
                         kernel_stderr=kernel_log_of(args.output))
    except NoSuchKernel:
        return _fail(f"--kernel {args.kernel}: no such Jupyter kernel here (`jupyter kernelspec list` shows them)")
    except PapermillExecutionError as error:
        message = str(error.evalue).strip().splitlines()
        detail = message[-1] if message else ""
        return _fail(f"{args.output}, cell {error.exec_count}: {error.ename}: {detail}", CELL_FAILED)
    except KeyboardInterrupt:
        return _fail(f"interrupted; {args.output} holds what ran", 130)
    print(f"rpm-notebook: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
