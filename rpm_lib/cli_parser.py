"""The argument parser of every ``rpm-*`` command: a mistyped argument is one line, not argparse's usage block.

argparse prints the whole usage (seven lines for ``rpm-batch``) above its one error line; the error is what the user
needs, ``--help`` has the rest.
"""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


#: Namespace attribute naming the innermost parser that was left arguments it does not know.
_UNRECOGNIZED_BY = "_one_line_unrecognized_by"


class OneLineArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are ``<prog>: error: <message> (see <prog> --help)``, exit status 2.

    Sub-command parsers made by ``add_subparsers`` are of the same class, so their errors are one line too. An
    argument a sub-command does not know is reported by the sub-command (``rpm-batch progress: error:
    unrecognized arguments: b (see rpm-batch progress --help)``): argparse reports it from the top-level parser,
    whose help does not list the sub-command's arguments.
    """

    def error(self, message: str) -> NoReturn:
        self._exit_with(self.prog, message)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        # a sub-command's parser runs inside its parent's and hands its leftovers up: the first to have any is
        # the innermost one, so a parent keeps the name already there
        if extras and not hasattr(namespace, _UNRECOGNIZED_BY):
            setattr(namespace, _UNRECOGNIZED_BY, self.prog)
        return namespace, extras

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        prog = getattr(namespace, _UNRECOGNIZED_BY, self.prog)
        if hasattr(namespace, _UNRECOGNIZED_BY):
            delattr(namespace, _UNRECOGNIZED_BY)
        if extras:
            self._exit_with(prog, f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def _exit_with(self, prog: str, message: str) -> NoReturn:
        self.exit(2, f"{prog}: error: {one_line(message)} (see {prog} --help)\n")


def one_line(message: object) -> str:
    """``message`` as one line: a line break inside a value it quotes (a path typed with one) is shown as ``\\n``,
    so an error stays the one line a user reads and a script greps."""
    return "\\n".join(str(message).splitlines())


def print_error(prog: str, message: object) -> None:
    """``<prog>: error: <message>`` on stderr, as one line: a command's error after its arguments were accepted."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
