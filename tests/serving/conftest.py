"""Fixtures for the serving tests."""

from __future__ import annotations

import pytest

from serving.toy import tiny_pair


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(target_dir, draft_dir): an independent random tiny target and draft sharing one tokenizer."""
    return tiny_pair(tmp_path_factory.mktemp("pair"))
