"""What each MCP tool does, on the paths `ratchet submit`, `wait --json`, `show`, `log`
and `idea` take, so verdicts, budgets, spend and guarantees are exactly theirs.

Each call opens the study as a CLI command does and closes it after, so a `ratchet run`,
`status` or `serve` beside the server sees every submission at once. What an agent sends
is untrusted: a submission passes every check an LLM's edit passes (core/paths.py and
driver/candidate.py's scope check: paths, globs, protected files and ratchet.toml, no
.git, no module shadowing, forbid rules, no repeat) plus the agent copy's size caps, all
BEFORE anything is recorded. A bad one is a ToolInputError naming the field, never a
rejected candidate charged to the study.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ratchet.core.config import CONFIG_FILE
from ratchet.core.errors import UserError
from ratchet.core.paths import matches_any, protected_by, unsafe
from ratchet.core.vocab import Status
from ratchet.driver import budget as budgets
from ratchet.driver import spend, views
from ratchet.driver.candidate import scope_violations
from ratchet.driver.lock import StudyLocked
from ratchet.driver.opening import open_study
from ratchet.driver.study import Study
from ratchet.driver.tally import Tally
from ratchet.job import gitrepo
from ratchet.proposers.context import context_settings, hardware_text
from ratchet.proposers.scratch import MAX_FILE_BYTES, MAX_TOTAL_BYTES
from ratchet.ui import audit, notify

PROPOSER = "mcp"  # its candidates are recorded with it (in vocab.SUBMITTED_FROM_OUTSIDE)
MAX_FILES = 100  # files in one submission
MAX_DESCRIPTION = 2000  # characters (stored cut to a line of 200, as every description)
MAX_IDEA = 2000
MAX_IDS = 64
MAX_WAIT_S = 600.0
MAX_READ_CHARS = 2_000_000  # what one `files` call returns at most
MAX_DIFF_CHARS = 200_000
LOCK_RETRY_S = 1.0


class ToolInputError(UserError):
    """Bad input from the agent: one line naming the field and the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _log(line: str) -> None:
    # stdout is the protocol on stdio: what the study says goes to stderr
    print(line, file=sys.stderr, flush=True)


class StudyTools:
    """The seven tools over the study in `repo` (a git repository with ratchet.toml)."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        # one submission at a time: ids are numbered in the order recorded
        self._submitting = threading.Lock()

    @contextlib.contextmanager
    def _study(self) -> Iterator[Study]:
        # as every CLI command opens it: the config pinned at the study's start, ...
        with open_study(self.repo, log=_log, watch=[notify.watcher]) as study:
            yield study

    # -- study() -----------------------------------------------------------------------

    def study(self) -> dict[str, Any]:
        with self._study() as study:
            config, ledger = study.config, study.ledger
            task, metric = config.task, config.metric
            cands = ledger.candidates()
            spent = spend.summary(ledger)
            counts: dict[str, int] = {}
            for cand in cands:
                counts[cand.status] = counts.get(cand.status, 0) + 1
            start = ledger.study().incumbent.commit or gitrepo.try_rev_parse(study.repo, "HEAD")
            head = views.headline(ledger, metric.name, metric.goal,
                                  config.acceptance.noise == "ignore")
            limits = budgets.status(config.budget, spent, cands, ledger)
            left = {k: round(v["allowed"] - v["used"], 6) for k, v in limits["limits"].items()}
            return {
                "study": study.name,
                "started": study.started,
                "metric": {"name": metric.name, "goal": metric.goal,
                           "better": "lower" if metric.goal == "minimize" else "higher"},
                "task": {
                    "editable": task.editable,
                    "protected": [*task.protected, CONFIG_FILE],
                    "forbid": task.forbid,
                    "constraints": task.constraints,
                    "timeout_s": task.timeout,
                    "holdout": task.holdout is not None,
                },
                "incumbent": {
                    "commit": start,
                    "id": ledger.study().incumbent.id,
                    "metric": ledger.study().incumbent.metric,
                },
                # baseline -> incumbent as pooled estimates with 95% intervals, the noise
                "estimate": head.as_dict(),
                "acceptance": {
                    "false_keep_rate": config.acceptance.rate,
                    "min_improvement": str(config.acceptance.min_improvement),
                    "noise": config.acceptance.noise,
                    "confirm_pairs": config.acceptance.confirm_pairs,
                },
                "parallel": study.parallel,
                "counts": counts,
                # candidates and their fates, as `ratchet status --json` has them
                "tally": Tally.of(ledger).as_dict(),
                "running": [c.id for c in cands if c.status == Status.SUBMITTED],
                "budget": {**limits, "left": left},
                "spend": spent.as_dict(),
                "pending_ideas": [row["text"] for row in ledger.pending_ideas()],
                "readable": sorted(self._readable(study, start or "HEAD")),
                "hardware": hardware_text(),
                "how": "Read the files with `files`, write new contents of editable files and "
                       f"`submit` up to {study.parallel} at once (they run side by side), "
                       "then `wait` for their verdicts: a keep moves the incumbent, and the "
                       "next submissions build on it. Read `history` so as not to repeat a "
                       "discarded experiment. Never stop.",
            }

    # -- files(paths) ------------------------------------------------------------------

    def _readable(self, study: Study, commit: str) -> dict[str, str]:
        """Paths `files` gives out, and what each is: the commit's editable files (never a
        protected one: the evaluator stays out of sight), the [context] files, program.md."""
        protected = [*study.config.task.protected, CONFIG_FILE]
        out: dict[str, str] = {}
        listing = gitrepo.git(study.repo, "ls-tree", "-r", "--name-only", "-z", commit)
        for path in listing.split("\0"):
            if path and matches_any(path, study.config.task.editable) and not protected_by(
                    path, protected):
                out[path] = "editable"
        settings = context_settings(study.config)
        for path in [*settings.files, settings.program]:
            if path and path not in out and not protected_by(path, protected) and \
                    gitrepo.path_exists(study.repo, commit, path):
                out[path] = "context"
        return out

    def files(self, paths: list[str]) -> dict[str, Any]:
        if len(paths) > MAX_FILES:
            raise ToolInputError("paths", f"{len(paths)} paths; ask for at most {MAX_FILES}")
        with self._study() as study:
            commit = (study.ledger.study().incumbent.commit
                      or gitrepo.try_rev_parse(study.repo, "HEAD"))
            if commit is None:
                raise UserError(f"{study.repo}: the repository has no commits")
            readable = self._readable(study, commit)
            wanted = list(paths) or [p for p, what in readable.items() if what == "editable"]
            out: dict[str, str | None] = {}
            size = 0
            for i, path in enumerate(wanted):
                why = _bad_path(path)
                if why:
                    raise ToolInputError(f"paths[{i}]", f"{path!r} {why}")
                if path not in readable:
                    if matches_any(path, study.config.task.editable) and not protected_by(
                            path, [*study.config.task.protected, CONFIG_FILE]):
                        out[path] = None  # editable, not there yet: `submit` creates it
                        continue
                    raise ToolInputError(f"paths[{i}]", f"{path!r} is not readable: ask for "
                                         "the editable files or context files `study` lists "
                                         "under `readable`")
                data = gitrepo.show(study.repo, commit, path)
                text = data.decode("utf-8", "replace")
                size += len(text)
                if size > MAX_READ_CHARS:
                    raise ToolInputError("paths", f"more than {MAX_READ_CHARS:,} characters "
                                         "at once; ask for fewer files")
                out[path] = text
            return {"commit": commit, "incumbent_id": study.ledger.study().incumbent.id,
                    "files": out}

    # -- submit(files, description, base) ----------------------------------------------

    def submit(self, files: dict[str, str | None], description: str,
               base: str | None = None) -> dict[str, Any]:
        description = _checked_text("description", description, MAX_DESCRIPTION)
        contents = _checked_files(files)
        with self._submitting, self._study() as study:
            config = study.config
            protected = [*config.task.protected, CONFIG_FILE]
            for path in contents:  # the cheap checks first, each naming its file
                field = _file_field(path)
                if protected_by(path, protected):
                    raise ToolInputError(field, "is protected (the evaluator's files and "
                                         f"{CONFIG_FILE} may not change)")
                if not matches_any(path, config.task.editable):
                    raise ToolInputError(field, "is not editable (task.editable: "
                                         f"{', '.join(config.task.editable)})")
            incumbent = study.ledger.study().incumbent.commit or gitrepo.try_rev_parse(
                study.repo, "HEAD")
            if incumbent is None:
                raise UserError(f"{study.repo}: the repository has no commits; commit the "
                                "task's files first")
            on = self._base(study, base, incumbent)
            _check_shapes(study, on, contents)
            commit = gitrepo.commit_files(study.repo, on, contents,
                                          f"ratchet mcp: {description}"[:200])
            # the scope check an LLM's edit passes (candidate.materialise), made here so
            # that a bad submission is an error to the agent, not a rejected candidate
            problems = scope_violations(study.repo, config, incumbent, commit)
            if problems:
                raise ToolInputError("files", "; ".join(problems))
            earlier = _same_tree(study, commit)
            if earlier:
                raise ToolInputError("files", f"the same files as {earlier} (see `show "
                                     f"{earlier}`): a repeat is not run")
            # one submission at a time across processes (other agents' servers, `ratchet
            # submit`): a flood from several clients cannot pass a budget together, nor
            # two first submissions start the study twice
            with study.submitting:
                reached = study.over_budget()  # before this submission starts the study
                if reached is not None:
                    raise UserError(f"{reached.field} reached, nothing was submitted: "
                                    f"{reached.line()}")
                if not study.started:
                    study.ensure_started("HEAD")
                made = study.submit_commit(commit, description, proposer=PROPOSER)
            metric = config.metric.name
            rows = [audit.verdict(c, metric) for c in made]
            cand = next(r for r in rows if r["commit"] == commit)
            return {"id": cand["id"], "status": cand["status"], "commit": commit,
                    "submitted": rows,
                    "next": f"call wait with ids [{', '.join(r['id'] for r in rows)}]"}

    def _base(self, study: Study, base: str | None, incumbent: str) -> str:
        if base is None or base in ("", "incumbent"):
            return incumbent
        why = _bad_ref(base)
        if why:
            raise ToolInputError("base", why)
        cand = study.ledger.candidate(base)
        if cand is None or not cand.commit_sha:
            raise ToolInputError("base", f"no candidate {base!r} with a commit in this study "
                                 "(ids are in `history`; leave base out for the incumbent)")
        return cand.commit_sha

    # -- wait(ids, timeout) ------------------------------------------------------------

    def wait(self, ids: list[str], timeout: float = 50.0) -> dict[str, Any]:
        if not ids:
            raise ToolInputError("ids", "give the ids `submit` returned")
        if len(ids) > MAX_IDS:
            raise ToolInputError("ids", f"{len(ids)} ids; wait for at most {MAX_IDS} at once")
        if not 0 <= timeout <= MAX_WAIT_S:
            raise ToolInputError("timeout", f"{timeout:g} s; give 0 to {MAX_WAIT_S:g} seconds")
        deadline = time.monotonic() + timeout
        with self._study() as study:
            for i, ref in enumerate(ids):
                why = _bad_ref(ref)
                if why or study.ledger.candidate(ref) is None:
                    raise ToolInputError(f"ids[{i}]", why or f"no candidate {ref!r} in this "
                                         "study (ids come from `submit` and `history`)")
            note = None
            while True:  # judging takes the study lock: a `ratchet run` is waited for
                try:
                    study.lock.acquire()
                    break
                except StudyLocked as exc:
                    # the lock's own text tells a person to stop the holder: not for
                    # an agent, which only waits
                    holder = str(exc).split(";")[0]
                    note = (f"the study is held by a ratchet run or another wait judging "
                            f"({holder}); the candidates stay queued and are judged once it "
                            "ends: wait again")
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(min(LOCK_RETRY_S, max(0.0, deadline - time.monotonic())))
            if study.lock.fh is not None:
                note = None
                rows = study.wait_ids(list(ids), timeout=max(0.0, deadline - time.monotonic()))
            else:
                rows = [study.ledger.candidate(ref) for ref in ids]  # type: ignore[misc]
            metric = study.config.metric.name
            verdicts = [audit.verdict(c, metric) for c in rows if c is not None]
            running = [v["id"] for v in verdicts if not _judged(v["status"])]
            out: dict[str, Any] = {
                "done": not running,
                "verdicts": verdicts,
                "incumbent": _incumbent(study),
            }
            if running:
                out["still_running"] = running
                out["next"] = note or "still running: call wait again with these ids"
            return out

    # -- history(n), show(id), idea(text) ----------------------------------------------

    def history(self, n: int = 20) -> dict[str, Any]:
        if not 1 <= n <= 500:
            raise ToolInputError("n", f"{n}; give 1 to 500")
        with self._study() as study:
            metric = study.config.metric.name
            rows = study.ledger.candidates()[-n:]
            return {
                "incumbent": _incumbent(study),
                "candidates": [{**audit.verdict(c, metric), "kind": c.kind, "round": c.round,
                                "proposer": c.proposer, "parent": c.parent} for c in rows],
            }

    def show(self, id: str) -> dict[str, Any]:  # noqa: A002 - the tool's parameter name
        why = _bad_ref(id)
        if why:
            raise ToolInputError("id", why)
        with self._study() as study:
            try:
                cand = audit.row_of(study, id)
            except UserError as exc:
                raise ToolInputError("id", str(exc)) from None
            lines, diff = audit.trail(study, cand)
            if len(diff) > MAX_DIFF_CHARS:
                diff = diff[:MAX_DIFF_CHARS] + f"\n[… {len(diff) - MAX_DIFF_CHARS} characters cut]"
            return {**audit.verdict(cand, study.config.metric.name), "kind": cand.kind,
                    "proposer": cand.proposer, "trail": lines, "diff": diff}

    def idea(self, text: str) -> dict[str, Any]:
        text = _checked_text("text", text, MAX_IDEA)
        with self._study() as study:
            added = study.ledger.add_idea(text, source=PROPOSER)
            return {"queued": added, "note": None if added else "already queued"}


# -- checks on what the agent sends --------------------------------------------------------


def _file_field(path: str) -> str:
    """The field a file of a submission is named by; a path past 120 characters is cut
    (the error says how long it is), so that the error stays a line."""
    shown = path if len(path) <= 120 else path[:120] + "…"
    return f"files[{shown!r}]"


def _judged(status: str) -> bool:
    return Status(status).is_verdict


def _not_unicode(text: str) -> bool:
    """A lone surrogate: JSON's "\\ud800" escape decodes to one, and no file, git
    argument or ledger row can hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _bad_path(path: object) -> str | None:
    """Why a path the agent names is no repository path (paths.unsafe, and text)."""
    if not isinstance(path, str):
        return "is not a string"
    if _not_unicode(path):
        return "is not valid UTF-8 text (a lone surrogate)"
    return unsafe(path)


def _bad_ref(ref: object) -> str | None:
    if not isinstance(ref, str) or not ref.strip():
        return "an empty id (ids look like c0003)"
    if len(ref) > 80 or any(ord(ch) < 32 for ch in ref) or _not_unicode(ref):
        return f"{ref[:80]!r} is not an id (ids look like c0003)"
    return None


def _checked_text(field: str, value: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ToolInputError(field, "is empty; say in a line what it is")
    if "\0" in value:
        raise ToolInputError(field, "contains a NUL character")
    if _not_unicode(value):
        raise ToolInputError(field, "is not valid UTF-8 text (a lone surrogate)")
    if len(value) > limit:
        raise ToolInputError(field, f"{len(value):,} characters; at most {limit:,}")
    return value.strip()


def _checked_files(files: dict[str, str | None]) -> dict[str, bytes | None]:
    """Paths and contents as the agent copy's are checked (proposers/scratch.py's caps);
    None deletes a file."""
    if not isinstance(files, dict) or not files:
        raise ToolInputError("files", "no files; give {path: new full content} for the "
                             "editable files you changed")
    if len(files) > MAX_FILES:
        raise ToolInputError("files", f"{len(files)} files; at most {MAX_FILES} at once")
    out: dict[str, bytes | None] = {}
    total = 0
    for path, content in files.items():
        why = _bad_path(path)
        if why:
            raise ToolInputError(_file_field(path), f"the path {why}; name a file of the "
                                 "repository by its relative path")
        field = _file_field(path)
        if content is None:
            out[path] = None
            continue
        if not isinstance(content, str):
            raise ToolInputError(field, "must be the file's full new content as text, or "
                                 "null to delete it")
        if "\0" in content:
            raise ToolInputError(field, "contains a NUL character: binary content cannot be "
                                 "submitted, only text")
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolInputError(field, "is not valid UTF-8 text (a lone surrogate)") from None
        if len(data) > MAX_FILE_BYTES:
            raise ToolInputError(field, f"{len(data):,} bytes; a file may have at most "
                                 f"{MAX_FILE_BYTES:,}")
        total += len(data)
        if total > MAX_TOTAL_BYTES:
            raise ToolInputError("files", f"more than {MAX_TOTAL_BYTES:,} bytes in all")
        out[path] = data
    return out


def _check_shapes(study: Study, base: str, contents: dict[str, bytes | None]) -> None:
    """A file where BASE has a directory, or under a path that is a file there (or in this
    submission), is no tree git can build: said naming the file, not as git's error."""
    written = [path for path, data in contents.items() if data is not None]
    parents = {path: ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
               for path in written}
    for path in written:
        both = next((up for up in parents[path] if up in contents), None)
        if both is not None:
            raise ToolInputError(_file_field(path), f"is under {both!r}, which this "
                                 "submission also writes or deletes: a path is a file or a "
                                 "directory, not both (delete the file in a submission of "
                                 "its own first)")
    asked = sorted({*written, *(up for ups in parents.values() for up in ups)})
    if not asked:
        return
    # one git process for every path and parent: each line is its object type or "missing"
    listing = gitrepo.git(study.repo, "cat-file", "--batch-check=%(objecttype)",
                          input="".join(f"{base}:{path}\n" for path in asked).encode())
    kinds = {path: line.rsplit(" ", 1)[-1] for path, line in zip(asked, listing.splitlines(),
                                                                  strict=True)}
    for path in written:
        if kinds.get(path) == "tree":
            raise ToolInputError(_file_field(path), "is a directory in the incumbent; name "
                                 "a file in it")
        up = next((up for up in parents[path] if kinds.get(up) not in ("tree", "missing")),
                  None)
        if up is not None:
            raise ToolInputError(_file_field(path), f"{up!r} is a file in the incumbent, "
                                 "not a directory")


def _same_tree(study: Study, commit: str) -> str | None:
    """The earlier candidate with exactly these files, if any (a repeat is never run)."""
    rows = [c for c in study.ledger.candidates() if c.commit_sha]
    trees = study.proposals.trees([commit, *(c.commit_sha or "" for c in rows)])
    mine = trees.get(commit)
    return next((c.id for c in rows if mine and trees.get(c.commit_sha or "") == mine), None)


def _incumbent(study: Study) -> dict[str, Any]:
    """The incumbent as the tools report it: its commit, id and pooled metric."""
    inc = study.ledger.study().incumbent
    return {"commit": inc.commit, "id": inc.id, "metric": inc.metric}
