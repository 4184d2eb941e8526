"""Authenticated job results: a per-job key that only the driver and the worker hold.

A file in a job's directory is something any party on the machine might have written: a
candidate's daemon, another job's candidate, an agent. So a worker's result counts only when
it is *sealed*: an HMAC-SHA256 over the job id and the result text, under a key the driver
made for that job alone (`KeyStore`, files 0600 in a 0700 directory under `.ratchet/`,
hidden from every sandbox) and handed to the worker on a descriptor only the two hold (the
worker's stdin; for remote engines, a key file the worker deletes before any candidate code
runs). An unsealed or badly sealed `result.json` is not a result: the driver keeps waiting
for the real one, and a worker that ended without one is an infrastructure fault (the job is
retried), never the candidate's verdict: whoever forged the file, it was not provably the
candidate.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

KEY_BYTES = 32
KEY_FILE = "job.key"  # in a shipped job directory: read and deleted by the worker at start


class Forged(ValueError):
    """The text is not a result sealed with this job's key."""


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def write_key_file(path: Path, key: bytes, *, exclusive: bool = False) -> None:
    """`key` as hex in a file only its owner can read (`exclusive`: refuse a file that is
    already there, one someone else may have planted)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    with os.fdopen(os.open(path, flags, 0o600), "w") as fh:
        fh.write(key.hex())


def _mac(key: bytes, job_id: str, text: str) -> str:
    return hmac.new(key, job_id.encode() + b"\0" + text.encode(), hashlib.sha256).hexdigest()


def seal(key: bytes, job_id: str, text: str) -> str:
    """The envelope a worker writes: the result text and its MAC, as one JSON line."""
    return json.dumps({"job_id": job_id, "mac": _mac(key, job_id, text), "result": text},
                      sort_keys=True)


def unseal(key: bytes, job_id: str, sealed: str) -> str:
    """The result text inside `sealed`, if (and only if) this job's key sealed it."""
    try:
        envelope = json.loads(sealed)
        text, mac, sealed_for = envelope["result"], envelope["mac"], envelope["job_id"]
    except (ValueError, KeyError, TypeError) as exc:
        raise Forged(f"not a sealed result ({type(exc).__name__})") from exc
    if not isinstance(text, str) or not isinstance(mac, str) or sealed_for != job_id:
        raise Forged("not a sealed result for this job")
    if not hmac.compare_digest(mac, _mac(key, job_id, text)):
        raise Forged("the result's seal does not verify")
    return text


class KeyStore:
    """The driver's per-job keys: `.ratchet/keys/<job id>`, readable by the driver alone.

    Kept on disk so that a driver killed and resumed can still verify the results of the
    jobs that ran on while it was down.
    """

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / "keys"

    def _path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.key"

    def create(self, job_id: str) -> bytes:
        """The job's key, made on first use (idempotent: a re-placed job keeps its key)."""
        existing = self.get(job_id)
        if existing is not None:
            return existing
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(OSError):
            os.chmod(self.dir, 0o700)
        key = new_key()
        tmp = self.dir / f".{job_id}.{os.getpid()}.tmp"
        write_key_file(tmp, key)
        os.replace(tmp, self._path(job_id))
        return key

    def get(self, job_id: str) -> bytes | None:
        try:
            return bytes.fromhex(self._path(job_id).read_text().strip())
        except (OSError, ValueError):
            return None

    def write_for_worker(self, job_id: str, job_dir: Path) -> None:
        """For engines that ship the job directory: the key beside the spec, 0600."""
        write_key_file(Path(job_dir) / KEY_FILE, self.create(job_id))


def take_key_file(job_dir: Path) -> bytes | None:
    """Worker side: read the shipped key and delete it before any candidate code runs."""
    path = Path(job_dir) / KEY_FILE
    try:
        key = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    return key
