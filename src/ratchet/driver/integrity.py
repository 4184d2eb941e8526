"""Integrity: what the study pins at its start, and the checks that nothing was tampered with.

Without a sandbox a candidate could write to the ledger, move the study's refs or
rewrite results.tsv while it runs. What the driver trusts is pinned once (protected
files, the start commit), snapshotted before jobs run and compared after; anything
changed is restored, and the candidates that ran in that window are rejected (ratchet
cannot tell which one did it).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path

from ratchet.core.candidate import Incumbent
from ratchet.core.config import CONFIG_FILE, Config
from ratchet.core.errors import UserError
from ratchet.core.paths import protected_by
from ratchet.core.vocab import SUBMITTED_FROM_OUTSIDE, Kind, Status
from ratchet.job import gitrepo
from ratchet.job.jobspec import PinnedFile
from ratchet.store.ledger import INCUMBENT_KEYS, Ledger


class IntegrityError(UserError):
    """The state is inconsistent in a way ratchet must not repair on its own."""


# study state in the ledger a candidate must never change
# (the incumbent record's keys come from the record itself: none can be left out; and
# every `incumbent*` key the ledger holds: see Guard.trusted_keys)
TRUSTED_META = (*INCUMBENT_KEYS.values(), "pinned", "pins", "round", "data_digest", "config")
# what identifies a recorded candidate: none of it changes once the row is written
ROW_FIELDS = ("kind", "commit_sha", "parent", "round", "proposer")


def row_key(cand) -> tuple:
    return tuple(getattr(cand, name) for name in ROW_FIELDS)


def committed_config(repo: Path, head: str) -> str:
    """ratchet.toml as committed at the start (pinned with the protected files)."""
    try:
        return gitrepo.show(repo, head, CONFIG_FILE).decode()
    except gitrepo.GitError:
        raise IntegrityError(
            f"{CONFIG_FILE} is not committed; `git add {CONFIG_FILE} && git commit` first "
            "(it is pinned with the protected files)"
        ) from None


def check_commands(repo: Path, config: Config, head: str) -> None:
    """The evaluator scripts must be committed: fail before anything is pinned."""
    task = config.task
    for key in ("evaluate", "holdout"):  # build/run may use files made on the fly
        command = getattr(task, key) or ""
        try:
            words = [] if "cd " in command else shlex.split(command)  # cd: paths move
        except ValueError:
            continue
        for word in words:
            if (word.endswith((".py", ".sh")) and not word.startswith(("-", "/", "$", "~"))
                    and not any(ch in word for ch in "*?[")
                    and "=" not in word
                    and not gitrepo.path_exists(repo, head, word)):
                raise IntegrityError(
                    f"task.{key} runs {word}, which is not in commit {head[:7]}; "
                    f"commit it (git add {word} && git commit) or fix task.{key} "
                    f"in {CONFIG_FILE}")


def pin_protected(repo: Path, config: Config, commit: str) -> dict[str, dict]:
    """Content and mode of every protected file (and ratchet.toml) at the start commit."""
    listing = gitrepo.git_bytes(repo, "ls-tree", "-r", "-z", commit).decode("utf-8", "replace")
    globs = [*config.task.protected, CONFIG_FILE]
    matched = []  # (path, git mode, blob id); one cat-file call reads them all
    for entry in listing.split("\0"):
        meta, _, path = entry.partition("\t")
        fields = meta.split()
        if path and len(fields) == 3 and fields[1] == "blob" and protected_by(path, globs):
            matched.append((path, fields[0], fields[2]))
    contents = gitrepo.blobs(repo, [blob for *_, blob in matched])
    pins: dict[str, dict] = {}
    for (path, mode, _), content in zip(matched, contents, strict=True):
        pins[path] = PinnedFile.of(content, 0o755 if mode == "100755" else 0o644).__dict__
    for glob in config.task.protected:
        if not any(ch in glob for ch in "*?[") and glob not in pins:
            pins[glob] = PinnedFile.of(None).__dict__  # must stay absent
    return pins


class Guard:
    """The study's trusted state: the incumbent, its branch, refs, verdicts, results.tsv."""

    def __init__(self, repo: Path, ledger: Ledger, study: str, branch: str,
                 log: Callable[[str], None], config: Config) -> None:
        self.repo, self.ledger, self.study, self.branch, self.log = (
            repo, ledger, study, branch, log)
        self.config = config  # for checking a `ratchet submit` made while a round runs

    def legit_commits(self) -> set[str]:
        """Commits the incumbent may be: judged `keep`, or the start."""
        kept = {c.commit_sha for c in self.ledger.candidates(status=Status.KEEP) if c.commit_sha}
        pinned = self.ledger.study().pinned
        return kept | ({pinned} if pinned else set())

    def verify_state(self) -> bool:
        """The incumbent and the branch must be a commit judged `keep` (or the start).

        Anything else was written by someone other than ratchet, typically a candidate
        running without a sandbox: restore the last real keep and reject the candidate
        whose commit was planted. True when it did.
        """
        keeps = sorted(self.ledger.candidates(status=Status.KEEP), key=lambda c: c.judged_at or 0)
        record = self.ledger.study()
        legit = {c.commit_sha for c in keeps} | {record.pinned}
        planted = []
        incumbent = record.incumbent.commit
        if incumbent not in legit:
            planted.append(incumbent)
            last = keeps[-1] if keeps else None
            commit = last.commit_sha if last else record.pinned
            # the restored record pools every judged evaluation of that commit
            values = [c.metric for c in self.ledger.candidates()
                      if c.commit_sha == commit and c.metric is not None
                      and c.status in (Status.KEEP, Status.REFERENCE)]
            self.ledger.set(**Ledger.incumbent_meta(Incumbent(
                commit=commit, id=last.id if last else None,
                metric=sum(values) / len(values) if values else None, samples=values,
                holdout=last.holdout if last else None)))
        branch = gitrepo.try_rev_parse(self.repo, self.branch)
        if branch not in legit:
            planted.append(branch)
        if planted:
            self._undo_planted(planted)
        return bool(planted)

    def _undo_planted(self, planted: list[str | None]) -> None:
        """A commit never judged keep was made the incumbent or the branch: the candidate
        whose commit it is (the one party it serves) is rejected, and the branch goes
        back to the ledger's incumbent."""
        reason = "tampering: planted itself as the incumbent (ledger or study branch)"
        self.ledger.event("tampering", None, planted=planted)
        self.log(f"warning: {reason}; restored the last kept commit")
        for cand in self.ledger.candidates():
            if cand.commit_sha in planted and cand.kind == Kind.CANDIDATE:
                self.ledger.reject(cand.id, reason, time.time())
        gitrepo.update_ref(self.repo, self.branch, self.ledger.study().incumbent_commit,
                           reason="ratchet: undo tampering")

    def held(self) -> tuple[dict, str | None]:
        """The trusted ledger keys and the branch as they are now, for `moved_since`: a
        verdict is written many seconds after the last check (a confirmation, a hold-out),
        and candidates started beside it run on meanwhile."""
        return (self.ledger.stored(self.trusted_keys()),
                gitrepo.try_rev_parse(self.repo, self.branch))

    def moved_since(self, held: tuple[dict, str | None]) -> list[str]:
        """Call inside the verdict's write transaction (it holds the ledger's write lock,
        so nothing lands between this read and the verdict): the trusted keys that
        changed since `held`, each set back. The verdict then overwrites the incumbent's
        keys, and a write it overwrote would otherwise pass every later check."""
        meta, _ = held
        now = self.ledger.stored(self.trusted_keys())
        moved = [key for key, value in now.items() if value != meta.get(key)]
        if moved:
            self.ledger.put_back({key: meta.get(key) for key in moved})
        return moved

    def move_branch(self, new: str, held: tuple[dict, str | None]) -> bool:
        """Move the branch from where `held` saw it to `new` (git's compare-and-swap).
        False when it had moved: it is set to `new` anyway, and that was tampering."""
        _, old = held
        try:
            gitrepo.update_ref(self.repo, self.branch, new, old or "",
                               reason="ratchet: verdict")
            return True
        except gitrepo.GitError:
            gitrepo.update_ref(self.repo, self.branch, new, reason="ratchet: undo tampering")
            return False

    def blame(self, problems: list[str], ids: list[str]) -> list[str]:
        """Tampering found outside `check`: logged, and the unjudged candidates of `ids`
        (those running when it happened) rejected. Returns the ids rejected."""
        reason = "tampering while a verdict was made: " + "; ".join(problems)
        self.ledger.event("tampering", None, problems=problems)
        self.log(f"warning: {reason}; restored, and the candidates running then are rejected")
        rejected = []
        for cand_id in ids:
            cand = self.ledger.candidate(cand_id)
            if cand is not None and cand.kind == Kind.CANDIDATE and not cand.is_judged:
                self.ledger.reject(cand_id, reason, time.time())
                rejected.append(cand_id)
        return rejected

    def repair_branch(self) -> bool:
        """After a crash between the verdict commit and the ref update, finish the move;
        a branch at a commit never kept is tampering, not a crash: undone, and True."""
        incumbent = self.ledger.study().incumbent.commit
        current = gitrepo.try_rev_parse(self.repo, self.branch)
        if current == incumbent:
            return False
        # Only ever move the branch to a commit that was judged `keep` (or the start).
        legit = self.legit_commits()
        if incumbent not in legit:
            # planted in the ledger after `verify_state` looked (a candidate running since
            # `submit`, unsandboxed, writes it between the two checks of a start): the same
            # tampering, undone the same way; it once stopped `ratchet wait` instead
            return self.verify_state()
        if current is not None and current not in legit:
            # not a crash's remnant (the branch only ever lags the ledger, at an earlier
            # keep): a candidate still running since `submit` moved it after the check
            # above, which the next snapshot would otherwise have taken as trusted
            self._undo_planted([current])
            return True
        gitrepo.update_ref(self.repo, self.branch, incumbent, reason="ratchet: repair")
        self.ledger.event("branch-repaired", None, commit=incumbent, was=current)
        return False

    def snapshot(self) -> dict:
        """What the driver trusts, taken before candidates run."""
        out = gitrepo.git(self.repo, "for-each-ref", "--format=%(refname) %(objectname)",
                          f"refs/ratchet/{self.study}/", self.branch)
        tsv = self.repo / "results.tsv"
        return {
            "meta": self.ledger.stored(self.trusted_keys()),
            "refs": dict(line.split() for line in out.splitlines() if line.strip()),
            "tsv": tsv.read_bytes() if tsv.exists() else None,
            "verdicts": self.ledger.verdicts(),
            "rows": self.ledger.columns(ROW_FIELDS),  # row_key of every row, undecoded
        }

    def snapshot_checked(self) -> dict:
        """`snapshot` for a window whose candidates were already running (`ratchet wait`
        after `submit`): one may plant itself (the ledger's incumbent, the branch) after
        the start's checks and before the snapshot, which would then trust it. So the
        checks run again after the snapshot: a plant before it is still there for them,
        one after it is `check`'s; what they undo is snapshotted afresh."""
        trusted = self.snapshot()
        for _ in range(3):
            if not (self.verify_state() or self.repair_branch()):
                break
            trusted = self.snapshot()
        return trusted

    def trusted_keys(self) -> list[str]:
        """TRUSTED_META and every `incumbent*` key the ledger holds."""
        keys = [row[0] for row in self.ledger.db.execute("SELECT key FROM meta")]
        return list(dict.fromkeys([*TRUSTED_META, *(k for k in keys
                                                    if k.startswith("incumbent"))]))

    def expect(self, before: dict, *, meta: dict | None = None,
               refs: dict[str, str] | None = None,
               verdicts: dict[str, tuple] | None = None,
               rows: dict[str, tuple] | None = None) -> dict:
        """`before` plus the driver's own writes since: what `check` must then find.

        Rolling search writes while candidates run; checking against this (rather than
        a fresh snapshot) catches a candidate that wrote at the same time. results.tsv
        is taken as it is now: it is a view the driver has just rebuilt from the ledger.
        """
        tsv = self.repo / "results.tsv"
        return {
            "meta": {**before["meta"],
                     **{k: v for k, v in (meta or {}).items()
                        if k in TRUSTED_META or k.startswith("incumbent")}},
            "refs": {**before["refs"], **(refs or {})},
            "tsv": tsv.read_bytes() if tsv.exists() else None,
            "verdicts": {**before["verdicts"], **(verdicts or {})},
            "rows": {**before.get("rows", {}), **(rows or {})},
        }

    def check(self, before: dict, ids: list[str]) -> bool:
        """Compare with `before`; restore it and reject the unjudged `ids` (the candidates
        that ran meanwhile) if anything changed. True when tampering was found.

        Rolling search snapshots again after each of the driver's own changes, so a
        window is always "since the driver last wrote". A `ratchet submit` made meanwhile
        (a new row by the `submit` or `mcp` proposer whose ref names its commit and whose
        change is in scope) is a person's legitimate act, never tampering.
        """
        after = self.snapshot()
        submitted = self._submissions(before, after)
        for cand_id, ref in submitted.items():
            after["rows"].pop(cand_id, None)
            after["refs"].pop(ref, None)
            after["verdicts"].pop(cand_id, None)
        problems = []
        if after["meta"] != before["meta"]:
            keys = list(dict.fromkeys([*before["meta"], *after["meta"]]))
            changed = [k for k in keys if after["meta"].get(k) != before["meta"].get(k)]
            problems.append(f"study state in the ledger changed ({', '.join(changed)})")
            self.ledger.put_back(before["meta"])
        if after["refs"] != before["refs"]:
            problems.append("git refs of the study were moved")
            for ref, sha in before["refs"].items():
                if after["refs"].get(ref) != sha:
                    gitrepo.update_ref(self.repo, ref, sha, reason="ratchet: undo tampering")
            for ref in after["refs"]:
                if ref not in before["refs"]:
                    gitrepo.git(self.repo, "update-ref", "-d", ref)
        rows_before = before.get("rows", {})
        changed_rows = [i for i, key in rows_before.items() if after["rows"].get(i) != key]
        if changed_rows:
            problems.append(f"recorded candidates were rewritten ({', '.join(changed_rows)}: "
                            "commit, parent or kind)")
            for cand_id in changed_rows:
                if after["rows"].get(cand_id) is not None:
                    self.ledger.restore(cand_id, **dict(zip(ROW_FIELDS, rows_before[cand_id],
                                                            strict=True)))
        forged = [i for i in after["rows"] if i not in rows_before]
        if forged:
            problems.append(f"candidates were added behind the driver's back "
                            f"({', '.join(forged)})")
            for cand_id in forged:  # never run, never kept
                self.ledger.reject(cand_id, "tampering: recorded behind the driver's back",
                                   time.time())
                after["verdicts"].pop(cand_id, None)
        if after["verdicts"] != before["verdicts"]:
            problems.append("earlier verdicts in the ledger were changed")
            for cand_id, (status, metric) in before["verdicts"].items():
                self.ledger.restore_verdict(cand_id, Status(status), metric)
        if after["tsv"] != before["tsv"]:
            problems.append("results.tsv was modified")
        if not problems:
            return False
        reason = "tampering while this round ran: " + "; ".join(problems)
        self.ledger.event("tampering", None, problems=problems)
        self.log(f"warning: {reason}; restored, and this round's candidates are rejected")
        for cand_id in ids:
            cand = self.ledger.candidate(cand_id)
            if cand is not None and cand.kind == Kind.CANDIDATE and not cand.is_judged:
                self.ledger.reject(cand_id, reason, time.time())
        return True

    def _submissions(self, before: dict, after: dict) -> dict[str, str]:
        """New rows made by `ratchet submit` or `ratchet mcp` meanwhile: {id: its ref}. Each
        is checked as its own submission would be: its ref names its commit, its change is
        in scope."""
        from ratchet.driver.candidate import scope_violations, study_ref

        found = {}
        for cand_id, key in after["rows"].items():
            if cand_id in before.get("rows", {}):
                continue
            fields = dict(zip(ROW_FIELDS, key, strict=True))
            if fields["proposer"] not in SUBMITTED_FROM_OUTSIDE or \
                    fields["kind"] != Kind.CANDIDATE:
                continue
            ref = study_ref(self.study, cand_id)
            commit, parent = fields["commit_sha"], fields["parent"]
            if not commit or after["refs"].get(ref) != commit or ref in before["refs"]:
                continue
            try:
                if scope_violations(self.repo, self.config, parent, commit):
                    continue
            except gitrepo.GitError:
                continue
            found[cand_id] = ref
        return found

    def mismatched(self, cands: list) -> dict[str, str | None]:
        """Candidates whose ledger commit is not the commit their ref names, with the
        ref's commit: what would be judged is not what was proposed. The judge must not
        judge them; the ref (written when the proposal was recorded) is the record."""
        from ratchet.driver.candidate import study_ref

        bad = {}
        # their refs in one call: a ref naming the row's commit itself is what rev-parse
        # would say; any other (absent, a tag, another commit) is asked of rev-parse
        bound = [c for c in cands if c.kind == Kind.CANDIDATE and c.commit_sha]
        listed = gitrepo.refs(self.repo, *(study_ref(self.study, c.id) for c in bound)) \
            if bound else {}
        for cand in bound:
            ref = study_ref(self.study, cand.id)
            if listed.get(ref) == (cand.commit_sha, "commit"):
                continue
            named = gitrepo.try_rev_parse(self.repo, ref)
            if named != cand.commit_sha:
                bad[cand.id] = named
        return bad
