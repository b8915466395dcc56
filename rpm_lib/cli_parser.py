"""The argument parser of every ``rpm-*`` command: a mistyped argument is one line, not argparse's usage block.

argparse prints the whole usage (seven lines for ``rpm-batch``) above its one error line; the error is what the user
needs, ``--help`` has the rest.
"""
from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are ``<prog>: error: <message> (see <prog> --help)``, exit status 2.

    Sub-command parsers made by ``add_subparsers`` are of the same class, so their errors are one line too.
    """

    def error(self, message: str) -> NoReturn:
        # a line break inside a value the message quotes (a path typed with one) would make it two lines
        message = "\\n".join(message.splitlines())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
