"""Run a command on a real pseudo-terminal and replay what it wrote on a small screen
model, to see the final screen a user sees (live views redraw with cursor movements).

The model knows what rich's live display uses: printable text with auto-wrap at the
terminal's width, CR, LF, and the CSI sequences for cursor moves and erasing; colours and
cursor visibility are ignored.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])|\x1b\][^\x07]*\x07|\x1b[()][A-Za-z0-9]")


def run_on_tty(argv: list[str], env: dict[str, str], cwd, cols: int = 100, rows: int = 40,
               timeout: float = 300) -> tuple[int, str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**env, "COLUMNS": str(cols), "LINES": str(rows), "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                            start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    else:
        proc.kill()
    code = proc.wait(timeout=30)
    os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


def screen(output: str, cols: int = 100) -> list[str]:
    """The lines left on screen (scroll-back included) after replaying `output`."""
    lines: list[list[str]] = [[]]
    row = col = 0

    def put(ch: str) -> None:
        nonlocal row, col
        if col >= cols:  # auto-wrap
            row, col = row + 1, 0
        while len(lines) <= row:
            lines.append([])
        line = lines[row]
        while len(line) <= col:
            line.append(" ")
        line[col] = ch
        col += 1

    pos = 0
    for match in CSI.finditer(output + "\x1b[0m"):
        for ch in output[pos:match.start()]:
            if ch == "\r":
                col = 0
            elif ch == "\n":
                row += 1
                while len(lines) <= row:
                    lines.append([])
            elif ch == "\b":
                col = max(col - 1, 0)
            elif ch >= " " or ch == "\t":
                put(ch)
        pos = match.end()
        params, final = match.group(1), match.group(2)
        if params is None or params.startswith("?") or final not in "ABCDGKJ":
            continue  # colours, cursor visibility, other modes: nothing moves
        first = params.split(";")[0]
        n = int(first or 1) if final in "ABCDG" else int(first or 0)
        if final == "A":
            row = max(row - n, 0)
        elif final == "B":
            row += n
        elif final == "C":
            col += n
        elif final == "D":
            col = max(col - n, 0)
        elif final == "G":
            col = n - 1
        elif final == "K":
            while len(lines) <= row:
                lines.append([])
            line = lines[row]
            if n == 0:
                del line[col:]
            elif n == 1:
                line[:col] = [" "] * min(col, len(line))
            else:
                line.clear()
        elif final == "J" and n in (0,):
            del lines[row + 1:]
            del lines[row][col:]
    return ["".join(line).rstrip() for line in lines]
