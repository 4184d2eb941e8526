"""Ideas from people: `ideas.md` at the repository root, one `- ` bullet per idea.

The file is read from the working tree (people jot ideas down without committing) and
imported into the ledger's ideas table at each round; an idea already in the table, tried
or not, is not added again. `ratchet idea "TEXT"` adds to the same table.

    # Ideas
    - try a two-pass softmax that keeps the row max in registers
    - process 4 rows per iteration
      (continuation lines, indented, belong to the bullet above)
"""

from __future__ import annotations

import re
from pathlib import Path

from ratchet.core.errors import UserError
from ratchet.store.ledger import Ledger

IDEAS_FILE = "ideas.md"
_BULLET = re.compile(r"^[-*+]\s+(?:\[[ xX]\]\s+)?(.*\S)\s*$")


class IdeasError(UserError):
    """ideas.md exists but cannot be read (one line, names the file)."""


def parse_ideas(text: str) -> list[str]:
    ideas: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        match = _BULLET.match(line)
        if match:
            current = [match.group(1)]
            ideas.append("")
        elif current is not None and line.strip() and line[:1] in (" ", "\t"):
            current.append(line.strip())
        else:
            current = None
            continue
        ideas[-1] = " ".join(current)
    return [idea for idea in ideas if idea]


def read_ideas_file(path: Path) -> list[str]:
    """The ideas in `path`; [] if it does not exist; IdeasError if it cannot be read."""
    if not path.exists():
        return []
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise IdeasError(f"{path}: cannot read the ideas file ({reason}); make it a UTF-8 "
                         "text file of `- ` bullets, or remove it") from None
    return parse_ideas(text)


def import_ideas(repo: Path, ledger: Ledger) -> int:
    """Add new ideas from `repo/ideas.md` to the ledger; returns how many were new."""
    added = 0
    for idea in read_ideas_file(Path(repo) / IDEAS_FILE):
        added += ledger.add_idea(idea, source=IDEAS_FILE)
    return added
