"""Paths a proposer names: which are allowed at all, and which globs they match.

Every path a proposer hands over (an LLM's edit block, a file an agent wrote, a path in a
candidate's diff) passes `unsafe` before anything uses it. Globs are matched one path
segment at a time: `*` and `?` never match `/` (so `*.py` does not match
`../evaluate.py` or `.git/hooks/x`), and `**` spans directories.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
import sys

# Python files and packages a new file at these names would replace for an evaluator
# that imports them from its own directory (sys.path[0]).
_MODULE_SUFFIXES = (".py", ".pyc", ".pyw", ".so", ".pyd", ".pth")
_STARTUP = frozenset({"sitecustomize", "usercustomize", "__main__"})
# A path the job's checkout can hold: a name within NAME_MAX (255 bytes on Linux file
# systems), the whole well within PATH_MAX (4,096) under the job's own directory, and not
# so deep that a walk of the tree recurses past Python's limit. Past these the candidate
# would crash in the worker, unpacking its tree, before anything of it ran.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
MAX_DEPTH = 64


def unsafe(path: str) -> str | None:
    """Why `path` may not be written by a proposer, or None if it may."""
    if not path:
        return "is empty"
    if "\0" in path:
        return "contains a NUL character"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        return "contains a control character"
    if path.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", path) or path.startswith("\\"):
        return "is an absolute path"
    if "\\" in path:
        return "contains a backslash"
    parts = path.split("/")
    if any(part == ".." for part in parts):
        return "climbs out of the repository (..)"
    if any(part in ("", ".") for part in parts[:-1]) or parts[-1] in ("", "."):
        return "is not a normal relative path (empty or '.' segment)"
    if any(part.lower() == ".git" for part in parts):
        return "is inside .git"
    size = len(path.encode("utf-8", "surrogatepass"))
    if size > MAX_PATH_BYTES:
        return f"is {size:,} bytes long; a path may have at most {MAX_PATH_BYTES:,}"
    if len(parts) > MAX_DEPTH:
        return f"is {len(parts)} directories deep; at most {MAX_DEPTH}"
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in parts)
    if longest > MAX_NAME_BYTES:
        return (f"has a name of {longest:,} bytes; a file or directory name may have at "
                f"most {MAX_NAME_BYTES}")
    return None


@functools.cache
def standard_names() -> frozenset[str]:
    """Top-level names every Python program may import: the standard library (imported
    indirectly by nearly everything) and the interpreter's start-up hooks."""
    return frozenset(set(sys.stdlib_module_names) | set(sys.builtin_module_names) | _STARTUP)


def imported_names(sources: list[str]) -> set[str]:
    """Top-level modules these Python sources import (the evaluator's own imports)."""
    names: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.partition(".")[0])
    return names


def module_name(path: str, directory: str) -> str | None:
    """The module name `path` would provide when `directory` is on sys.path, if any."""
    prefix = f"{directory}/" if directory else ""
    if not path.startswith(prefix):
        return None
    rest = path[len(prefix):]
    first, _, deeper = rest.partition("/")
    if deeper:  # a package directory
        return first
    for suffix in _MODULE_SUFFIXES:
        if first.endswith(suffix):
            return first[: -len(suffix)].split(".")[0]  # foo.cpython-311.so -> foo
    return None


def shadows(path: str, search_dirs: list[str], imported: set[str] | frozenset[str] = frozenset(),
            ) -> str | None:
    """The module a NEW file at `path` would shadow for an evaluator whose directory is
    one of `search_dirs` ("" is the repository's top), or None. `imported`: what the
    evaluator imports besides the standard library."""
    for directory in search_dirs:
        name = module_name(path, directory)
        if name and (name in standard_names() or name in imported):
            return name
    return None


def evaluator_dirs(protected: list[str]) -> list[str]:
    """Directories an evaluator runs from: the top, and those of protected files."""
    dirs = {""}
    for glob in protected:
        head, _, _ = glob.rpartition("/")
        if head and not any(ch in head for ch in "*?["):
            dirs.add(head)
    return sorted(dirs)


@functools.lru_cache(maxsize=512)
def _compiled(glob: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and (end := glob.find("]", i + 2)) != -1:
            body = glob[i + 1:end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            out.append(f"(?!/)[{'^' if negate else ''}{re.escape(body).replace(chr(92) + '-', '-')}]")
            i = end + 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out))


def glob_match(path: str, glob: str) -> bool:
    """One glob, segment-wise; `dir/` and `dir/**` cover everything under dir."""
    if glob.endswith("/"):
        return path.startswith(glob)
    if glob.endswith("/**") and path.startswith(glob[:-2]):
        return True
    return _compiled(glob).fullmatch(path) is not None


def matches_any(path: str, globs: list[str]) -> bool:
    return any(glob_match(path, glob) for glob in globs)


def protected_by(path: str, globs: list[str]) -> bool:
    """Protection errs wide: a path is protected if the segment-wise match OR the older
    fnmatch reading (where `*` spans `/`) says so, so no config protects less than it did."""
    return matches_any(path, globs) or any(fnmatch.fnmatchcase(path, g) for g in globs)
