"""The child side of the end-to-end check: the model, with a kernel swapped in per shape.

Loaded by `ratchet.evaluator.isolate.CandidateProcess` in a sandboxed child (never imported by the
trusted evaluator; it lives in a directory of its own because the child puts this file's
directory first on its sys.path). Self-contained on purpose (stdlib, numpy, torch): the
candidate's kernel module runs in this process and may patch anything here, which can
only hurt itself. What the verdict rests on stays in the parent: its clock around each
request, the logits it reads back from its own buffers, and the float64 reference model.

`Model(spec)`: spec is JSON, {"tree", "model", "dtype", "device", "mode",
"compile_backend", "swap": {op: {"module", "function", "table"}}}. Each swapped op of the model's `OPS` becomes a
per-shape switch: the dispatch table's bucket for the call's shape names the kernel
(a hit) or the library op (a fallback), with the bucket rule of
ratchet.evaluator.kernels.dispatch.bucket_of (kept in step by a test).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from typing import Any


def _load(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def next_pow2(n: int) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def bucket_of(shape: dict[str, Any], dims: list[str] | None = None) -> str:
    chosen = set(shape) if dims is None else set(dims)
    parts = []
    for name in sorted(shape):
        value = shape[name]
        if name in chosen and isinstance(value, int) and not isinstance(value, bool):
            value = next_pow2(value)
        parts.append(f"{name}={value}")
    return ",".join(parts)


def row_shape(dims: list[int]) -> dict[str, int]:
    if not dims:
        return {}
    return {"rows": math.prod(dims[:-1]) if len(dims) > 1 else 1, "cols": dims[-1]}


class Switch:
    """One swapped operator: the kernel where the table says so, else the library op."""

    def __init__(self, library: Any, kernel: Any, table: dict[str, Any] | None, shape_of: Any, kernel_name: str,
                 compiling: Any) -> None:
        self.library = library
        self.compiling = compiling  # torch.compiler.is_compiling: dynamo knows it, True while it traces
        self.kernel = kernel
        self.table = table
        self.shape_of = shape_of
        self.kernel_name = kernel_name
        self.hits = 0
        self.fallbacks = 0

    def choose(self, x: Any) -> bool:
        if self.table is None:  # no table: the kernel everywhere
            return True
        shape = self.shape_of(list(x.shape))
        dtype = str(x.dtype).removeprefix("torch.")
        key = bucket_of(shape, self.table.get("dims"))
        buckets = self.table.get("buckets", {})
        entry = buckets.get(f"{key} {dtype}") or buckets.get(key)
        return bool(entry) and entry.get("impl") == self.kernel_name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # counted in eager forwards only (the census): under torch.compile a counter that
        # changes is a guard that fails on every call, so the model would recompile each
        # forward until dynamo's recompile limit, then run eager, unlike the baseline
        counting = not self.compiling()
        if self.choose(args[0]):
            if counting:
                self.hits += 1
            return self.kernel(*args, **kwargs)
        if counting:
            self.fallbacks += 1
        return self.library(*args, **kwargs)



class Model:
    """The model as the workload runs it (dtype, device, eager or torch.compile)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import torch  # noqa: PLC0415 - the child imports torch only when it builds a model

        self.torch = torch
        if spec.get("threads"):
            torch.set_num_threads(int(spec["threads"]))
        tree = spec["tree"]
        sys.path.insert(0, tree)
        module = _load(os.path.join(tree, spec["model"]), "ratchet_e2e_model")
        self.module = module
        self.switches: dict[str, Switch] = {}
        for op, how in (spec.get("swap") or {}).items():
            kernel_module = _load(os.path.join(tree, how["module"]), f"ratchet_e2e_kernel_{op}")
            kernel = getattr(kernel_module, how["function"])
            shape_of = getattr(module, "SHAPE_OF", {}).get(op) or row_shape
            self.switches[op] = Switch(module.OPS[op], kernel, how.get("table"), shape_of, how.get("impl", "kernel"),
                                       torch.compiler.is_compiling)
            module.OPS[op] = self.switches[op]
        self.dtype, self.device = spec["dtype"], spec["device"]
        self.eager = module.build_model(self.dtype, self.device)
        compiled = spec.get("mode") == "compile"
        self.model = torch.compile(self.eager, backend=spec.get("compile_backend") or "inductor") if compiled else self.eager

    def __call__(self, *inputs: Any) -> Any:
        with self.torch.no_grad():
            return self.model(*inputs)

    def graphs(self) -> int:
        """How many graphs torch.compile has compiled in this process (0 when eager):
        one per shape the model ran at, when nothing makes it recompile."""
        from torch._dynamo.utils import counters  # noqa: PLC0415 - only asked under mode = "compile"

        return int(counters["stats"]["unique_graphs"])

    def census(self, point: dict[str, Any]) -> dict[str, dict[str, int]]:
        """Hits and fallbacks of one eager forward at `point` (graphs and compile hide calls)."""
        import numpy as np  # noqa: PLC0415

        for s in self.switches.values():
            s.hits = s.fallbacks = 0
        inputs = self.module.make_inputs(dict(point), self.dtype, np.random.default_rng(0))
        inputs = tuple(v.to(self.device) for v in (inputs if isinstance(inputs, tuple | list) else (inputs,)))
        with self.torch.no_grad():
            self.eager(*inputs)
        return {op: {"hits": s.hits, "fallbacks": s.fallbacks} for op, s in self.switches.items()}
