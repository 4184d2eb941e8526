"""The tuner rewrites one literal and leaves every other byte alone."""

import pytest

from ratchet.proposers.knobs import KnobError, find_knob, set_knob

SOURCE = (
    "# header comment\n"
    "import numpy as np  # unrelated\n"
    "BLOCK = 64   # block size (bytes) — café\n"
    "LR: float = 3e-4\n"
    "NAME = 'x'\n"
    "def f():\n"
    "    BLOCK = 1  # local, not a knob\n"
    "    return BLOCK\n"
).encode()


def test_rewrite_changes_only_the_literal():
    out = set_knob(SOURCE, "BLOCK", 128)
    assert out == SOURCE.replace(b"BLOCK = 64 ", b"BLOCK = 128 ", 1)
    out = set_knob(SOURCE, "LR", 0.001)
    assert out == SOURCE.replace(b"3e-4", b"0.001")
    out = set_knob(SOURCE, "NAME", "y")
    assert out == SOURCE.replace(b"'x'", b"'y'")


def test_round_trip_is_byte_identical():
    site = find_knob(SOURCE, "BLOCK")
    assert site.value == 64
    changed = set_knob(SOURCE, "BLOCK", 256)
    assert set_knob(changed, "BLOCK", 64) == SOURCE


def test_missing_or_non_literal_knob_is_a_clear_error():
    with pytest.raises(KnobError, match="no module-level assignment `DEPTH"):
        find_knob(SOURCE, "DEPTH", "kernel.py")
    with pytest.raises(KnobError, match="not assigned a literal"):
        find_knob(b"X = compute()\n", "X", "kernel.py")
    with pytest.raises(KnobError, match="assigned 2 times"):
        find_knob(b"X = 1\nX = 2\n", "X", "kernel.py")
