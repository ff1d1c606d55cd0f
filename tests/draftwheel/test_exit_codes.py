"""draftwheel.exit_codes: one convention for every command (2: an input the user can fix, 1: the work failed)."""

from __future__ import annotations

import pytest

from draftwheel.config import ConfigError
from draftwheel.exit_codes import FAILURE, USAGE, code_for, fail
from draftwheel.locks import LockedError
from draftwheel.tracking import ArtifactError, RegistryError


@pytest.mark.parametrize("exc, code", [
    (ConfigError("k: expected int"), USAGE),
    (ValueError("top_p must be in (0, 1]"), USAGE),
    (FileNotFoundError("logs: /x is neither a file nor a directory"), USAGE),
    (PermissionError("out: cannot write to /ro"), USAGE),
    (ArtifactError("draftwheel-draft version 3: artifacts missing"), USAGE),  # a RegistryError, but refused input
    (RegistryError("registry: connecting failed"), FAILURE),
    (LockedError("another flywheel holds the lock"), FAILURE),
    (RuntimeError("CUDA out of memory"), FAILURE),
])
def test_each_error_kind_has_one_code(exc, code):
    assert code_for(exc) == code


def test_fail_prints_one_line_naming_the_command(capsys):
    assert fail("export", PermissionError("out: cannot write\nto /ro")) == USAGE
    assert capsys.readouterr().err == "draftwheel export: out: cannot write to /ro\n"
