"""Fixtures of the split tests (tests/conftest.py's apply here too)."""

import pytest

from tests.split.split_support import PROMPT


@pytest.fixture
def reference(split_reference):
    """What one split runner makes of PROMPT at temperature 0, as text, per max_tokens
    (in this folder ``reference`` is this, not the session's runner of tests/conftest.py)."""
    return lambda max_tokens: split_reference.chat(PROMPT, max_tokens)
