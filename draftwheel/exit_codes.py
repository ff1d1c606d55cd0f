"""The exit codes every `draftwheel` command returns, and the one-line error printed with them.

`USAGE` (2): the command refused what it was given, and the user can fix it — a flag, a config field, an
input file, an output path that cannot be written, a model dir or registry version refused as unusable.
`FAILURE` (1): the work itself failed — a stage of a flow, the registry (unreachable, or without the version
or alias asked for), a lock held by another run. `shadow`'s reject verdict (3) is a decision, not an error.
This module does not catch anything: each command maps its own exceptions onto these two codes.
"""

from __future__ import annotations

import sys

from draftwheel.tracking import ArtifactError

USAGE = 2
FAILURE = 1

# What the commands' input checks raise: a bad value (ValueError, incl. ConfigError), a path that is missing
# or cannot be written (OSError), a registry version whose files are unusable (ArtifactError, though a
# RegistryError). Anything else reaching a command is a failure of the work.
INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, ArtifactError)


def code_for(exc: BaseException) -> int:
    """`USAGE` for an input the user can fix, else `FAILURE`."""
    return USAGE if isinstance(exc, INPUT_ERRORS) else FAILURE


def fail(command: str, exc: BaseException) -> int:
    """Print `draftwheel COMMAND: message` as one line on stderr; return the exit code `exc` means."""
    print(f"draftwheel {command}: {' '.join(str(exc).split())}", file=sys.stderr)
    return code_for(exc)
