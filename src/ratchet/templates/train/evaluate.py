"""Score model.pt2 on the validation bytes. Protected and trusted: candidates may not change it.

The candidate's train.py may build any architecture; what it hands over is a `torch.export`
program (a graph of aten operations plus its weights). This file never imports or runs
candidate Python. Before `torch.export.load` sees the archive, it refuses everything in it
that the loader would unpickle or evaluate (pickled tensors or objects, symbolic-shape
expressions, guard code, compiled AOTInductor code); after loading, it allows only pure aten operators,
so the graph cannot call a Python function, touch a file or keep state between calls.

Then it scores the program with its own data loading and loss, checks that the output at
position t does not change when only inputs after t (or other sequences of the batch) change,
and reports bits per byte on a fixed stretch of the val split (or the holdout split):

    python -I evaluate.py              # val_bpb: 2.345678 ...
    python -I evaluate.py --holdout    # same metric name, holdout bytes

(`-I` keeps the candidate's directory off `sys.path`; the first lines below do it too.)
Output is `name: value` lines, sent through ratchet's trusted channel when a worker runs it.
A program that cannot be loaded or run, has the wrong input or output shape or dtype, looks
ahead, or scores a non-finite value prints `correct: false` and `reason: ...` (exit 0): the
candidate is rejected. A missing model.pt2 or data file exits 1.
"""

import os
import sys

# Nothing is ever imported from the candidate's directory: a numpy.py or train.py left there
# must not run here. (`python -I` already leaves it out; this covers a plain `python`.)
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import atexit  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import operator  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import zipfile  # noqa: E402
from pathlib import Path  # noqa: E402

# Compile caches the candidates share (the study's) are theirs to write: this process
# compiles nothing, and must not read what they wrote. Private, empty ones instead.
_PRIVATE_CACHE = tempfile.mkdtemp(prefix="evaluate-cache-")
atexit.register(shutil.rmtree, _PRIVATE_CACHE, True)
for _var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
    os.environ[_var] = os.path.join(_PRIVATE_CACHE, _var.lower())

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.export.passes import move_to_device_pass  # noqa: E402 - not loaded by torch.export

try:
    from ratchet.channel import report
except ImportError:  # run by hand without ratchet installed: plain lines

    def report(metrics, *, echo=True):  # noqa: ARG001
        for name, value in metrics.items():
            text = str(value).lower() if isinstance(value, bool) else value
            print(f"{name}: {text}", flush=True)


# The imports are done: what they built (torch's ~165,000 objects) is kept out of the
# garbage collector's sight, so its collections stop walking it again and again (a full
# collection: 80 ms with torch imported). Measured on a 2-second model: 3.8-4.5 CPU-s an
# evaluation before, 3.0-3.1 after.
gc.freeze()

# Score exactly this many bytes, whatever the model's context length: every candidate is
# measured on the same targets. 128 KiB keeps evaluation to seconds on one CPU core.
EVAL_BYTES = 128 * 1024
VOCAB_SIZE = 256
MAX_FILE_BYTES = 2 * 1024**3
MAX_PARAMS = 200_000_000
MAX_CONTEXT = 4096
MAX_BATCH = 256
# Causality checks, each on a randomly chosen scoring batch (positions drawn by the OS).
CHECKS = 4
# Outputs that should not change may differ by float rounding at most: compared as
# log-probabilities (nats), floored, so that no logit's size widens the tolerance.
CHECK_TOLERANCE = 1e-3
LOGP_FLOOR = -30.0


class Rejected(Exception):
    """The program is not one this evaluator can honestly score."""


# ---------------------------------------------------------------- the archive, before loading
FIXED_ENTRIES = {
    "archive_format",
    "archive_version",
    "byteorder",
    ".data/version",
    ".data/serialization_id",
    "models/model.json",
    "data/sample_inputs/model.pt",
    "data/weights/model_weights_config.json",
    "data/constants/model_constants_config.json",
}
PAYLOADS = {  # config file -> (directory, the only payload file names torch reads raw)
    "data/weights/model_weights_config.json": ("data/weights/", re.compile(r"weight_\d+")),
    "data/constants/model_constants_config.json": ("data/constants/", re.compile(r"tensor_\d+")),
}
FQN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


def check_archive(blob: bytes) -> None:
    """Refuse what torch.export.load would unpickle or evaluate (it does both, unasked).

    In this torch, the loader unpickles tensors and constants marked `use_pickle` (with
    weights_only=False), custom and opaque objects, legacy weight files and, if its own
    first try fails, a whole legacy archive; it passes symbolic-shape expressions to
    sympy.sympify (which evaluates them); it loads AOTInductor shared libraries; and
    `program.module()` compiles the archive's `guards_code` strings as Python.
    """
    try:
        reader = torch._C.PyTorchFileReader(io.BytesIO(blob))
        records = set(reader.get_all_records())
        zip_names = zipfile.ZipFile(io.BytesIO(blob)).namelist()
    except Exception as err:  # any unreadable archive is the same failure
        raise Rejected(f"model.pt2 is not a torch.export archive: {type(err).__name__}") from None
    # Both zip readers must see the same entries: the legacy fallback reads with zipfile.
    prefixes = {name.split("/", 1)[0] for name in zip_names}
    seen = {name.split("/", 1)[1] for name in zip_names if "/" in name}
    if len(prefixes) != 1 or seen != records or len(zip_names) != len(records):
        raise Rejected("model.pt2: its zip entries are ambiguous")

    def read(name: str) -> bytes:
        return reader.get_record(name)

    allowed = set(FIXED_ENTRIES)
    for config_name, (folder, payload_name) in PAYLOADS.items():
        if config_name not in records:
            raise Rejected(f"model.pt2 lacks {config_name}")
        try:
            entries = json.loads(read(config_name))["config"]
        except (ValueError, KeyError, TypeError):
            raise Rejected(f"model.pt2: {config_name} is not valid") from None
        if not isinstance(entries, dict):
            raise Rejected(f"model.pt2: {config_name} is not valid")
        for fqn, entry in entries.items():
            if not isinstance(entry, dict):
                raise Rejected(f"model.pt2: {config_name} is not valid")
            path_name = entry.get("path_name")
            if entry.get("use_pickle") is not False:
                raise Rejected(f"model.pt2: {fqn!r} is stored as a pickle (refused: pickles run code)")
            if not isinstance(path_name, str) or not payload_name.fullmatch(path_name):
                raise Rejected(f"model.pt2: {fqn!r} is not a plain tensor ({path_name!r})")
            if not FQN.fullmatch(fqn) or "__" in fqn:
                raise Rejected(f"model.pt2: bad tensor name {fqn!r}")
            allowed.add(folder + path_name)
    extra = [r for r in records if r not in allowed and not r.startswith("extra/")]
    if extra:
        raise Rejected(f"model.pt2 holds entries a plain exported program has not: {sorted(extra)[:3]}")
    try:
        graph = json.loads(read("models/model.json"))
    except (RuntimeError, ValueError):
        raise Rejected("model.pt2 has no readable models/model.json") from None
    if graph.get("range_constraints") or _has_key(graph, {"as_expr", "expr_str"}):
        raise Rejected("the program has symbolic shapes; export it with static shapes")
    if graph.get("guards_code"):  # Python source that running the program would execute
        raise Rejected("the program carries guard code (refused: it would run as Python)")
    try:  # the loader falls back to an unrestricted unpickler when this fails
        torch.load(io.BytesIO(read("data/sample_inputs/model.pt")), weights_only=True)
    except Exception:
        raise Rejected("model.pt2: its sample inputs are not plain tensors") from None


def _has_key(node: object, keys: set[str]) -> bool:
    if isinstance(node, dict):
        return any(k in keys or _has_key(v, keys) for k, v in node.items())
    if isinstance(node, list):
        return any(_has_key(v, keys) for v in node)
    return False


# ---------------------------------------------------------------- the program, after loading
def check_program(program: torch.export.ExportedProgram) -> tuple[int, int]:
    """Only pure aten operators; one (B, T) int64 input; no state. Returns (B, T)."""
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        raise Rejected("the program mutates its buffers or inputs (it must be a pure function)")
    if len(signature.user_inputs) != 1 or len(signature.user_outputs) != 1:
        raise Rejected("the program must take one tensor of byte ids and return one of logits")
    for node in program.graph.nodes:
        if not node.name.isidentifier():
            raise Rejected(f"bad node name {node.name!r}")
        # Keep only the tensor metadata: nothing the candidate wrote reaches generated code.
        node.meta = {k: node.meta[k] for k in ("val", "tensor_meta") if k in node.meta}
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function":
            raise Rejected(f"the program uses {node.op} nodes; only aten operators are allowed")
        if node.target is operator.getitem:
            continue
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
            raise Rejected(f"operator {target!r} is not allowed (only aten operators)")
        schema = target._schema
        if schema.is_mutable or any(a.name == "filename" for a in schema.arguments):
            raise Rejected(f"operator {target} is not allowed (mutates or touches files)")
    n_params = sum(t.numel() for t in (*program.state_dict.values(), *program.constants.values())
                   if isinstance(t, torch.Tensor))
    if n_params > MAX_PARAMS:
        raise Rejected(f"{n_params:,} parameters is over the limit {MAX_PARAMS:,}")
    name = signature.user_inputs[0]
    node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == name)
    val = node.meta.get("val")
    shape = tuple(val.shape) if isinstance(val, torch.Tensor) else ()
    if len(shape) != 2 or not all(type(d) is int for d in shape) or val.dtype != torch.int64:
        raise Rejected(f"the input must be a static (batch, context) int64 tensor, got {val}")
    batch, context = shape
    if not (1 <= batch <= MAX_BATCH and 2 <= context <= MAX_CONTEXT):
        raise Rejected(f"input shape {shape} is out of range (batch <= {MAX_BATCH}, "
                       f"2 <= context <= {MAX_CONTEXT})")
    return batch, context


def load_program(path: Path, device: torch.device):
    blob = path.read_bytes()
    if len(blob) > MAX_FILE_BYTES:
        raise Rejected(f"{path} is {len(blob):,} bytes, over the limit {MAX_FILE_BYTES:,}")
    check_archive(blob)
    try:
        program = torch.export.load(io.BytesIO(blob))
    except Exception as err:
        raise Rejected(f"torch.export.load failed: {type(err).__name__}: {str(err)[:200]}") from None
    batch, context = check_program(program)
    try:
        if device.type != "cpu":
            program = move_to_device_pass(program, device)
        module = program.module()
    except Exception as err:
        raise Rejected(f"the program cannot be prepared: {type(err).__name__}: {str(err)[:200]}") from None
    return module, batch, context, sum(p.numel() for p in program.state_dict.values())


# ---------------------------------------------------------------- scoring
class Scorer:
    """Runs the program on (batch, context) windows and checks each output."""

    def __init__(self, module, batch: int, context: int, device: torch.device):
        self.module, self.batch, self.context, self.device = module, batch, context, device

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        try:
            out = self.module(x.to(self.device))
        except Exception as err:
            raise Rejected(f"the program failed to run: {type(err).__name__}: {str(err)[:200]}") from None
        expected = (self.batch, self.context, VOCAB_SIZE)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise Rejected(f"the program returned {got}, expected logits of shape {expected}")
        if not out.is_floating_point():
            raise Rejected(f"the program returned {out.dtype} logits, expected a float dtype")
        return out.float()


def windows(tokens: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, targets and a mask scoring each of the targets tokens[1 : EVAL_BYTES + 1] once.

    Consecutive windows of the model's context; when that does not divide EVAL_BYTES, one
    more window ends at the last target and scores only the targets not yet scored.
    """
    starts = list(range(0, EVAL_BYTES - context + 1, context))
    mask = torch.ones(len(starts), context, dtype=torch.bool)
    tail = EVAL_BYTES - len(starts) * context
    if tail:
        starts.append(EVAL_BYTES - context)
        last = torch.zeros(1, context, dtype=torch.bool)
        last[0, context - tail :] = True
        mask = torch.cat([mask, last])
    x = torch.stack([tokens[s : s + context] for s in starts])
    y = torch.stack([tokens[s + 1 : s + context + 1] for s in starts])
    return x, y, mask


def differs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two outputs predict differently (NaN anywhere counts as different).

    A tolerance relative to the logits' size would let a model inflate one unused logit
    to widen it; log-probabilities below the floor cost a target 30 nats whenever they
    are used, so a leak hidden there cannot pay.
    """
    diff = (F.log_softmax(a, -1).clamp(min=LOGP_FLOOR)
            - F.log_softmax(b, -1).clamp(min=LOGP_FLOOR)).abs()
    return bool(diff.isnan().any() or diff.max() > CHECK_TOLERANCE)


def check_causal(run: Scorer, x: torch.Tensor, out: torch.Tensor, spare: torch.Tensor,
                 rng: random.Random) -> None:
    """Outputs up to t must not change when later inputs, or the other sequences, change.

    The replacement bytes are real text from the split's unscored part, so a check looks
    like any other batch to the program.
    """
    batch, context = x.shape
    t = rng.randrange(context - 1)
    swapped = x.clone()
    for row in range(batch):
        start = rng.randrange(len(spare) - context)
        swapped[row, t + 1 :] = spare[start : start + context - t - 1]
    if differs(out[:, : t + 1], run(swapped)[:, : t + 1]):
        raise Rejected(f"not causal: outputs at positions <= {t} changed when only later inputs changed")
    if batch > 1:
        row = rng.randrange(batch)
        others = x.clone()
        for r in range(batch):
            if r != row:
                start = rng.randrange(len(spare) - context)
                others[r] = spare[start : start + context]
        if differs(out[row], run(others)[row]):
            raise Rejected("not causal: one sequence's outputs changed when only the others changed")


def bits_per_byte(run: Scorer, data: np.ndarray) -> float:
    """Mean cross-entropy in bits over the targets data[1 : EVAL_BYTES + 1], causality-checked."""
    if len(data) < EVAL_BYTES + 1 + 2 * run.context:
        raise SystemExit(f"evaluate.py: split has {len(data)} bytes, need more than {EVAL_BYTES + 1}")
    tokens = torch.from_numpy(data.astype(np.int64))
    spare = tokens[EVAL_BYTES + 1 :]  # never scored: the source of replacement bytes
    x, y, mask = windows(tokens, run.context)
    n_batches = math.ceil(len(x) / run.batch)
    pad = n_batches * run.batch - len(x)  # the last batch is filled with repeats, unscored
    x = torch.cat([x, x[:pad]])
    y = torch.cat([y, y[:pad]])
    mask = torch.cat([mask, torch.zeros(pad, run.context, dtype=torch.bool)])
    rng = random.SystemRandom()  # the program cannot predict which batches are checked
    checked = set(rng.sample(range(n_batches), min(CHECKS, n_batches)))
    total_nats = 0.0
    for i in range(n_batches):
        rows = slice(i * run.batch, (i + 1) * run.batch)
        logits = run(x[rows])
        if i == 0 and differs(logits, run(x[rows])):
            raise Rejected("the program is not deterministic: the same input gave different outputs")
        if i in checked:
            check_causal(run, x[rows], logits, spare, rng)
        nats = F.cross_entropy(
            logits.reshape(-1, VOCAB_SIZE), y[rows].reshape(-1).to(logits.device), reduction="none"
        )
        total_nats += float(nats[mask[rows].reshape(-1).to(logits.device)].sum())
    return total_nats / EVAL_BYTES / math.log(2)


def reject(reason: str) -> None:
    print(f"evaluate.py: rejected: {reason}", file=sys.stderr)
    report({"correct": False, "reason": reason})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holdout", action="store_true", help="score the holdout split")
    parser.add_argument("--model", default="model.pt2", help="exported program (default model.pt2)")
    args = parser.parse_args()
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    model_path = Path(args.model)
    if not model_path.is_file():
        sys.exit(f"evaluate.py: {model_path} not found (did train.py finish and export it?)")
    split = "holdout" if args.holdout else "val"
    data_path = Path(os.environ.get("RATCHET_DATA") or "data") / f"{split}.bin"
    if not data_path.is_file():
        sys.exit(f"evaluate.py: {data_path} not found; run `python prepare.py` first")
    data = np.fromfile(data_path, dtype=np.uint8)

    t0 = time.perf_counter()
    try:
        module, batch, context, n_params = load_program(model_path, device)
        bpb = bits_per_byte(Scorer(module, batch, context, device), data)
    except Rejected as err:
        reject(str(err))
        return
    if not math.isfinite(bpb):
        reject(f"{split} bits per byte is not finite ({bpb})")
        return
    print("---")
    report({
        "val_bpb": round(bpb, 6),
        "correct": True,
        "num_params": n_params,
        "context": context,
        "eval_seconds": round(time.perf_counter() - t0, 2),
        "eval_bytes": EVAL_BYTES,
    })


if __name__ == "__main__":
    main()
