"""Find and rewrite module-level `NAME = literal` assignments, byte-exactly.

Only the literal's own characters change; comments, spacing and every other byte of the
file stay identical, so a knob change is a one-line diff a human can read.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ratchet.core.errors import RatchetError


class KnobError(RatchetError):
    pass


@dataclass(frozen=True)
class KnobSite:
    name: str
    value: object
    start: int  # byte offsets of the literal in the file
    end: int


def _line_offsets(source: bytes) -> list[int]:
    offsets, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        offsets.append(total)
    return offsets


def find_knob(source: bytes, name: str, file: str = "<file>") -> KnobSite:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise KnobError(f"{file}: cannot parse ({exc.msg}, line {exc.lineno})") from None
    sites: list[ast.expr] = []
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and target.id == name and value is not None:
            sites.append(value)
    if not sites:
        raise KnobError(f"{file}: no module-level assignment `{name} = <literal>`")
    if len(sites) > 1:
        raise KnobError(f"{file}: `{name}` is assigned {len(sites)} times at module level")
    value = sites[0]
    try:
        literal = ast.literal_eval(value)
    except ValueError:
        raise KnobError(f"{file}: `{name}` is not assigned a literal") from None
    # ast offsets are UTF-8 byte offsets within a line
    offsets = _line_offsets(source)
    start = offsets[value.lineno - 1] + value.col_offset
    end_line = value.end_lineno or value.lineno  # always set by ast.parse (3.8+)
    end = offsets[end_line - 1] + (value.end_col_offset or 0)
    return KnobSite(name, literal, start, end)


def format_value(value: object) -> str:
    if isinstance(value, float):
        text = repr(float(f"{value:.6g}"))
        return text
    return repr(value)


def set_knob(source: bytes, name: str, value: object, file: str = "<file>") -> bytes:
    site = find_knob(source, name, file)
    return source[: site.start] + format_value(value).encode() + source[site.end :]


def knob_values(repo, commit: str, keys) -> dict[str, object]:
    """Each `"file.py:NAME"` knob's literal in `commit`; KnobError names the first that is
    not there (a missing file, no `NAME = <literal>`), phrased for `tune.knobs`."""
    from ratchet.job import gitrepo

    values = {}
    for key in keys:
        file, _, name = key.rpartition(":")
        try:
            source = gitrepo.show(repo, commit, file)
        except gitrepo.GitError:
            raise KnobError(f"tune.knobs: {key!r}: {file} does not exist in commit "
                            f"{commit[:7]}") from None
        try:
            values[key] = find_knob(source, name, file).value
        except KnobError as exc:
            raise KnobError(f"tune.knobs: {key!r}: {exc}") from None
    return values
