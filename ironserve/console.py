"""The `ironserve` console script: the command line with a closed pipe and Ctrl-C ending quietly.

Its own small module, so that an interrupt while the command line's modules are still importing (a second or so)
ends as quietly as one later: nothing heavy is imported before the handlers below are in place.
"""

from __future__ import annotations

import os
import sys


def run() -> int:
    """ironserve.cli.main, with `| head` closing the pipe (141) and Ctrl-C (130) ending without a traceback."""
    from .heap import freeze_at_exit

    freeze_at_exit()  # the exit skips collecting what the command leaves (an audit's 0.15 s to 0.03 s)
    try:
        from .cli import main

        code = main()
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away: nothing more can be said; stop Python flushing into the closed pipe at exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is no file (embedded, captured): nothing to flush into it
            pass
        return 141
