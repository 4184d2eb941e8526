"""The node half of the Ray and shell backends: what runs on the engine's node (stdlib +
the job side only; the driver half is backends/remote.py).

`python -m ratchet.job.node job --spec S (--workdir W | --archive T)` wraps the
trusted worker:

- the spec is moved to a private job directory *outside* the snapshot, so a candidate
  cannot write next to the worker's logs or results;
- the worker runs as a child with its stdout captured; the candidate's phase logs are
  then echoed with every line prefixed by `| ` (so no candidate line can pass for the
  result marker), and the worker's own `RATCHET-WORKER-RESULT:` line is printed last.
  The engine's job log is therefore readable by a human and still carries exactly one
  trustworthy result line.

`python -m ratchet.job.node prep --root R --key K --command C (--workdir W |
--archive T)` prepares data once into the shared location R/K (atomically, skipped when
it is already there) and prints `RATCHET-PREP-RESULT: {"data_dir": ..., "digest": ...}`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from ratchet.job.jobspec import RESULT_MARKER, JobSpec, scrub_env
from ratchet.job.seal import KEY_FILE, take_key_file, write_key_file

PREP_MARKER = "RATCHET-PREP-RESULT: "


HOLDOUT_TAR = "holdout.tar"  # shipped with the hold-out follow-up job only


SPEC_DIR = ".ratchet-job"  # where the Ray backend puts spec.json inside the working_dir


ECHO_LIMIT = 64 << 10  # bytes of each phase log echoed into the engine's job log


def _unpack(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar")


def echo_logs(job_dir: Path) -> str:
    """The job's phase logs, every line prefixed `| ` (no line can pass for a marker)."""
    parts = []
    logs = job_dir / "logs"
    for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        data = log.read_bytes()
        dropped = max(0, len(data) - ECHO_LIMIT)
        text = data[dropped:].decode("utf-8", "replace")
        parts.append(f"==> {log.name} <==\n")
        if dropped:
            parts.append(f"| ... {dropped} bytes omitted ...\n")
        parts.extend(f"| {line}\n" for line in text.splitlines())
    return "".join(parts)


def _echo_logs(job_dir: Path) -> None:
    sys.stdout.write(echo_logs(job_dir))
    sys.stdout.flush()


def holdout_root() -> Path:
    """This node's private parent of shipped hold-out data (one per user, mode 0700)."""
    root = Path(tempfile.gettempdir()) / f"ratchet-holdout-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    root.chmod(0o700)
    return root


def place_holdout(spec: JobSpec, archive: Path | None) -> Path | None:
    """Point the spec at the hold-out data as this node sees it; return a directory to
    delete when the job ends (a shipped copy), or None.

    The hold-out data travels only with the hold-out follow-up job (`holdout_only`),
    as `archive`; it is unpacked into a fresh directory under `holdout_root()` and
    deleted with the job. Every other job's `holdout_dir` names what a sandboxed phase
    must not see on this node: the driver's path where this node has it (a shared
    filesystem, or the driver's own machine), else `holdout_root()`.
    """
    driver_path = Path(spec.holdout_dir) if spec.holdout_dir else None
    if not spec.holdout_only:
        if driver_path is None or not driver_path.exists():
            spec.holdout_dir = str(holdout_root())
        return None
    if archive is None or not archive.is_file():
        return None  # a hold-out evaluator without data of its own (or the path is shared)
    copy = Path(tempfile.mkdtemp(prefix="job-", dir=holdout_root()))
    _unpack(archive, copy / "data")
    archive.unlink()  # the staged copy goes as soon as the job holds it
    spec.holdout_dir = str(copy / "data")
    return copy


def run_job(spec_path: Path, workdir: Path | None, archive: Path | None,
            job_dir: Path | None, holdout: Path | None = None) -> int:
    keep_job_dir = job_dir is not None
    job_dir = job_dir or Path(tempfile.mkdtemp(prefix="ratchet-job-"))
    job_dir.mkdir(parents=True, exist_ok=True)
    spec = JobSpec.from_json(spec_path.read_text())
    key = take_key_file(spec_path.parent)  # out of the candidate's tree before it runs
    shipped = place_holdout(spec, holdout)
    (job_dir / "spec.json").write_text(spec.to_json())
    if key is not None:  # for the worker, in the private job directory
        write_key_file(job_dir / KEY_FILE, key)
    scratch = None
    if workdir is None:
        if archive is None:
            raise SystemExit("ratchet.job.node job: give --workdir or --archive")
        scratch = Path(tempfile.mkdtemp(prefix="ratchet-work-"))
        workdir = scratch / "work"
        _unpack(archive, workdir)
    else:
        # the spec travelled inside the snapshot: take it out of the candidate's tree
        inside = spec_path.resolve().parent
        if inside != workdir.resolve() and workdir.resolve() in inside.parents:
            shutil.rmtree(inside, ignore_errors=True)
    out_path = job_dir / "worker.out"
    with out_path.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "ratchet.job.worker", str(job_dir), "--workdir", str(workdir)],
            stdin=subprocess.DEVNULL,
            stdout=out,
        )

        def forward(signum, frame):  # noqa: ARG001 - engines stop jobs with SIGTERM
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = worker.wait()
    if shipped is not None:
        shutil.rmtree(shipped, ignore_errors=True)
    _echo_logs(job_dir)
    marker = [line for line in out_path.read_text(errors="replace").splitlines()
              if line.startswith(RESULT_MARKER)]
    if marker:
        sys.stdout.write(marker[-1] + "\n")
    else:
        sys.stdout.write(f"ratchet: the worker exited with code {code} and reported nothing\n")
    sys.stdout.flush()
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    if not keep_job_dir:
        shutil.rmtree(job_dir, ignore_errors=True)
    return 0 if marker else 1


def prep_into(root: Path, key: str, command: str, workdir: Path, env_allow: list[str],
              timeout_s: float) -> tuple[Path, str]:
    """Run `command` once into root/key/data (read-only, digested); reuse it if present."""
    from ratchet.job.prep import PrepError, make_readonly
    from ratchet.job.procs import run_capped
    from ratchet.job.worker import data_digest

    final = root / key
    manifest = final / "manifest.json"
    if manifest.is_file():
        return final / "data", json.loads(manifest.read_text())["digest"]
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    data = tmp / "data"
    data.mkdir()
    env = scrub_env(dict(os.environ), env_allow)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["RATCHET_DATA"] = str(data)  # renamed into place when prep succeeds
    code, timed_out, log, seconds = run_capped(
        ["/bin/sh", "-c", command], cwd=workdir, env=env, log_path=tmp / "prep.log",
        deadline=time.monotonic() + timeout_s, log_limit=4 << 20,
    )  # its process group alone: the driver or a Ray worker has other children
    if timed_out or code != 0:
        tail = " | ".join(log.text().strip().splitlines()[-3:])
        shutil.rmtree(tmp, ignore_errors=True)
        why = "timed out" if timed_out else f"exit code {code}"
        raise PrepError(f"[prep] run = {command!r} failed ({why}): {tail}")
    make_readonly(data)
    digest = data_digest(data)
    (tmp / "manifest.json").write_text(json.dumps(
        {"command": command, "digest": digest, "seconds": seconds, "created": time.time()}))
    try:
        tmp.rename(final)  # atomic: a concurrent prep either wins or finds ours
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not manifest.is_file():
            raise
    return final / "data", json.loads(manifest.read_text())["digest"]


def run_prep(args: argparse.Namespace) -> int:
    from ratchet.job.prep import PrepError

    scratch = None
    workdir = args.workdir
    if workdir is None:
        scratch = Path(tempfile.mkdtemp(prefix="ratchet-prep-"))
        workdir = scratch / "work"
        _unpack(args.archive, workdir)
    try:
        data, digest = prep_into(Path(args.root), args.key, args.command, workdir,
                                 args.env_allow or [], args.timeout)
    except PrepError as exc:
        sys.stdout.write(PREP_MARKER + json.dumps({"error": str(exc)}) + "\n")
        return 1
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    sys.stdout.write(PREP_MARKER + json.dumps({"data_dir": str(data), "digest": digest}) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ratchet.job.node")
    sub = parser.add_subparsers(dest="verb", required=True)
    job = sub.add_parser("job")
    job.add_argument("--spec", type=Path, required=True)
    job.add_argument("--workdir", type=Path)
    job.add_argument("--archive", type=Path)
    job.add_argument("--job-dir", type=Path, help="keep the job's logs here (default: a temp dir)")
    job.add_argument("--holdout", type=Path, help="the hold-out data (a hold-out job only)")
    prep = sub.add_parser("prep")
    prep.add_argument("--root", required=True)
    prep.add_argument("--key", required=True)
    prep.add_argument("--command", required=True)
    prep.add_argument("--timeout", type=float, default=3600.0)
    prep.add_argument("--env-allow", action="append")
    prep.add_argument("--workdir", type=Path)
    prep.add_argument("--archive", type=Path)
    args = parser.parse_args(argv)
    if args.workdir is None and args.archive is None:
        parser.error("give --workdir or --archive")
    if args.verb == "job":
        return run_job(args.spec, args.workdir, args.archive, args.job_dir, args.holdout)
    return run_prep(args)


if __name__ == "__main__":
    sys.exit(main())
