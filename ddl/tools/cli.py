"""What every ddl command shares: sizes as arguments (``64K``, ``64KiB``, ``64KB``), and bad input answered with
one line and exit status 2 instead of a traceback."""
from __future__ import annotations

import argparse
import functools
import json
import sys

from ..errors import DDLError
from ..units import parse_size

USAGE_ERROR = 2


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line: ``prog: message (see prog --help)``, exit status 2."""

    def error(self, message: str):
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def size(text: str) -> int:
    """argparse type for a size in bytes."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def one_line_errors(prog: str):
    """Wraps a CLI's main: DDLError, ValueError, OSError, KeyError, TypeError and bad JSON become
    ``prog: message`` on stderr and exit status 2; Ctrl-C exits 130."""
    def wrap(main):
        @functools.wraps(main)
        def guarded(*args, **kwargs) -> int:
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                return 130
            except (DDLError, ValueError, OSError, KeyError, TypeError, json.JSONDecodeError, RecursionError) as e:
                text = " ".join(str(e).split()) or type(e).__name__
                print(f"{prog}: {text}", file=sys.stderr)
                return USAGE_ERROR
        return guarded
    return wrap
