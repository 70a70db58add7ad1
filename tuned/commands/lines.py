"""What the operator commands (``check-config``, ``status``, ``reload``) share in how they
read their arguments and end: the exit codes, one line per problem, a seconds
argument, and a closed pipe that ends output quietly. None of them lets a traceback
reach the operator: every failure is one line naming the file, field or URL.

Exit codes: 0 ok; 2 invalid config (for reload: the running tuned refused it), bad
usage or a malformed URL; 3 nothing answers at the URL; 4 something answers, but not
with tuned's JSON (or refuses the caller: 403); 5 (reload) applied, but a changed key
needs a restart to take effect.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys

from tuned.base.inputs import CLIP_CHARS, clip_text

EXIT_OK, EXIT_INVALID, EXIT_UNREACHABLE, EXIT_BAD_ANSWER = 0, 2, 3, 4
EXIT_RESTART_NEEDED = 5


def pipe_safe(func):
    """`tuned check-config --explain | head`: a closed pipe ends output quietly."""
    @functools.wraps(func)
    def wrapper(args):
        try:
            return func(args)
        except BrokenPipeError:
            # Python's recipe: point stdout at devnull so the interpreter's final flush
            # does not raise a second time.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK
    return wrapper


def seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 <= v <= 86400):
        raise argparse.ArgumentTypeError(f"must be a number of seconds in [0, 86400], "
                                         f"got {clip_text(text)}")
    return v


def one_line(text: str) -> str:
    return clip_text(str(text), 4 * CLIP_CHARS)
