"""The tinygpt example end to end: prepare the bytes, train briefly, evaluate, reject a cheat.

Real subprocesses, the example's own scripts, a temporary copy so nothing lands in the repo.
Skipped where PyTorch is not installed (it is an optional, heavy dependency).
"""

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tinygpt"


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 60) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def metrics(output: str) -> dict[str, str]:
    return dict(re.findall(r"^(\w+): (\S+)$", output, flags=re.MULTILINE))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A copy of the example with prepared data and a model trained for 3 seconds."""
    work = tmp_path_factory.mktemp("tinygpt")
    for name in ("prepare.py", "train.py", "evaluate.py", "ratchet.toml"):
        shutil.copy(EXAMPLE / name, work / name)
    env = {
        **os.environ,
        "RATCHET_DATA": str(work / "prepared"),
        "TINYGPT_TIME_BUDGET": "3",
        "OMP_NUM_THREADS": "1",
    }
    run(["prepare.py"], work, env)
    assert (work / "prepared" / "train.bin").stat().st_size == 4 * 1024 * 1024
    # A second run finds the data complete and leaves it alone.
    assert "already prepared" in run(["prepare.py"], work, env)
    run(["train.py"], work, env)
    assert (work / "model.pt").is_file()
    return work, env


def test_trained_model_scores_below_random(workdir):
    work, env = workdir
    out = metrics(run(["evaluate.py"], work, env))
    assert out["correct"] == "true"
    bpb = float(out["val_bpb"])
    # A uniform guess over 256 byte values costs exactly 8 bits per byte.
    assert math.isfinite(bpb) and 0 < bpb < 8.0
    assert int(out["num_params"]) > 0
    assert float(out["memory_gb"]) > 0
    assert 2.5 < float(out["train_seconds"]) < 10

    holdout = metrics(run(["evaluate.py", "--holdout"], work, env))
    assert math.isfinite(float(holdout["val_bpb"])) and float(holdout["val_bpb"]) < 8.0
    assert holdout["val_bpb"] != out["val_bpb"]  # a different split, scored under one name


def test_mismatched_architecture_is_rejected(workdir):
    work, env = workdir
    checkpoint = torch.load(work / "model.pt", weights_only=True)
    # Claim a wider model than the weights hold: the evaluator's GPT cannot load them.
    checkpoint["config"]["n_embd"] *= 2
    torch.save(checkpoint, work / "wrong.pt")
    proc = subprocess.run(
        [sys.executable, "evaluate.py", "--model", "wrong.pt"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = metrics(proc.stdout)
    assert out["correct"] == "false"
    assert "val_bpb" not in out
    assert "do not match" in proc.stderr


def test_missing_model_exits_nonzero(workdir):
    work, env = workdir
    proc = subprocess.run(
        [sys.executable, "evaluate.py", "--model", "absent.pt"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "not found" in proc.stderr


def test_config_declares_the_task():
    import tomllib

    config = tomllib.loads((EXAMPLE / "ratchet.toml").read_text())
    assert config["task"]["metric"] == {"name": "val_bpb", "goal": "minimize"}
    assert config["task"]["editable"] == ["train.py"]
    assert set(config["task"]["protected"]) == {"evaluate.py", "prepare.py"}
    source = (EXAMPLE / "train.py").read_text()
    for knob in config["tune"]["knobs"]:
        path, name = knob.split(":")
        assert path == "train.py"
        # A tuner rewrites `NAME = literal` lines: each knob must be exactly one of them.
        assert len(re.findall(rf"^{name} = \S+$", source, flags=re.MULTILINE)) == 1, name
