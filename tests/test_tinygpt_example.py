"""The tinygpt example end to end: prepare the bytes, train briefly, export, evaluate, reject.

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


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
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
    """A copy of the example with prepared data and a program trained for 3 seconds."""
    work = tmp_path_factory.mktemp("tinygpt")
    for name in ("prepare.py", "train.py", "evaluate.py", "ratchet.toml"):
        shutil.copy(EXAMPLE / name, work / name)
    # 16 KiB scored instead of 128, as in tests/train/test_train_study.py: the same code on
    # fewer windows (two scorings took 108 s of this module's 199 on a loaded machine)
    evaluator = work / "evaluate.py"
    text = evaluator.read_text()
    assert "\nEVAL_BYTES = 128 * 1024\n" in text
    evaluator.write_text(text.replace("\nEVAL_BYTES = 128 * 1024\n", "\nEVAL_BYTES = 16 * 1024\n"))
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
    trained = metrics(run(["train.py"], work, env))
    assert (work / "model.pt2").is_file()
    # The budget counts training steps only; on a CPU there is no MFU or GPU memory to report.
    assert 2.5 < float(trained["train_seconds"]) < 10
    assert float(trained["tokens_per_sec"]) > 0 and trained["device"] == "cpu"
    assert "mfu_percent" not in trained
    return work, env


def test_trained_model_scores_below_random(workdir):
    work, env = workdir
    out = metrics(run(["-I", "evaluate.py"], work, env))
    assert out["correct"] == "true"
    bpb = float(out["val_bpb"])
    # A uniform guess over 256 byte values costs exactly 8 bits per byte.
    assert math.isfinite(bpb) and 0 < bpb < 8.0
    assert int(out["num_params"]) == 141_056  # the CPU default, as before
    assert out["context"] == "128"

    holdout = metrics(run(["-I", "evaluate.py", "--holdout"], work, env))
    assert math.isfinite(float(holdout["val_bpb"])) and float(holdout["val_bpb"]) < 8.0
    assert holdout["val_bpb"] != out["val_bpb"]  # a different split, scored under one name


def test_a_checkpoint_instead_of_a_program_is_rejected(workdir):
    work, env = workdir
    # The old format, a pickled state dict, is not something the evaluator will unpickle.
    torch.save({"model": {"w": torch.zeros(2)}}, work / "checkpoint.pt2")
    proc = subprocess.run(
        [sys.executable, "-I", "evaluate.py", "--model", "checkpoint.pt2"],
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
    assert "rejected" in proc.stderr and "reason: " in proc.stdout


def test_missing_model_exits_nonzero(workdir):
    work, env = workdir
    proc = subprocess.run(
        [sys.executable, "-I", "evaluate.py", "--model", "absent.pt2"],
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
    # The evaluator runs isolated: nothing in the candidate's directory is importable.
    assert config["task"]["evaluate"].startswith("python -I ")
    source = (EXAMPLE / "train.py").read_text()
    for knob in config["tune"]["knobs"]:
        path, name = knob.split(":")
        assert path == "train.py"
        # A tuner rewrites `NAME = literal` lines: each knob must be exactly one of them.
        assert len(re.findall(rf"^{name} = \S+$", source, flags=re.MULTILINE)) == 1, name
