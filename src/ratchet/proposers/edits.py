"""SEARCH/REPLACE edits: parse a model's reply, apply it to the incumbent's files.

The format (aider's, which models know well) names the file on the line before each block:

    kernel.py
    <<<<<<< SEARCH
    exact lines from the current file
    =======
    the lines that replace them
    >>>>>>> REPLACE

A small file may instead be rewritten whole:

    kernel.py
    <<<<<<< FILE
    the complete new content
    >>>>>>> FILE

Applying is strict first (the SEARCH text occurs exactly once), then whitespace-tolerant
(trailing whitespace ignored, or the whole block consistently re-indented). Every block
that cannot be applied is reported with the reason, so the model can be shown exactly
what failed and asked once to repair it.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from ratchet.core.errors import RatchetError
from ratchet.core.paths import matches_any, protected_by, unsafe

SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"
FILE_START, FILE_END = "<<<<<<< FILE", ">>>>>>> FILE"
_FENCE = re.compile(r"^\s*(```|~~~)")
_DESCRIPTION = re.compile(r"^\s*\**DESCRIPTION\**\s*:\s*\**\s*(.+?)\s*\**\s*$", re.IGNORECASE)


class EditParseError(RatchetError):
    """The reply is not a well-formed set of edits (one line, says where)."""


@dataclass(frozen=True)
class Edit:
    path: str
    search: str  # "" with whole=False: create a new file (or append to an empty one)
    replace: str
    whole: bool = False  # a whole-file rewrite: `replace` is the new content


@dataclass
class ParsedReply:
    description: str | None
    edits: list[Edit] = field(default_factory=list)


def _clean_path(line: str) -> str:
    path = line.strip().strip("`*'\"").strip()
    path = re.sub(r"^(file|path)\s*:\s*", "", path, flags=re.IGNORECASE).strip("`*'\" ")
    return path.removeprefix("./")


def find_description(text: str) -> str | None:
    """The one-line summary the model gave (`DESCRIPTION: ...`), if any."""
    for line in text.splitlines():
        match = _DESCRIPTION.match(line)
        if match:
            return match.group(1).strip().strip("`")
    return None


def parse_reply(text: str) -> ParsedReply:
    """Blocks and the DESCRIPTION line out of a model's reply; raises EditParseError."""
    lines = text.splitlines()
    description = find_description(text)
    edits: list[Edit] = []
    i = 0
    while i < len(lines):
        marker = lines[i].strip()
        if marker not in (SEARCH, FILE_START):
            if marker in (DIVIDER, REPLACE, FILE_END):
                raise EditParseError(f"line {i + 1}: {marker!r} without a preceding {SEARCH!r}")
            i += 1
            continue
        path = _path_before(lines, i)
        if path is None:
            raise EditParseError(
                f"line {i + 1}: {marker!r} block has no file path on the line before it"
            )
        start = i
        if marker == FILE_START:
            end = _find(lines, i + 1, {FILE_END}, stop={SEARCH, FILE_START})
            if end is None:
                raise EditParseError(f"line {start + 1}: {FILE_START!r} block for {path} is "
                                     f"not closed by {FILE_END!r}")
            body = _strip_fences(lines[i + 1:end])
            edits.append(Edit(path, "", _join(body), whole=True))
            i = end + 1
            continue
        mid = _find(lines, i + 1, {DIVIDER}, stop={SEARCH, REPLACE, FILE_START})
        if mid is None:
            raise EditParseError(f"line {start + 1}: SEARCH block for {path} has no "
                                 f"{DIVIDER!r} line")
        end = _find(lines, mid + 1, {REPLACE}, stop={SEARCH, DIVIDER, FILE_START})
        if end is None:
            raise EditParseError(f"line {start + 1}: SEARCH block for {path} is not closed by "
                                 f"{REPLACE!r}")
        edits.append(Edit(path, _join(lines[i + 1:mid]), _join(lines[mid + 1:end])))
        i = end + 1
    if not edits:
        raise EditParseError(
            "no SEARCH/REPLACE blocks found (each needs the file path on its own line, then "
            f"{SEARCH}, the old lines, {DIVIDER}, the new lines, {REPLACE})"
        )
    return ParsedReply(description, edits)


def _path_before(lines: list[str], i: int) -> str | None:
    j = i - 1
    while j >= 0 and (_FENCE.match(lines[j]) or not lines[j].strip()):
        j -= 1
    if j < 0:
        return None
    path = _clean_path(lines[j])
    if not path or " " in path or path in (REPLACE, FILE_END, DIVIDER):
        return None
    return path


def _find(lines: list[str], start: int, want: set[str], stop: set[str]) -> int | None:
    for j in range(start, len(lines)):
        marker = lines[j].strip()
        if marker in want:
            return j
        if marker in stop:
            return None
    return None


def _strip_fences(body: list[str]) -> list[str]:
    if body and _FENCE.match(body[0]) and body[-1:] and _FENCE.match(body[-1]):
        return body[1:-1]
    return body


def _join(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


# ---------------------------------------------------------------------------------------
# applying


@dataclass(frozen=True)
class EditFailure:
    index: int  # 1-based block number in the reply
    path: str
    reason: str

    def __str__(self) -> str:
        return f"block {self.index} ({self.path}): {self.reason}"


@dataclass
class ApplyResult:
    files: dict[str, str]  # path -> new content, only the files that changed
    failures: list[EditFailure]
    fallbacks: int = 0  # blocks that needed the whitespace-tolerant match

    @property
    def ok(self) -> bool:
        return not self.failures


class _NoMatch(Exception):
    pass


def apply_edits(
    edits: list[Edit],
    files: dict[str, str],
    editable: list[str],
    protected: list[str],
    whole_file_max_lines: int = 400,
) -> ApplyResult:
    """Apply edits in order to `files` (path -> current content). Never raises."""
    current = dict(files)
    failures: list[EditFailure] = []
    fallbacks = 0
    for index, edit in enumerate(edits, start=1):
        path = edit.path
        why = unsafe(path)
        if why:
            failures.append(EditFailure(index, repr(path)[1:-1], f"{why}; name a file of the "
                                        "repository by its relative path"))
            continue
        if protected_by(path, protected):
            failures.append(EditFailure(index, path, "is a protected file; it may not change"))
            continue
        if not matches_any(path, editable):
            failures.append(EditFailure(
                index, path, f"is not editable (task.editable: {', '.join(editable)})"))
            continue
        old = current.get(path)
        if edit.whole:
            size = len((old or "").splitlines())
            if old is not None and size > whole_file_max_lines:
                failures.append(EditFailure(
                    index, path, f"has {size} lines; whole-file rewrites are allowed up to "
                    f"{whole_file_max_lines} lines, use SEARCH/REPLACE blocks"))
                continue
            current[path] = edit.replace
            continue
        if old is None:
            if edit.search.strip():
                failures.append(EditFailure(
                    index, path, "no such file (to create it, leave SEARCH empty)"))
                continue
            current[path] = edit.replace
            continue
        if not edit.search.strip():
            if old.strip():
                failures.append(EditFailure(
                    index, path, "SEARCH is empty but the file is not; quote the lines to "
                    "replace"))
                continue
            current[path] = edit.replace
            continue
        try:
            current[path], fuzzy = replace_once(old, edit.search, edit.replace)
            fallbacks += fuzzy
        except _NoMatch as exc:
            failures.append(EditFailure(index, path, str(exc)))
    changed = {p: c for p, c in current.items() if files.get(p) != c}
    return ApplyResult(changed, failures, fallbacks)


def replace_once(content: str, search: str, replace: str) -> tuple[str, bool]:
    """(new content, used the fallback); raises _NoMatch with the reason."""
    count = content.count(search)
    if count == 1:
        return content.replace(search, replace, 1), False
    if count > 1:
        raise _NoMatch(f"SEARCH text matches {count} places; include more surrounding lines "
                       "so it matches exactly one")
    lines = content.splitlines(keepends=True)
    s_lines = search.splitlines()
    r_lines = replace.splitlines()
    while s_lines and not s_lines[0].strip():  # blank edges are the commonest mismatch
        s_lines.pop(0)
    while s_lines and not s_lines[-1].strip():
        s_lines.pop()
    for matcher in (_match_rstrip, _match_reindented):
        hits = [(i, extra) for i in range(len(lines) - len(s_lines) + 1)
                if (extra := matcher(lines[i:i + len(s_lines)], s_lines)) is not None]
        if len(hits) > 1:
            raise _NoMatch(f"SEARCH text matches {len(hits)} places (ignoring whitespace); "
                           "include more surrounding lines so it matches exactly one")
        if hits:
            start, (remove, add) = hits[0]
            new = []
            for line in r_lines:
                if line.strip():
                    line = add + (line[len(remove):] if line.startswith(remove) else
                                  line.lstrip())
                new.append(line + "\n")
            window = lines[start:start + len(s_lines)]
            if window and not window[-1].endswith("\n") and new:
                new[-1] = new[-1][:-1]
            return "".join(lines[:start] + new + lines[start + len(s_lines):]), True
    raise _NoMatch("SEARCH text not found in the file" + _closest_hint(lines, s_lines))


def _match_rstrip(window: list[str], s_lines: list[str]) -> tuple[str, str] | None:
    if all(a.rstrip() == b.rstrip() for a, b in zip(window, s_lines, strict=True)):
        return "", ""
    return None


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _match_reindented(window: list[str], s_lines: list[str]) -> tuple[str, str] | None:
    """Same lines with the whole block shifted by one consistent indentation change."""
    pairs = [(a.rstrip("\r\n"), b) for a, b in zip(window, s_lines, strict=True)]
    first = next(((a, b) for a, b in pairs if b.strip()), None)
    if first is None:
        return None
    a0, b0 = first
    fi, si = _indent(a0), _indent(b0)
    # the block's indentation relative to its first line must be the same in both
    for a, b in pairs:
        if not b.strip():
            if a.strip():
                return None
            continue
        if a.strip() != b.strip():
            return None
        if not b.startswith(si) or not a.startswith(fi):
            return None
        if a[len(fi):].rstrip() != b[len(si):].rstrip():
            return None
    return si, fi


def _closest_hint(lines: list[str], s_lines: list[str]) -> str:
    if not s_lines or not lines or len(lines) > 5000:
        return ""
    n = len(s_lines)
    target = "\n".join(s.strip() for s in s_lines)
    best, best_i = 0.0, 0
    for i in range(max(len(lines) - n + 1, 1)):
        window = "\n".join(x.strip() for x in lines[i:i + n])
        ratio = difflib.SequenceMatcher(None, window, target, autojunk=False).quick_ratio()
        if ratio > best:
            ratio = difflib.SequenceMatcher(None, window, target, autojunk=False).ratio()
            if ratio > best:
                best, best_i = ratio, i
    if best < 0.5:
        return ""
    snippet = "".join(lines[best_i:best_i + n]).rstrip("\n")
    return f"; the closest lines in the file (line {best_i + 1}) are:\n{snippet}"
