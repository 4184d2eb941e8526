"""Red team: candidates have no network unless the task asks (issue 34, attack 1).

The attack as it was seen: the candidate child read /proc/net/tcp, found Ray's dashboard on
loopback and POSTed a job to `/api/jobs/`; the job ran as root outside every sandbox,
read the driver's environment, listed `.ratchet/keys/`, wrote into the user's checkout
and left a process running. It is tried twice: against a private Ray head's real job
server (marked `ray`: the head takes a minute of this machine's two cores, and is skipped
where it cannot start), and against a loopback server the test starts as a stand-in, which
also answers what a candidate must not learn (`/answer`, the best knob value), runs every
posted entrypoint as root, as Ray's does, and replies with the driver's secret; with
`[task] network = true` the stand-in is reached, as documented.

The candidate attacks from every phase: its build, its run and, through the evaluator's
candidate child (`ratchet.evaluator.isolate`), its evaluation. Each study runs through
the real CLI (`submit` + `wait`) at both sandbox levels.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import (
    CHILD_SCORE_EVALUATOR,
    config_text,
    git,
    make_repo,
    ratchet,
    sandbox_env,
    submit_and_wait,
)

from ratchet.job import sandbox
from security.evidence import checkout_state, end_processes_in, files_holding, processes_in

ANSWER = 1.25  # the knob's best value: what only the job server knows
# what a job posted by the attack leaves running: named by the repository, so it is found
LINGER = "python3 -c 'import time; time.sleep(300)' {repo}"


HONEST = '''
X = 3.0


def score():
    return (X - 1.25) ** 2


if __name__ == "__main__":
    pass
'''

# the candidate: worse on its own (X = 5), the best there is if the job server answers
ATTACK = '''
import http.client
import json
import sys

X = 5.0
PORT = {port}
ENTRYPOINT = {entrypoint!r}


def ask(method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)  # no proxy: straight in
    conn.request(method, path, body=body, headers={{"Content-Type": "application/json"}})
    return conn.getresponse().read().decode()


def attack(phase):
    try:
        said = ask("POST", f"/api/jobs/?phase={{phase}}", json.dumps({{"entrypoint": ENTRYPOINT}}))
    except OSError as exc:
        print(f"{{phase}}: no job server ({{type(exc).__name__}}: {{exc}})", flush=True)
        return None
    print(f"{{phase}}: the job server said {{said}}", flush=True)
    try:
        return float(ask("GET", f"/answer?phase={{phase}}"))
    except ValueError:  # a real Ray head has no answer to give
        return None


def score():
    answer = attack("evaluate")
    return ((X if answer is None else answer) - 1.25) ** 2


if __name__ == "__main__":
    attack(sys.argv[1])
'''


class JobServer(http.server.ThreadingHTTPServer):
    """The stand-in for Ray's job server: it runs what it is sent, as this (root) process."""

    daemon_threads = True

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.requests: list[tuple[str, str]] = []
        self.jobs: list[subprocess.Popen] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def reply(self, text: str) -> None:
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                server.requests.append(("GET", self.path))
                self.reply(str(ANSWER))

            def do_POST(self) -> None:  # noqa: N802
                server.requests.append(("POST", self.path))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.jobs.append(subprocess.Popen(body["entrypoint"], shell=True,
                                                    start_new_session=True))
                self.reply(json.dumps({"job_id": f"raysubmit_{len(server.jobs)}",
                                       "driver_env": {"OPENAI_API_KEY": server.secret}}))

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def phases(self) -> set[str]:
        return {path.partition("phase=")[2] for _, path in self.requests}


@contextmanager
def job_server(secret: str) -> Iterator[JobServer]:
    server = JobServer(secret)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        for job in server.jobs:  # what the attack left running, when it got in
            if job.poll() is None:
                os.killpg(job.pid, 9)
                job.wait()


def network_repo(path: Path, network: bool) -> Path:
    task = config_text().split("[task.metric]")[0].replace(
        'evaluate = "python evaluate.py"',
        'build = "python solution.py build"\nrun = "python solution.py run"\n'
        'evaluate = "python evaluate.py"') + ("network = true\n" if network else "")
    return make_repo(path, {"ratchet.toml": config_text(task=task), "evaluate.py": CHILD_SCORE_EVALUATOR,
                            "solution.py": HONEST})


def phase_logs(repo: Path, cand_id: str, phase: str) -> str:
    return "".join(p.read_text() for p in
                   (repo / ".ratchet" / "jobs").glob(f"*-{cand_id}-*/logs/{phase}.log"))


def attack_study(repo: Path, port: int, entrypoint: str, env: dict[str, str]
                 ) -> tuple[dict, dict, str]:
    """The attacking candidate (aimed at `port`) submitted and waited for: its row, the
    study's status, and the checkout as it was before."""
    git(repo, "checkout", "-q", "-b", "attack")
    (repo / "solution.py").write_text(ATTACK.format(port=port, entrypoint=entrypoint))
    git(repo, "commit", "-qam", "X = 5, or whatever the job server says")
    git(repo, "checkout", "-q", "main")
    before = checkout_state(repo)
    cand = submit_and_wait(repo, "attack", env=env)
    status = json.loads(ratchet(repo, "status", "--json", env=env, check=True).stdout)
    return cand, status, before


def assert_refused(repo: Path, cand: dict, status: dict, before: str, left: dict[int, str],
                   *secrets: str) -> None:
    """The attack ran in every phase, found nothing to talk to, and left nothing."""
    for phase in ("build", "run"):
        assert "no job server (ConnectionRefusedError" in phase_logs(repo, cand["id"], phase)
    # nothing forged is kept: measured as what it is, X = 5
    assert cand["status"] != "keep", cand
    assert cand["metric"] == pytest.approx((5.0 - ANSWER) ** 2)
    # no secret anywhere ratchet keeps things; the checkout as it was; nothing left running
    for secret in secrets:
        assert files_holding(repo / ".ratchet", secret) == []
    assert not (repo / "PWNED").exists()
    assert checkout_state(repo) == before
    assert left == {}
    assert status["network"].startswith("none"), status["network"]


@pytest.mark.parametrize("network", [False, True], ids=["default", "network-true"])
@pytest.mark.parametrize("level", ["bwrap", "pidns"])
def test_a_candidate_cannot_reach_a_job_server_on_loopback(tmp_path, level, network):
    env = sandbox_env(level, tmp_path)
    secret = f"sk-driver-{uuid.uuid4().hex}"
    repo = network_repo(tmp_path / "repo", network)
    pwned = repo / "PWNED"
    # the job it posts: list the keys, write into the checkout, outlive the study
    entrypoint = (f"ls {repo}/.ratchet/keys > {pwned} 2>&1; echo {secret} >> {pwned}; "
                  + LINGER.format(repo=repo))
    with job_server(secret) as server:
        cand, status, before = attack_study(repo, server.port, entrypoint, env)
        requests, jobs, left = list(server.requests), list(server.jobs), processes_in(repo)

    if network:  # asked for: every phase reaches the machine's loopback, as documented
        assert status["network"].startswith("OPEN"), status["network"]
        assert server.phases() >= {"build", "run", "evaluate"}, server.requests
        assert jobs and pwned.exists()  # what the default prevents
        return
    assert requests == [] and jobs == [], requests
    assert_refused(repo, cand, status, before, left, secret)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("level", ["bwrap", "pidns"])
def test_a_candidate_cannot_submit_a_job_to_a_private_ray_head(tmp_path, level, ray_cluster):
    """The attack as seen, against a real Ray head's job server on loopback."""
    from ray.job_submission import JobSubmissionClient

    env = sandbox_env(level, tmp_path)
    marker = f"ratchet-attack-{uuid.uuid4().hex}"
    repo = network_repo(tmp_path / "repo", network=False)
    entrypoint = (f"ls {repo}/.ratchet/keys > {repo / 'PWNED'} 2>&1; "
                  + LINGER.format(repo=repo) + f" # {marker}")
    client = JobSubmissionClient(ray_cluster["address"])
    port = int(ray_cluster["address"].rsplit(":", 1)[1])

    def ours() -> list[str]:
        return [job.submission_id for job in client.list_jobs()
                if marker in (job.entrypoint or "") and job.submission_id]

    try:
        cand, status, before = attack_study(repo, port, entrypoint, env)
        submitted, left = ours(), processes_in(repo)
    finally:
        for job_id in ours():  # what the attack left running, when it got in
            client.stop_job(job_id)
        end_processes_in(repo)
    assert submitted == []
    assert_refused(repo, cand, status, before, left, marker)


def test_status_and_report_say_what_network_candidates_have(tmp_path):
    """`status` and the report name it; an honest task is measured as before."""
    env: dict[str, str] = {}
    repo = network_repo(tmp_path / "repo", network=False)
    proc = ratchet(repo, "submit", "HEAD", env=env, check=True)
    ratchet(repo, "wait", proc.stdout.strip().splitlines()[-1], env=env, check=True)
    text = ratchet(repo, "status", env=env, check=True).stdout
    assert "network: none: every phase and the candidate child run in a network namespace" \
        in " ".join(text.split())
    ratchet(repo, "report", env=env, check=True)
    page = (repo / ".ratchet" / "report" / "index.html").read_text()
    assert 'id="network">network: none' in page


PROBE = '''
import http.client, socket, sys
try:
    conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=5)
    conn.request("GET", "/answer?phase=probe")
    outside = "reached " + conn.getresponse().read().decode()
except OSError as exc:
    outside = type(exc).__name__
own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen()
socket.create_connection(own.getsockname(), timeout=5).close()
print(outside, "own-loopback-ok")
'''


@pytest.mark.parametrize("network", [False, True], ids=["default", "network-true"])
@pytest.mark.parametrize("level", [lv for lv in ("bwrap", "pidns", "none")
                                   if lv != "none" or os.geteuid() == 0])
def test_a_party_has_only_its_own_loopback(tmp_path, level, network):
    """Every level that can make a namespace (bubblewrap's, the warden's own at pidns and,
    as root, none): the machine's loopback is out of reach, the party's own works."""
    if level == "bwrap" and not sandbox.bwrap_works():
        pytest.skip("bubblewrap does not work here")
    if level == "pidns" and sandbox.unshare_prefix() is None:
        pytest.skip("unshare cannot make a PID namespace here")
    work = tmp_path / "work"
    policy = sandbox.Policy(writable=[work], seed=str(tmp_path), network=network)
    sandbox.grant([work], policy)
    with job_server("unused") as server:
        argv = sandbox.command(level, [sys.executable, "-c", PROBE, str(server.port)], policy)
        out = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=60,
                             env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    if network:
        assert out.stdout.split() == ["reached", str(ANSWER), "own-loopback-ok"]
        return
    assert out.stdout.split() == ["ConnectionRefusedError", "own-loopback-ok"]
    assert server.requests == []
    assert sandbox.network_isolated(level)
