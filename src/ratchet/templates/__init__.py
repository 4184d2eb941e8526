"""`ratchet init --template kernel|train|blank`: starter research repositories.

The kernel and train templates are the bundled examples (examples/kernel-cpu and
examples/tinygpt); a test keeps the copies here byte-identical to them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ratchet.job import gitrepo

TEMPLATES = ("kernel", "train", "blank")


def template_files(name: str) -> dict[str, bytes]:
    if name not in TEMPLATES:
        raise ValueError(f"--template: unknown template {name!r} (expected kernel, train or blank)")
    root = resources.files(__package__) / name
    files: dict[str, bytes] = {}

    def walk(node, prefix: str) -> None:
        for child in node.iterdir():
            if child.name in ("__pycache__", "data") or child.name.endswith(".pyc"):
                continue
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            else:
                # a real .gitignore would be ignored by packaging tools; ship it renamed
                name = ".gitignore" if child.name == "gitignore" else child.name
                files[f"{prefix}{name}"] = child.read_bytes()

    walk(root, "")
    shared = resources.files(__package__) / "program.md"
    files.setdefault("program.md", shared.read_bytes())
    return files


def write_template(name: str, dest: Path, force: bool = False) -> list[Path]:
    files = template_files(name)
    dest.mkdir(parents=True, exist_ok=True)
    clashes = [p for p in files if (dest / p).exists()]
    if clashes and not force:
        raise FileExistsError(
            f"{dest / clashes[0]} exists; use --force to overwrite or init another directory"
        )
    written = []
    for rel, content in sorted(files.items()):
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        written.append(path)
    return written


def repository_root_or_none(dest: Path) -> Path | None:
    """The repository `dest` is the root of, or None when `dest` is in no repository.

    ratchet reads `ratchet.toml` from a repository's root, so a `dest` inside another
    repository would get a task that `ratchet run` never finds: that is an error here,
    before anything is written.
    """
    probe = dest
    while not probe.exists():  # a directory init is about to create: ask its parent
        probe = probe.parent
    top = gitrepo.work_tree(probe)
    if top is None:
        return None
    if top.resolve() != dest.resolve():
        raise ValueError(
            f"{dest} is inside the git repository {top}, and ratchet reads ratchet.toml "
            f"from a repository's root: run `ratchet init` in {top}, or `git init {dest}` "
            "first to make it a repository of its own"
        )
    return top


def init_repository(dest: Path) -> None:
    """`git init`: a study starts from a commit, so the task needs a repository.

    Nothing is committed here: the user commits the task (the printed next step), so
    nothing enters their history unseen.
    """
    gitrepo.git(dest, "init", "-q")
