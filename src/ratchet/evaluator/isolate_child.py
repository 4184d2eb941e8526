"""The untrusted side of `ratchet.evaluator.isolate`: a fresh interpreter that holds the candidate module.

Started by `ratchet.evaluator.isolate.CandidateProcess` as ``python -I <this file> FD MODULE
PARENT now|hold PRELOAD``. The trusted parent imports only `fix_malloc` from it (the
allocator settings both processes share) and runs none of the rest. It imports the PRELOAD
modules (comma-separated) first; held (`hold`), it then waits for a `load` request before
it imports MODULE. It is deliberately self-contained (stdlib, plus numpy and
torch only when a request carries arrays of theirs): nothing here decides a verdict, so
the candidate may patch all of it and only hurt itself. What the parent trusts is what it
measures itself: its own clock around each request, and the contents of the buffers it
owns, read after the reply.

Wire format, both ways: 4-byte big-endian length, then one UTF-8 JSON object. Arrays never
travel in messages: the parent registers buffers it owns (POSIX shared memory for numpy
arrays and torch CPU tensors, CUDA IPC handles for CUDA tensors) and names them by id.
"""

from __future__ import annotations

import base64
import gc
import importlib
import importlib.util
import json
import mmap
import os
import socket
import struct
import sys
import traceback
from typing import Any

_HEADER = struct.Struct(">I")
MAX_MESSAGE = 64 << 20  # the parent's requests; replies are small


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes")
    return json.loads(_recv_exact(sock, size))


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message, allow_nan=True).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _short(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[: limit // 2] + "\n...\n" + text[-limit // 2 :]


class CallError(Exception):
    """The candidate failed a call; the message goes back to the parent."""


class Child:
    def __init__(self, module_path: str) -> None:
        self.module_path = module_path
        self.module: Any = None
        self.buffers: dict[int, Any] = {}
        self.maps: dict[str, mmap.mmap] = {}
        self.objects: dict[int, Any] = {}
        self.graphs: dict[int, Any] = {}
        self.uses_cuda = False
        self._sync: Any = None

    # -- start-up -------------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        path = os.path.abspath(self.module_path)
        sys.path.insert(0, os.path.dirname(path))
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        self.module = module
        return {"ok": True, "pid": os.getpid(), "module": name}

    # -- buffers --------------------------------------------------------------------------

    def _map(self, name: str) -> mmap.mmap:
        # Opened directly rather than through multiprocessing.shared_memory: that class
        # would register the segment with a resource tracker here, which would unlink it
        # (and warn) when this process exits. The parent owns and unlinks its segments.
        if name not in self.maps:
            import _posixshmem  # noqa: PLC0415 - CPython's POSIX shm module, Linux/macOS

            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
            try:
                self.maps[name] = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        return self.maps[name]

    def attach(self, desc: dict[str, Any]) -> Any:
        kind = desc["kind"]
        shape = tuple(desc["shape"])
        if kind == "numpy":
            import numpy as np  # noqa: PLC0415

            return np.ndarray(shape, dtype=np.dtype(desc["dtype"]), buffer=self._map(desc["shm"]), offset=desc.get("offset", 0))
        import torch  # noqa: PLC0415

        dtype = getattr(torch, desc["dtype"])
        if kind == "torch":
            count = 1
            for d in shape:
                count *= d
            if count == 0:
                return torch.empty(shape, dtype=dtype)
            flat = torch.frombuffer(self._map(desc["shm"]), dtype=dtype, count=count, offset=desc.get("offset", 0))
            return flat.view(shape)
        if kind == "cuda":
            return self._attach_cuda(torch, desc, dtype, shape)
        raise ValueError(f"unknown buffer kind {kind!r}")

    def _attach_cuda(self, torch: Any, desc: dict[str, Any], dtype: Any, shape: tuple[int, ...]) -> Any:
        """Rebuild a CUDA tensor from the parent's IPC handle, as torch.multiprocessing does."""
        ipc = desc["ipc"]

        def raw(key: str) -> Any:
            value = ipc[key]
            return base64.b64decode(value) if isinstance(value, str) else value

        torch.cuda._lazy_init()
        storage = torch.UntypedStorage._new_shared_cuda(
            ipc["device"],
            raw("handle"),
            ipc["storage_size_bytes"],
            ipc["storage_offset_bytes"],
            raw("ref_counter_handle"),
            ipc["ref_counter_offset"],
            raw("event_handle"),
            ipc["event_sync_required"],
        )
        tensor = torch.empty((0,), dtype=dtype, device=f"cuda:{ipc['device']}")
        tensor.set_(storage, desc.get("storage_offset", 0), shape, tuple(desc["stride"]))
        if not self.uses_cuda:
            self.uses_cuda = True
            self._sync = torch.cuda.synchronize
        return tensor

    def register(self, msg: dict[str, Any]) -> dict[str, Any]:
        for key, desc in msg["buffers"].items():
            self.buffers[int(key)] = self.attach(desc)
        return {"ok": True}

    def release(self, msg: dict[str, Any]) -> dict[str, Any]:
        for key in msg["ids"]:
            self.buffers.pop(int(key), None)
        return {"ok": True}

    # -- calls ----------------------------------------------------------------------------

    def target(self, name: str) -> Any:
        if name.startswith("obj:"):
            ident, _, method = name[4:].partition(".")
            held = self.objects[int(ident)]
            return getattr(held, method) if method else held
        obj: Any = self.module
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    def value(self, item: Any) -> Any:
        if isinstance(item, dict) and "buf" in item:
            return self.buffers[int(item["buf"])]
        if isinstance(item, dict) and "value" in item:
            return item["value"]
        raise ValueError(f"bad argument {item!r}")

    def one_call(self, fn: Any, call: dict[str, Any], index: int) -> Any:
        args = [self.value(a) for a in call.get("args", [])]
        kwargs = {k: self.value(v) for k, v in call.get("kwargs", {}).items()}
        outs = [self.buffers[int(i)] for i in call.get("out", [])]
        mode = call.get("mode", "return")
        try:
            if mode == "out":
                result = fn(*args, out=outs[0] if len(outs) == 1 else tuple(outs), **kwargs)
                if result is not None and not any(result is o for o in outs) and not isinstance(result, tuple | list):
                    raise CallError(f"call {index}: returned a new array instead of filling the out= buffer it was given")
                return None
            result = fn(*args, **kwargs)
        except CallError:
            raise
        except Exception as exc:  # the candidate's failure is a finding: report it
            raise CallError(f"call {index}: raised {type(exc).__name__}: {exc}\n{_short(traceback.format_exc(), 1500)}") from exc
        if mode == "value":
            return result
        results = tuple(result) if isinstance(result, tuple | list) else (result,)
        if len(results) != len(outs):
            raise CallError(f"call {index}: returned {len(results)} output(s), expected {len(outs)}")
        for k, (res, out) in enumerate(zip(results, outs, strict=True)):
            self.copy_out(res, out, index, k)
        return None

    def copy_out(self, res: Any, out: Any, index: int, k: int) -> None:
        """Copy a returned array into the parent's output buffer (the parent checks the values)."""
        where = f"call {index} output {k}"
        out_mod = type(out).__module__.split(".")[0]
        res_mod = type(res).__module__.split(".")[0]
        if out_mod == "numpy":
            import numpy as np  # noqa: PLC0415

            if type(res) is not np.ndarray:
                raise CallError(f"{where}: returned a {type(res).__module__}.{type(res).__name__}, not a plain numpy array")
            if res.shape != out.shape or res.dtype != out.dtype:
                raise CallError(f"{where}: returned shape {res.shape} {res.dtype}, expected {out.shape} {out.dtype}")
            np.copyto(out, res, casting="no")
            return
        import torch  # noqa: PLC0415

        if type(res) is not torch.Tensor or res_mod != "torch":
            raise CallError(f"{where}: returned a {type(res).__module__}.{type(res).__name__}, not a plain torch.Tensor")
        if res.layout != torch.strided or res.device.type == "meta":
            raise CallError(f"{where}: returned a {res.layout} tensor on {res.device}, not a dense tensor with data")
        if tuple(res.shape) != tuple(out.shape) or res.dtype != out.dtype or res.device != out.device:
            raise CallError(
                f"{where}: returned shape {tuple(res.shape)} {res.dtype} on {res.device}, "
                f"expected {tuple(out.shape)} {out.dtype} on {out.device}"
            )
        out.copy_(res)

    def sync(self) -> None:
        if self.uses_cuda:
            self._sync()

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        fn = self.target(msg["fn"])
        values = []
        for index, call in enumerate(msg["calls"]):
            values.append(self.one_call(fn, call, index))
        self.sync()
        reply: dict[str, Any] = {"ok": True}
        if any(call.get("mode") == "value" for call in msg["calls"]):
            reply["values"] = [self.encode(v) for v in values]
        return reply

    def encode(self, value: Any) -> Any:
        """A returned value for a plain `call`: JSON, or a numpy array in a fresh shm segment."""
        mod = type(value).__module__.split(".")[0]
        if mod == "torch":
            value = value.detach().cpu().numpy()
            mod = "numpy"
        if mod == "numpy" and hasattr(value, "shape"):
            import _posixshmem  # noqa: PLC0415

            import numpy as np  # noqa: PLC0415

            value = np.ascontiguousarray(value)
            name = "rkout_" + os.urandom(8).hex()
            fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
            try:
                os.ftruncate(fd, max(1, value.nbytes))
                with mmap.mmap(fd, max(1, value.nbytes)) as mm:
                    view = np.ndarray(value.shape, value.dtype, buffer=mm)
                    view[...] = value
                    del view  # an exported buffer would keep the map from closing
            finally:
                os.close(fd)
            return {"array": {"shm": name, "shape": list(value.shape), "dtype": value.dtype.name}}
        if mod == "numpy":  # a numpy scalar
            value = value.item()
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise CallError(f"returned a {type(value).__name__}, which is neither an array nor a JSON value") from exc
        return {"value": value}

    def construct(self, msg: dict[str, Any]) -> dict[str, Any]:
        factory = self.target(msg["factory"])
        try:
            obj = factory(*[self.value(a) for a in msg.get("args", [])], **{k: self.value(v) for k, v in msg.get("kwargs", {}).items()})
        except Exception as exc:
            raise CallError(f"constructing {msg['factory']} raised {type(exc).__name__}: {exc}") from exc
        ident = len(self.objects) + 1
        self.objects[ident] = obj
        return {"ok": True, "object": ident}

    def graph(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Capture every call of the request in one CUDA graph (after a side-stream warm-up)."""
        import torch  # noqa: PLC0415

        fn = self.target(msg["fn"])
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(int(msg.get("warmup", 2))):
                for index, call in enumerate(msg["calls"]):
                    self.one_call(fn, call, index)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for index, call in enumerate(msg["calls"]):
                self.one_call(fn, call, index)
        self.sync()
        ident = len(self.graphs) + 1
        self.graphs[ident] = graph
        return {"ok": True, "graph": ident}

    def replay(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.graphs[int(msg["graph"])].replay()
        self.sync()
        return {"ok": True}

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        handlers = {
            "call": self.call,
            "register": self.register,
            "release": self.release,
            "construct": self.construct,
            "graph": self.graph,
            "replay": self.replay,
        }
        if op not in handlers:
            return {"ok": False, "error": f"unknown op {op!r}"}
        try:
            return handlers[op](msg)
        except CallError as exc:
            return {"ok": False, "error": _short(str(exc))}
        except Exception as exc:
            return {"ok": False, "error": _short(f"{op} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")}


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL when the evaluator dies, so a killed evaluator leaves no child behind.

    A convenience for runs by hand (the candidate could undo it): under ratchet's worker,
    a subreaper kills every descendant of the evaluation anyway.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes  # noqa: PLC0415
        import signal  # noqa: PLC0415

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the evaluator died before the prctl took effect
        os._exit(1)


# seccomp (Linux): the audit architecture and sched_setaffinity's number per machine
_AFFINITY_SYSCALL = {"x86_64": (0xC000003E, 203), "aarch64": (0xC00000B7, 122)}
_X32_BIT = 0x40000000  # x86_64's x32 ABI numbers its calls from here


def _forbid_widening() -> bool:
    """Keep this process, its threads and everything it starts on the CPUs it was given:
    a seccomp filter answers sched_setaffinity with EPERM. Installed before any other code
    runs here (the preload, the candidate) and irrevocable after, so nothing the candidate
    does can lift it. Why: a child that widened its affinity runs its timed calls on
    whichever core is idle, the other slots' included, while the baseline it is compared
    with was timed on the evaluator's own, busy, core; its CPU time stays within one
    core's, so the parent's CPU check cannot see it. False where Linux or the machine
    gives no such filter (the parent's CPU check still stands)."""
    import platform  # noqa: PLC0415

    arch = _AFFINITY_SYSCALL.get(platform.machine())
    if not sys.platform.startswith("linux") or arch is None:
        return False
    import ctypes  # noqa: PLC0415

    audit_arch, setaffinity = arch
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    program = [  # struct seccomp_data: nr at offset 0, arch at 4
        (ld_abs, 0, 0, 4),
        (jeq, 1, 0, audit_arch),  # another ABI (i386 on x86_64): deny its calls outright
        (ret, 0, 0, deny),
        (ld_abs, 0, 0, 0),
        (jge, 2, 0, _X32_BIT),  # an x32 call: its own numbering, denied
        (jeq, 1, 0, setaffinity),
        (ret, 0, 0, allow),
        (ret, 0, 0, deny),
    ]

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(program))(*(SockFilter(*op) for op in program))
    fprog = SockFprog(len(program), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) == 0


# glibc malloc's thresholds, fixed in this child and in the evaluator that starts it
MALLOC_SETTINGS = ((-1, 128 << 20), (-3, 32 << 20))  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD


def fix_malloc() -> None:
    """Left alone, glibc adapts its malloc thresholds to what a process has freed so far, so
    the same kernel's few-MB temporaries page-fault afresh on every call in a young child
    and not in an evaluator that once freed a larger array: an honest numpy softmax read 4x
    slower here than as the baseline. Both processes fix them at the same values instead:
    this function, run here and imported by the parent (`CandidateProcess`)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes  # noqa: PLC0415

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl): its allocator has no such state
        return
    for option, value in MALLOC_SETTINGS:
        mallopt(option, value)


def _preload(names: str) -> None:
    """Import the modules the evaluator named (numpy, say) before any candidate code runs:
    their import overlaps the evaluator's own start-up. Only from the interpreter's own path
    (`-I`: neither the candidate's directory nor the working directory is on it yet)."""
    for name in filter(None, names.split(",")):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - the candidate's own import reports what is missing
            continue


def main(argv: list[str]) -> int:
    _forbid_widening()  # first: before any thread (a preloaded library's pool) exists
    fix_malloc()
    if len(argv) > 3 and int(argv[3]):  # 0: under a sandbox's warden, which ends us with the evaluator
        _die_with_parent(int(argv[3]))
    sock = socket.socket(fileno=int(argv[1]))
    child = Child(argv[2])
    _preload(argv[5] if len(argv) > 5 else "")
    if len(argv) > 4 and argv[4] == "hold":
        # Started early (held): no candidate code runs until the evaluator says `load`,
        # which it does at its first request, after its own imports.
        try:
            msg = recv(sock)
        except (EOFError, ValueError):
            return 0
        if msg.get("op") != "load":
            return 0
    try:
        hello = child.load()
    except BaseException as exc:  # noqa: BLE001 - report any import failure, SystemExit included
        send(sock, {"ok": False, "error": _short(f"importing {argv[2]} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")})
        return 1
    # The child's imports (its preloads and the candidate's module) are done: out of the
    # collector's sight from now on, so a collection during a timed call walks only what
    # was built since, not torch's modules (a pause of tens of milliseconds otherwise).
    gc.freeze()
    send(sock, hello)
    while True:
        try:
            msg = recv(sock)
        except EOFError:
            return 0
        if msg.get("op") == "exit":
            return 0
        send(sock, child.handle(msg))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
