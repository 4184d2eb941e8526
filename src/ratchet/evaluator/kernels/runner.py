"""How the harness calls one implementation: in a candidate process, or here (trusted code).

Everything the harness checks and times goes through *slots*: one set of input buffers
and output buffers the harness owns. The harness writes fresh inputs into a slot,
poisons its outputs, asks the runner to run a batch of calls (one per slot), and reads
the outputs back itself. The runner never says whether a batch is a check, a warm-up or
a timed batch: the requests look the same.

- `RemoteRunner` (the candidate): the slots are shared buffers of a
  `ratchet.evaluator.isolate.CandidateProcess`; a batch is one request, timed on this process's
  clock. The candidate module is never imported here.
- `LocalRunner` (the baseline, the reference, tests): a plain callable run in this
  process, timed the same way. Only for trusted code: an imported candidate could patch
  anything here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import isolate
from . import arrays, guard

MODES = ("return", "out", "plain")


class CallFailed(Exception):
    """The implementation failed a call (raised, crashed, timed out, wrong output type)."""


@dataclass
class Slot:
    """One call's buffers. `inputs` holds arrays (or plain values); `outputs` arrays."""

    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]

    def input_views(self) -> tuple[Any, ...]:
        return tuple(view(x) for x in self.inputs)

    def output_views(self) -> tuple[Any, ...]:
        return tuple(view(x) for x in self.outputs)


def view(x: Any) -> Any:
    """The harness's own view of a buffer (a SharedArray's array, or the array itself)."""
    return x.array if isinstance(x, isolate.SharedArray) else x


def _kind(x: Any) -> tuple[str, Any]:
    if arrays.is_torch(x):
        return ("cuda", x.device) if x.is_cuda else ("torch", None)
    return "numpy", None


class Runner:
    """One implementation the harness can check and time. Subclasses override the hooks."""

    label = "fn"
    remote = False

    def empty(self, shape: Sequence[int], dtype: str, like: Any) -> Any:
        """A buffer of `shape`/`dtype` on the same kind of memory as the array `like`."""
        raise NotImplementedError

    def buffer_like(self, x: Any) -> Any:
        return self.empty(tuple(x.shape), arrays.dtype_name(x), x)

    def run(self, slots: Sequence[Slot], mode: str) -> float:
        """Run one call per slot, back to back; seconds on the harness's clock."""
        raise NotImplementedError

    def empty_request(self) -> float:
        """The fixed cost of a request that runs no call (subtracted from batch times)."""
        return 0.0

    def warm(self, slot: Slot, mode: str) -> None:
        """One untimed call on `slot` right before a timed batch, its outputs poisoned again
        (default: nothing; the harness warms only trusted code it does not check)."""

    def capture(self, slots: Sequence[Slot], mode: str) -> Any:
        """CUDA graph of one call per slot (CUDA only)."""
        raise NotImplementedError

    def replay(self, graph: Any) -> float:
        raise NotImplementedError

    def release(self, slots: Sequence[Slot]) -> None:
        """Free the slots' buffers (default: nothing to free)."""

    def flush(self) -> None:
        """Make new buffers known to the implementation before they are filled (default: nothing)."""

    def settle(self) -> None:
        """Wait until nothing of the implementation's is still under way (default: nothing)."""

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """While the harness reads outputs back: nothing of the implementation may run."""
        yield

    def close(self) -> None:
        """Release what the runner owns (default: nothing)."""


class LocalRunner(Runner):
    """A trusted callable, run in this process."""

    def __init__(self, fn: Callable[..., Any], label: str | None = None) -> None:
        self.fn = fn
        self.label: str = label or str(getattr(fn, "__name__", "fn"))
        self._cuda = False

    def empty(self, shape: Sequence[int], dtype: str, like: Any) -> Any:
        kind, device = _kind(like)
        if kind == "numpy":
            return np.empty(tuple(shape), dtype=np.dtype(dtype))
        torch = arrays.loaded_torch()
        self._cuda = self._cuda or kind == "cuda"
        return torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=device or "cpu")

    def _sync(self) -> None:
        if self._cuda:
            arrays.loaded_torch().cuda.synchronize()  # device-wide: other streams included

    def _one(self, slot: Slot, mode: str) -> None:
        inputs = slot.input_views()
        outs = slot.output_views()
        if mode == "out":
            result = self.fn(*inputs, out=outs[0] if len(outs) == 1 else outs)
            if result is not None and not any(result is o for o in outs) and not isinstance(result, tuple | list):
                raise CallFailed(f"{self.label} returned a new array instead of filling the out= buffer it was given")
            return
        result = self.fn(*inputs)
        if mode == "plain":
            return
        results = arrays.as_tuple(result)
        if len(results) != len(outs):
            raise CallFailed(f"{self.label} returned {len(results)} output(s), expected {len(outs)}")
        for k, (res, buf) in enumerate(zip(results, outs, strict=True)):
            problem = arrays.materialisation_problem(res)
            if problem:
                raise CallFailed(f"{self.label} output {k}: {problem}")
            if tuple(res.shape) != tuple(buf.shape) or arrays.dtype_name(res) != arrays.dtype_name(buf):
                raise CallFailed(
                    f"{self.label} output {k}: returned shape {tuple(res.shape)} {arrays.dtype_name(res)}, "
                    f"expected {tuple(buf.shape)} {arrays.dtype_name(buf)}"
                )
            arrays.copy_into(buf, res)

    def run(self, slots: Sequence[Slot], mode: str) -> float:
        perf = guard._CLOCK
        self._sync()
        t0 = perf()
        try:
            for slot in slots:
                self._one(slot, mode)
            self._sync()
        except CallFailed:
            raise
        except Exception as exc:  # a failing implementation is a finding, not a harness crash
            raise CallFailed(f"{self.label} raised {type(exc).__name__}: {exc}") from exc
        return perf() - t0

    def empty_request(self) -> float:
        perf = guard._CLOCK
        t0 = perf()
        self._sync()
        return perf() - t0

    def warm(self, slot: Slot, mode: str) -> None:
        try:
            self._one(slot, mode)
        except CallFailed:
            raise
        except Exception as exc:
            raise CallFailed(f"{self.label} raised {type(exc).__name__}: {exc}") from exc
        for out in slot.output_views():
            arrays.poison_(out)

    def capture(self, slots: Sequence[Slot], mode: str) -> Any:
        torch = arrays.loaded_torch()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                for slot in slots:
                    self._one(slot, mode)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for slot in slots:
                self._one(slot, mode)
        torch.cuda.synchronize()
        return graph

    def replay(self, graph: Any) -> float:
        perf = guard._CLOCK
        self._sync()
        t0 = perf()
        graph.replay()
        arrays.loaded_torch().cuda.synchronize()
        return perf() - t0


class RemoteRunner(Runner):
    """A function in a candidate process (`CandidateProcess.function(...)`)."""

    remote = True

    def __init__(self, fn: isolate.RemoteFunction, label: str | None = None) -> None:
        self.fn = fn
        self.process = fn.process
        self.label = label or fn.name or fn.target
        self._cuda = False
        self.process.twin()  # the clean child that calibrates round trips starts now, in the background

    def empty(self, shape: Sequence[int], dtype: str, like: Any) -> Any:
        kind, device = _kind(like)
        self._cuda = self._cuda or kind == "cuda"
        return self.process.empty(shape, dtype, like=kind, device=device)

    @staticmethod
    def _calls(slots: Sequence[Slot], mode: str) -> list[isolate.Call]:
        return [isolate.Call(args=slot.inputs, out=slot.outputs, mode="return" if mode == "plain" else mode) for slot in slots]

    def run(self, slots: Sequence[Slot], mode: str) -> float:
        try:
            return self.fn.run(self._calls(slots, mode))
        except isolate.CandidateError as exc:
            raise CallFailed(f"{self.label}: {exc}") from exc

    def empty_request(self) -> float:
        """An empty request's round trip, on a clean child: never one the candidate answers."""
        try:
            return self.process.empty_request_s(cuda=self._cuda)
        except isolate.CandidateError as exc:
            raise CallFailed(f"{self.label}: the clean child that calibrates round trips failed: {exc}") from exc

    def capture(self, slots: Sequence[Slot], mode: str) -> Any:
        try:
            return self.process.capture_graph(self.fn.target, self._calls(slots, mode))
        except isolate.CandidateError as exc:
            raise CallFailed(f"{self.label}: CUDA graph capture failed: {exc}") from exc

    def replay(self, graph: Any) -> float:
        try:
            return self.process.replay(graph)
        except isolate.CandidateError as exc:
            raise CallFailed(f"{self.label}: {exc}") from exc

    def settle(self) -> None:
        self.process.settle()  # its clean twin's last stop, asked without waiting

    def flush(self) -> None:
        try:
            self.process.flush()
        except isolate.CandidateError as exc:
            raise CallFailed(f"{self.label}: {exc}") from exc

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        self.process.freeze()
        try:
            yield
        finally:
            self.process.thaw()

    def release(self, slots: Sequence[Slot]) -> None:
        buffers = [b for slot in slots for b in (*slot.inputs, *slot.outputs) if isinstance(b, isolate.SharedArray)]
        if buffers and self.process.proc.poll() is None:
            with contextlib.suppress(isolate.CandidateError):  # the process is gone, its buffers too
                self.process.release(buffers)


def as_runner(impl: Any, label: str | None = None) -> Runner:
    """A Runner for a RemoteFunction (candidate process), a Runner, or a trusted callable."""
    if isinstance(impl, Runner):
        return impl
    if isinstance(impl, isolate.RemoteFunction):
        return RemoteRunner(impl, label)
    if callable(impl):
        return LocalRunner(impl, label)
    raise TypeError(f"expected a RemoteFunction, a Runner or a callable, got {type(impl).__name__}")


def new_slot(runner: Runner, inputs: tuple[Any, ...], out_specs: Sequence[tuple[tuple[int, ...], str]]) -> Slot:
    """Buffers like `inputs` (non-arrays pass as values) and outputs per (shape, dtype)."""
    like = next((x for x in inputs if arrays.is_array(x)), np.empty(0))
    ins = tuple(runner.buffer_like(x) if arrays.is_array(x) else x for x in inputs)
    outs = tuple(runner.empty(shape, dtype, like) for shape, dtype in out_specs)
    return Slot(ins, outs)


def fill(slot: Slot, values: tuple[Any, ...]) -> None:
    """Write fresh input values into the slot (same buffers, new data) and poison its outputs."""
    for buf, value in zip(slot.inputs, values, strict=True):
        if arrays.is_array(value):
            arrays.copy_into(view(buf), value)
    for out in slot.output_views():
        arrays.poison_(out)


def sync_all(slots: Sequence[Slot]) -> None:
    """Wait for this process's device work on the slots (fills and poisons)."""
    for slot in slots[:1]:
        arrays.synchronize(slot.input_views() + slot.output_views())
