"""SEARCH/REPLACE parsing and applying: pure functions, no I/O."""

import pytest

from ratchet.proposers.edits import EditParseError, apply_edits, parse_reply

EDITABLE = ["solution.py", "pkg/*.py"]
PROTECTED = ["evaluate.py", "ratchet.toml"]

FILE = """\
def f(x):
    if x > 0:
        return x * 2
    return 0


def g(y):
    return y + 1
"""


def test_parse_blocks_description_and_fences():
    reply = """Some thinking first.

DESCRIPTION: double faster

```python
solution.py
<<<<<<< SEARCH
        return x * 2
=======
        return x << 1
>>>>>>> REPLACE
```

`pkg/util.py`
```python
<<<<<<< SEARCH
=======
HELPER = 1
>>>>>>> REPLACE
```
"""
    parsed = parse_reply(reply)
    assert parsed.description == "double faster"
    assert [e.path for e in parsed.edits] == ["solution.py", "pkg/util.py"]
    assert parsed.edits[0].search == "        return x * 2\n"
    assert parsed.edits[0].replace == "        return x << 1\n"
    assert parsed.edits[1].search == ""


def test_parse_whole_file_block():
    parsed = parse_reply("DESCRIPTION: rewrite\nsolution.py\n<<<<<<< FILE\nA = 1\n>>>>>>> FILE\n")
    assert parsed.edits[0].whole and parsed.edits[0].replace == "A = 1\n"


@pytest.mark.parametrize("reply, message", [
    ("DESCRIPTION: x\nno blocks at all", "no SEARCH/REPLACE blocks"),
    ("solution.py\n<<<<<<< SEARCH\na\n>>>>>>> REPLACE\n", "has no '======='"),
    ("solution.py\n<<<<<<< SEARCH\na\n=======\nb\n", "not closed"),
    ("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", "no file path"),
    ("solution.py\n=======\nb\n>>>>>>> REPLACE\n", "without a preceding"),
])
def test_malformed_replies(reply, message):
    with pytest.raises(EditParseError, match=message):
        parse_reply(reply)


def _apply(reply: str, files: dict[str, str] | None = None, **kw):
    return apply_edits(parse_reply(reply).edits, files or {"solution.py": FILE}, EDITABLE,
                       PROTECTED, **kw)


def block(search: str, replace: str, path: str = "solution.py") -> str:
    return f"{path}\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def test_strict_apply():
    result = _apply(block("        return x * 2\n", "        return x + x\n"))
    assert result.ok and result.fallbacks == 0
    assert "return x + x" in result.files["solution.py"]
    assert "return x * 2" not in result.files["solution.py"]


def test_trailing_whitespace_fallback():
    result = _apply(block("    if x > 0:   \n        return x * 2\t\n",
                          "    if x >= 0:\n        return x * 2\n"))
    assert result.ok and result.fallbacks == 1
    assert "    if x >= 0:\n        return x * 2\n" in result.files["solution.py"]


def test_reindented_fallback_keeps_file_indentation():
    # the model dropped one indentation level for the whole block
    result = _apply(block("if x > 0:\n    return x * 2\n", "if x > 1:\n    return x * 3\n"))
    assert result.ok and result.fallbacks == 1
    assert "    if x > 1:\n        return x * 3\n" in result.files["solution.py"]


def test_ambiguous_match_is_a_failure():
    files = {"solution.py": "a = 1\nb = 2\na = 1\n"}
    result = _apply(block("a = 1\n", "a = 3\n"), files)
    assert not result.ok
    assert "matches 2 places" in result.failures[0].reason


def test_not_found_shows_the_closest_lines():
    result = _apply(block("        return x * 3\n", "        return 0\n"))
    assert not result.ok
    reason = result.failures[0].reason
    assert "not found" in reason and "return x * 2" in reason


def test_non_editable_and_protected_files_are_refused():
    result = _apply(block("x\n", "y\n", path="evaluate.py") + block("x\n", "y\n", path="other.py"),
                    {"solution.py": FILE, "evaluate.py": "x\n", "other.py": "x\n"})
    reasons = [str(f) for f in result.failures]
    assert "protected" in reasons[0] and "evaluate.py" in reasons[0]
    assert "not editable" in reasons[1] and "other.py" in reasons[1]
    assert result.files == {}


def test_new_file_and_whole_file_limit():
    result = _apply(block("", "X = 1\n", path="pkg/new.py"))
    assert result.ok and result.files == {"pkg/new.py": "X = 1\n"}
    rewrite = "solution.py\n<<<<<<< FILE\nVALUE = 1\n>>>>>>> FILE\n"
    assert _apply(rewrite).files == {"solution.py": "VALUE = 1\n"}
    too_big = _apply(rewrite, whole_file_max_lines=3)
    assert "whole-file rewrites are allowed up to 3 lines" in too_big.failures[0].reason


def test_blocks_apply_in_sequence():
    reply = block("def g(y):\n", "def g(y, z=0):\n") + block(
        "    return y + 1\n", "    return y + z + 1\n")
    result = _apply(reply)
    assert result.ok
    assert "def g(y, z=0):\n    return y + z + 1\n" in result.files["solution.py"]
