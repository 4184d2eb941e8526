"""The tinygpt evaluator against exported programs built here: honest, cheating and hostile.

The programs are tiny (a few thousand parameters, no training), so each case takes well
under a second. The evaluator module is the example's own file, loaded from disk; the
hostile archives are what a candidate's train.py could write instead of a real export.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tinygpt"
BATCH, CONTEXT, WIDTH = 64, 32, 16


@pytest.fixture(scope="module")
def ev():
    spec = importlib.util.spec_from_file_location("tinygpt_evaluate", EXAMPLE / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def val_bytes() -> np.ndarray:
    # Text-like bytes: the scores do not matter here, only what gets rejected and why.
    rng = np.random.default_rng(0)
    return rng.integers(32, 127, size=256 * 1024, dtype=np.uint8)


class Tiny(nn.Module):
    """A one-layer causal byte model; `variant` switches in one cheat or defect."""

    def __init__(self, variant: str = "honest"):
        super().__init__()
        torch.manual_seed(0)
        self.variant = variant
        self.wte = nn.Embedding(256, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.head = nn.Linear(WIDTH, 128 if variant == "narrow_vocab" else 256)
        if variant == "stateful":
            self.register_buffer("calls", torch.zeros(1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        if self.variant == "cross_row":  # reads the other sequences of the batch
            x = x + x.mean(0, keepdim=True)
        B, T, C = x.shape
        q, k, v = (t.view(B, T, 2, C // 2).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        causal = self.variant not in ("lookahead", "loud_lookahead")
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        logits = self.head(y.transpose(1, 2).reshape(B, T, C))
        if self.variant == "loud_lookahead":  # one huge, unused logit: a tolerance scaled
            logits = torch.cat([logits[..., :1] - 1e6, logits[..., 1:]], -1)  # by it misses
        if self.variant == "noisy":
            logits = logits + torch.rand_like(logits)
        if self.variant == "int_logits":
            logits = logits.long()
        if self.variant == "stateful":
            self.calls.add_(1)
            logits = logits + self.calls
        return logits


def export(path: Path, variant: str = "honest", dynamic: bool = False) -> Path:
    example = torch.zeros(BATCH, CONTEXT, dtype=torch.long)
    shapes = ({0: torch.export.Dim("batch", min=2, max=64)},) if dynamic else None
    program = torch.export.export(Tiny(variant).eval(), (example,), dynamic_shapes=shapes)
    torch.export.save(program, path)
    return path


def score(ev, path: Path, data: np.ndarray) -> float:
    module, batch, context, _ = ev.load_program(path, torch.device("cpu"))
    return ev.bits_per_byte(ev.Scorer(module, batch, context, torch.device("cpu")), data)


def rewrite(src: Path, dst: Path, change) -> Path:
    """Copy a .pt2 archive entry by entry, letting `change` edit the entries on the way."""
    with zipfile.ZipFile(src) as z:
        prefix = z.namelist()[0].split("/")[0]
        files = {n.split("/", 1)[1]: z.read(n) for n in z.namelist()}
    change(files)
    writer = torch._C.PyTorchFileWriter(str(dst))
    writer.set_min_version(6)  # as torch.export.save does
    for name, data in files.items():
        if not name.startswith(".data/"):
            writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    assert prefix
    return dst


class RunsCode:
    """Unpickling this touches a file: proof that a loader executed the archive's code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def pickled_weight(marker: Path):
    def change(files: dict[str, bytes]) -> None:
        config = json.loads(files["data/weights/model_weights_config.json"])
        entry = config["config"]["head.bias"]
        entry["use_pickle"] = True
        buffer = io.BytesIO()
        torch.save(RunsCode(marker), buffer)
        files["data/weights/" + entry["path_name"]] = buffer.getvalue()
        files["data/weights/model_weights_config.json"] = json.dumps(config).encode()

    return change


def _edit_graph(files: dict[str, bytes], edit) -> None:
    graph = json.loads(files["models/model.json"])
    edit(graph)
    files["models/model.json"] = json.dumps(graph).encode()


def sympy_expression(marker: Path):
    """A symbolic batch size whose 'expression' is Python (sympy.sympify evaluates it)."""
    code = f"__import__('pathlib').Path('{marker}').touch()"

    def edit(graph: dict) -> None:
        sizes = graph["graph_module"]["graph"]["tensor_values"]["idx"]["sizes"]
        sizes[0] = {"as_expr": {"expr_str": code, "hint": {"as_int": BATCH}}}

    return lambda files: _edit_graph(files, edit)


def guard_code(marker: Path):
    """A shape guard that is Python source: `program.module()` compiles it into the call."""
    code = f"__import__('pathlib').Path('{marker}').touch() is None"
    return lambda files: _edit_graph(files, lambda graph: graph.update(guards_code=[code]))


# ---------------------------------------------------------------- honest programs


def test_an_honest_program_is_scored(ev, tmp_path, val_bytes):
    bpb = score(ev, export(tmp_path / "model.pt2"), val_bytes)
    # An untrained model on printable bytes: close to a uniform guess (8 bits), finite.
    assert 6.0 < bpb < 10.0


def test_the_program_moves_to_the_evaluators_device(ev, tmp_path):
    """The GPU path's move, exercised here with the meta device standing in for CUDA."""
    module, batch, context, n_params = ev.load_program(export(tmp_path / "m.pt2"), torch.device("meta"))
    assert (batch, context) == (BATCH, CONTEXT) and n_params > 0
    assert {t.device.type for t in module.state_dict().values()} == {"meta"}
    arange = [n for n in module.graph.nodes if "arange" in str(n.target)]
    assert arange and all(str(n.kwargs.get("device")) == "meta" for n in arange)


def test_windows_score_every_target_once(ev):
    tokens = torch.arange(ev.EVAL_BYTES + 1)
    for context in (32, 100, 4096):  # divides EVAL_BYTES, does not, the largest allowed
        x, y, mask = ev.windows(tokens, context)
        scored = y[mask]
        assert scored.sort().values.tolist() == list(range(1, ev.EVAL_BYTES + 1))
        assert torch.equal(y, x + 1)  # each target is the byte after its input


# ---------------------------------------------------------------- cheats and defects

CHEATS = {
    "lookahead": "not causal: outputs at positions",
    "loud_lookahead": "not causal: outputs at positions",
    "cross_row": "only the others changed",
    "narrow_vocab": "expected logits of shape (64, 32, 256)",
    "int_logits": "expected a float dtype",
    "noisy": "not deterministic",
    "stateful": "mutates",
}


@pytest.mark.parametrize("variant", sorted(CHEATS))
def test_cheats_and_defects_are_rejected_with_the_reason(ev, tmp_path, val_bytes, variant):
    path = export(tmp_path / "model.pt2", variant)
    with pytest.raises(ev.Rejected, match=CHEATS[variant].replace("(", r"\(").replace(")", r"\)")):
        score(ev, path, val_bytes)


def test_symbolic_shapes_are_refused(ev, tmp_path, val_bytes):
    path = export(tmp_path / "model.pt2", dynamic=True)
    with pytest.raises(ev.Rejected, match="static shapes"):
        score(ev, path, val_bytes)


def test_files_that_are_not_programs_are_rejected(ev, tmp_path, val_bytes):
    garbage = tmp_path / "garbage.pt2"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(ev.Rejected, match="not a torch.export archive"):
        score(ev, garbage, val_bytes)
    checkpoint = tmp_path / "checkpoint.pt2"  # the old format: a state dict
    torch.save(Tiny().state_dict(), checkpoint)
    with pytest.raises(ev.Rejected):
        score(ev, checkpoint, val_bytes)


# ---------------------------------------------------------------- hostile archives


@pytest.mark.parametrize("attack", [pickled_weight, sympy_expression, guard_code])
def test_archives_that_run_code_in_torch_export_are_refused_first(ev, tmp_path, val_bytes, attack):
    honest = export(tmp_path / "honest.pt2")
    marker = tmp_path / "code-ran"
    hostile = rewrite(honest, tmp_path / "hostile.pt2", attack(marker))

    # The threat is real: torch.export.load, or running what it loaded, runs the code...
    with contextlib.suppress(Exception):  # whatever it raises after running the code
        torch.export.load(hostile).module()(torch.zeros(BATCH, CONTEXT, dtype=torch.long))
    assert marker.exists(), "this torch no longer runs code from such an archive: update the test"
    marker.unlink()

    # ...and the evaluator refuses the archive before the loader sees it.
    with pytest.raises(ev.Rejected, match="pickle|symbolic shapes|guard code"):
        score(ev, hostile, val_bytes)
    assert not marker.exists()
