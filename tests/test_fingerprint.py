"""The machine fingerprint's library versions, read without importlib.metadata (fast, pure)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from ratchet.job import fingerprint

ROOT = Path(__file__).resolve().parents[1]


def test_versions_agree_with_importlib_metadata():
    names = ("numpy", "torch", "pydantic", "Optuna", "typing-extensions", "no-such-dist-xyz")
    found = fingerprint._versions(names)
    for name in names:
        try:
            expected = metadata.version(name)
        except metadata.PackageNotFoundError:
            assert name not in found
        else:
            assert found[name] == expected
    assert "pydantic" in found  # a core dependency: the lookup found something real


def test_versions_read_the_metadata_header_first_on_the_path(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    for root, version in ((first, "1.2.3"), (second, "9.9.9")):
        info = root / f"Fancy_Lib-{version}.dist-info"
        info.mkdir(parents=True)
        # the header wins over the directory name; the body is not read as headers
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fancy-lib\n"
                                       f"Version: {version}+local\n\nVersion: 0.0.0\n")
    egg = tmp_path / "c" / "old.lib-0.5-py3.11.egg-info"
    egg.parent.mkdir()
    egg.write_text("Name: old.lib\nVersion: 0.5\n")  # an egg-info file is PKG-INFO itself
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(first), str(second),
                                      str(egg.parent)])
    assert fingerprint._versions(("fancy.lib", "old-lib", "absent")) == {
        "fancy.lib": "1.2.3+local", "old-lib": "0.5"}


def test_fingerprint_does_not_import_importlib_metadata():
    code = ("import sys; from ratchet.job.fingerprint import machine_fingerprint as f; f(); "
            "print('importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin",
                                          "PYTHONPATH": str(ROOT / "src")})
    assert out.stdout.split() == ["False"]
