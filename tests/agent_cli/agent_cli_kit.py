"""Where the real agent CLIs are, and a private CA for their HTTPS model server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # agent_server, helpers

ROOT = TESTS.parent
AGENTS_BIN = ROOT / ".venv-agents" / "bin"


def cli(name: str) -> Path:
    """The installed CLI, or a skip that says how to install it."""
    for candidate in (AGENTS_BIN / name, shutil.which(name)):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    pytest.skip(f"{name} is not installed: run `make agent-clis` "
                f"(scripts/install_agent_clis.sh puts it in .venv-agents/bin)")


@dataclass(frozen=True)
class LoopbackCA:
    """A private CA and a certificate for 127.0.0.1 that it signed: the loopback model serves
    HTTPS as a TLS-re-signing proxy would, and a CLI reaches it only through the CA bundle
    variable the user names in `[agent] env`."""

    ca: Path
    cert: Path
    key: Path


def make_ca(d: Path) -> LoopbackCA:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make the test CA (apt-get install openssl)")
    os.chmod(d, 0o755)  # the agent reads the CA bundle as its sandbox's uid

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=ratchet test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                               "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    for name in ("ca.pem", "server.pem"):
        os.chmod(d / name, 0o644)
    return LoopbackCA(d / "ca.pem", d / "server.pem", d / "server.key")


@dataclass(frozen=True)
class SandboxLevel:
    """The agent sandbox a test runs the CLI in, and the PATH entries that make it so."""

    name: str  # as the candidate's params record it
    path: tuple[str, ...] = ()  # put first on the driver's PATH


def sandbox_level(name: str, tmp_path: Path) -> SandboxLevel:
    """`bwrap`, or `pidns` as on a machine without bubblewrap: a PATH whose bwrap fails."""
    from ratchet.job import sandbox

    if name == "bwrap":
        if not sandbox.bwrap_works():
            pytest.skip("bubblewrap does not work here (apt-get install bubblewrap)")
        return SandboxLevel(name)
    if sandbox.unshare_prefix() is None:
        pytest.skip("unshare cannot make a PID namespace here")
    stub = tmp_path / "no-bwrap"
    stub.mkdir()
    (stub / "bwrap").write_text("#!/bin/sh\nexit 1\n")
    (stub / "bwrap").chmod(0o755)
    return SandboxLevel(name, (str(stub),))


def codex_home(tmp_path: Path, url: str, more: str = "") -> Path:
    """A user's Codex configuration: a provider at the loopback server's address, and
    MORE (further tables, e.g. an MCP server's)."""
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(f"""
model = "gpt-5.1-codex"
model_provider = "loopback"

[model_providers.loopback]
name = "loopback"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "OPENAI_API_KEY"
request_max_retries = 0
stream_max_retries = 0
""" + more)
    return home
