"""Build the tinygpt byte dataset. Protected: candidates may not change this file.

The text is Python's own standard library (its .py sources), so the data exists on every
machine that can run this example and nothing is downloaded. Files are read in sorted order,
cut into fixed-size chunks, and every chunk is dealt to train / val / holdout by its index, so
all three splits mix the same kinds of code and the split never changes between runs.

Output (uint8 byte arrays, one byte = one token) in $RATCHET_DATA if set, else ./data:
    train.bin  4 MiB      val.bin  256 KiB      holdout.bin  256 KiB      meta.json

Run it again and it does nothing if the files are already there and complete.
"""

import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

import numpy as np

TRAIN_BYTES = 4 * 1024 * 1024
VAL_BYTES = 256 * 1024
HOLDOUT_BYTES = 256 * 1024
CHUNK = 4096  # bytes per chunk dealt to a split
# Of every 18 chunks: 16 to train, 1 to val, 1 to holdout (4 MiB : 256 KiB : 256 KiB).
CYCLE = 18
SIZES = {"train": TRAIN_BYTES, "val": VAL_BYTES, "holdout": HOLDOUT_BYTES}
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib"}


def data_dir() -> Path:
    return Path(os.environ.get("RATCHET_DATA") or "data")


def source_files(root: Path) -> list[Path]:
    """Every .py file of the standard library, sorted by relative path (deterministic)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        files += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def split_of(chunk_index: int) -> str:
    slot = chunk_index % CYCLE
    return "val" if slot == CYCLE - 2 else "holdout" if slot == CYCLE - 1 else "train"


def build(root: Path) -> tuple[dict[str, bytes], int]:
    """Stream the sources chunk by chunk until every split is full."""
    parts: dict[str, list[bytes]] = {name: [] for name in SIZES}
    filled = dict.fromkeys(SIZES, 0)
    buffer, chunk_index, n_files = b"", 0, 0
    for path in source_files(root):
        if all(filled[s] >= SIZES[s] for s in SIZES):
            break
        buffer += path.read_bytes()
        n_files += 1
        while len(buffer) >= CHUNK:
            chunk, buffer = buffer[:CHUNK], buffer[CHUNK:]
            split = split_of(chunk_index)
            chunk_index += 1
            if filled[split] < SIZES[split]:
                parts[split].append(chunk)
                filled[split] += len(chunk)
    short = {s: filled[s] for s in SIZES if filled[s] < SIZES[s]}
    if short:
        sys.exit(f"prepare.py: not enough text under {root} (got {short} bytes)")
    return {s: b"".join(parts[s])[: SIZES[s]] for s in SIZES}, n_files


def complete(out: Path) -> bool:
    return (
        all(
            (out / f"{s}.bin").is_file() and (out / f"{s}.bin").stat().st_size == n
            for s, n in SIZES.items()
        )
        and (out / "meta.json").is_file()
    )


def main() -> None:
    out = data_dir()
    if complete(out):
        print(f"data already prepared in {out}")
        return
    out.mkdir(parents=True, exist_ok=True)
    root = Path(sysconfig.get_paths()["stdlib"])
    splits, n_files = build(root)
    meta = {
        "source": str(root),
        "python": sys.version.split()[0],
        "files_read": n_files,
        "vocab_size": 256,
    }
    for name, data in splits.items():
        # Write to a temporary name, then rename: a reader never sees a half-written file.
        tmp = out / f"{name}.bin.tmp"
        np.frombuffer(data, dtype=np.uint8).tofile(tmp)
        os.replace(tmp, out / f"{name}.bin")
        meta[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()[:16]}
        print(f"{name}: {len(data):,} bytes")
    # meta.json goes last: its presence marks the data as complete.
    (out / "meta.json.tmp").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(out / "meta.json.tmp", out / "meta.json")
    print(f"wrote {out}/ from {n_files} files under {root}")


if __name__ == "__main__":
    main()
