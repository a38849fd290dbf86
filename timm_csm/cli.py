"""What every console command of the package shares: ``setup.cfg``'s ``console_scripts`` name ``main`` functions
decorated with :func:`console_command`.

A console script runs ``sys.exit(main())``: ``None`` and ``0`` are success, any other int is the exit status, and
anything else (a folder, a dict) is printed to stderr as the "error" of exit status 1. :func:`console_command` gives
each command the same contract: exit status 0 on success, a missing optional dependency or bad input as one line
``<command>: error: ...`` (statuses 1 and 2) instead of a traceback, and its parser reachable for the documentation's
flag tables; every parser formats its ``--help`` with :class:`HelpFormatter`. A command stopped with Ctrl-C ends
through :func:`exit_interrupted`, and every command that may have started a ``torch.distributed`` process group ends
it with :func:`end_process_group`.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Callable, NoReturn, Optional, Sequence

from .extras import missing_extra, require_installed

__all__ = ["console_command", "HelpFormatter", "EXIT_MISSING_EXTRA", "EXIT_BAD_INPUT", "exit_interrupted",
           "end_process_group"]

EXIT_MISSING_EXTRA = 1
EXIT_BAD_INPUT = 2  # as argparse's own errors


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The ``--help`` of every timm-csm command: the description as written, and each option's help ending with its
    default once: not when the help says it in words (or ``BooleanOptionalAction`` added it), nor for a switch,
    which is off unless given."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or "when omitted" in text or not action.option_strings or (
                action.default is argparse.SUPPRESS) or (
                action.nargs == 0 and action.default is False):
            return text
        return f"{text} (default: {'none' if action.default in (None, '') else '%(default)s'})"


def _error(prog: str, message: str, status: int) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return status


def console_command(prog: str, build_parser: Callable, requires: Sequence[str] = ()):
    """Decorate a command's ``main(argv=None)``, which returns None (or an int exit status):

    * the decorated ``main`` returns an int, 0 on success, so that the console script's ``sys.exit`` reports success;
    * the optional dependencies in ``requires`` (names of :data:`~timm_csm.extras.OPTIONAL_DEPENDENCIES`) are
      checked (found, not imported, so that ``--help`` stays fast) before anything runs, and any other one found
      missing on the way ends the command as well: one line naming the extra that installs it, exit status 1;
    * ``ValueError`` and ``FileNotFoundError`` (bad input) are one line, exit status 2;
    * ``main.prog`` is the command's name, ``main.build_parser()`` its argument parser and ``main.requires`` the
      optional dependencies it always needs.
    """
    def decorate(main: Callable[[Optional[Sequence[str]]], Optional[int]]):
        @functools.wraps(main)
        def command(argv: Optional[Sequence[str]] = None) -> int:
            try:
                for module in requires:
                    require_installed(module, prog)
                status = main(argv)
            except ImportError as e:
                message = missing_extra(e)
                if message is None:
                    raise
                return _error(prog, message, EXIT_MISSING_EXTRA)
            except (ValueError, FileNotFoundError) as e:
                return _error(prog, str(e), EXIT_BAD_INPUT)
            if status is None:
                return 0
            if isinstance(status, bool) or not isinstance(status, int):
                raise TypeError(f"{prog}: main returned {status!r}; a command returns None or an exit status")
            return status

        command.prog, command.build_parser, command.requires = prog, build_parser, tuple(requires)
        return command

    return decorate


def exit_interrupted(message: str) -> NoReturn:
    """End a command stopped with Ctrl-C: ``interrupted: <message>`` (where the work is, how to continue) as one
    line on stderr from the main process, exit status 130 as a shell reports SIGINT, and no traceback."""
    if os.environ.get("RANK", "0") == "0":
        print(f"\ninterrupted: {message}", file=sys.stderr, flush=True)
    raise SystemExit(130)


def end_process_group() -> None:
    """Destroy the default ``torch.distributed`` process group if one is initialised (no-op otherwise).

    A process that exits with a live gloo group can abort (SIGABRT): gloo's worker thread
    (``ProcessGroupGloo::runLoop``) frees the last work object while the interpreter finalises. Entry points call
    this before they exit, also on errors, as accelerate's ``Accelerator.end_training`` does.
    """
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
