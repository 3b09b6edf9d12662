"""What ``torch.compile`` does, made visible: Dynamo's graphs, Inductor's kernels, and what fusion buys.

``torch.compile`` (Ansel et al. 2024, "PyTorch 2", ASPLOS, doi:10.1145/3620665.3640366) has two halves:

- **Dynamo** runs the function's Python bytecode symbolically (through CPython's frame-evaluation
  hook, PEP 523), records the tensor operations into an FX graph, and guards the graph with the
  assumptions it made (shapes, dtypes, Python values). Code it cannot trace (a ``.item()``
  whose value steers Python, a print, an unsupported call) ends the graph: a *graph break*.
  :class:`GraphRecorder` is a backend that keeps each graph Dynamo hands it and runs it as captured;
  :func:`explain` counts graphs and breaks (``torch._dynamo.explain``), quietly.
- **Inductor** lowers each graph to loops, fuses element-wise operations and reductions into as
  few kernels as it can, and writes them as C++/OpenMP on a CPU or Triton on a GPU; matmuls and
  convolutions go to the vendor library (``extern_kernels.mm``: MKL or oneDNN, cuBLAS).
  :func:`inductor_code` compiles a function and returns the generated module's source, which
  :class:`GeneratedCode` parses into the kernels it defines, the calls one run makes, and the
  buffers it allocates.

:func:`count_aten_ops` and :func:`eager_traffic_bytes` measure what eager PyTorch dispatches
(a ``TorchDispatchMode`` sees every ATen operation): each operation is at least one kernel
launch on a GPU, and each reads its inputs from and writes its outputs to memory.
:func:`chain_seconds` prices a chain of ``k`` element-wise operations on ``n`` elements on a GPU,
eager or fused, launched one by one or replayed from a CUDA graph, with part 1's overhead model
(:func:`utils.gpu.overhead.launch_bound_step_seconds`); :func:`plot_chain_seconds` draws it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from utils.gpu import hardware
from utils.gpu.overhead import CUDA_GRAPHS_BLOG, launch_bound_step_seconds
from utils.validate import check_positive, check_positive_int

__all__ = ["GeneratedCode", "GraphRecorder", "Explanation", "break_even_calls", "chain_seconds", "count_aten_ops",
           "eager_traffic_bytes", "explain", "inductor_code", "kernel_outline", "plot_chain_seconds", "quiet_dynamo"]


class GraphRecorder:
    """A ``torch.compile`` backend that keeps each FX graph Dynamo captures and runs it unchanged.

    ``torch.compile(fn, backend=recorder)``: every compilation (the first call, and each recompilation
    when a guard fails) appends one ``torch.fx.GraphModule`` to :attr:`graphs`.
    """

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs.append(gm)
        return gm.forward

    def operations(self, index: int = -1) -> list[str]:
        """The operations of graph ``index`` in order: a function's name, or ``.method`` for a tensor method."""
        ops = []
        for node in self.graphs[index].graph.nodes:
            if node.op == "call_function":
                ops.append(getattr(node.target, "__name__", str(node.target)))
            elif node.op == "call_method":
                ops.append(f".{node.target}")
        return ops

    def symbolic_inputs(self, index: int = -1) -> list[str]:
        """The graph's inputs that are sizes, not tensors: what a dynamic-shape graph takes as a number."""
        return [node.name for node in self.graphs[index].graph.nodes
                if node.op == "placeholder" and isinstance(node.meta.get("example_value"), torch.SymInt)]


@contextlib.contextmanager
def quiet_dynamo() -> Iterator[None]:
    """Silence Dynamo's warnings (a graph break is logged at WARNING) while the block runs."""
    logger = logging.getLogger("torch._dynamo")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@dataclass(frozen=True)
class Explanation:
    """What Dynamo made of a function: graphs, breaks, and the first line of each break's reason."""

    graphs: int
    breaks: int
    reasons: tuple[str, ...]


def explain(fn: Callable, *args: object) -> Explanation:
    """``torch._dynamo.explain(fn)(*args)``, quietly, reduced to counts and one line per break."""
    with quiet_dynamo():
        out = torch._dynamo.explain(fn)(*args)
    reasons = tuple(str(b.reason).strip().splitlines()[0] for b in out.break_reasons)
    return Explanation(out.graph_count, out.graph_break_count, reasons)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if not func.is_view and name not in ("detach", "lift_fresh"):
            inputs = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            outputs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
            self.nbytes += sum(t.numel() * t.element_size() for t in inputs + outputs)
        return out


def count_aten_ops(fn: Callable, *args: object) -> Counter[str]:
    """The ATen operations eager PyTorch dispatches for ``fn(*args)``, by name (views included)."""
    with _Recorder() as recorder:
        fn(*args)
    return recorder.ops


def eager_traffic_bytes(fn: Callable, *args: object) -> int:
    """Bytes eager ``fn(*args)`` moves if every non-view ATen operation reads all its tensor inputs from memory
    and writes its outputs back: the traffic a fused kernel saves, since it reads each input and writes each
    output once.
    """
    with _Recorder() as recorder:
        fn(*args)
    return recorder.nbytes


_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.(\w+)\(", re.M)
_BUFFER = re.compile(r"empty_strided_(?:cpu|cuda)\(\(([^)]*)\)")


@dataclass(frozen=True)
class GeneratedCode:
    """The Python module Inductor generated for one graph, and what it is made of.

    ``kernels``: the fused kernels it defines (``cpp_fused_*`` on a CPU, ``triton_*`` on a GPU);
    ``calls``: what one run executes, in order: a kernel's name, ``extern:mm`` for a library call,
    ``aten:<op>`` for an ATen fallback; ``buffers``: the shape of every buffer it allocates.
    """

    source: str

    @property
    def kernels(self) -> list[str]:
        return [name for name, _ in _KERNEL_DEF.findall(self.source)]

    @property
    def calls(self) -> list[str]:
        kernels = set(self.kernels)
        body = self.source[self.source.index("def call("):]
        out = []
        for line in body.splitlines():
            if m := re.match(r"\s*(\w+)(?:\.run)?\(", line):
                if m.group(1) in kernels:
                    out.append(m.group(1))
                    continue
            if m := re.search(r"extern_kernels\.(\w+)\(", line):
                out.append(f"extern:{m.group(1)}")
            elif m := re.search(r"torch\.ops\.aten\.(\w+)\.\w+\(", line):
                out.append(f"aten:{m.group(1)}")
        return out

    @property
    def buffers(self) -> list[tuple[int, ...]]:
        return [tuple(int(d) for d in dims.replace(" ", "").split(",") if d) for dims in _BUFFER.findall(self.source)]

    def kernel(self, *ops: str) -> str:
        """The name of the one kernel whose name holds every op in ``ops`` (Inductor names a kernel
        ``cpp_fused_<the ops it fused>_<n>``); ``ValueError`` if none or several do."""
        found = [k for k in self.kernels if all(op in k for op in ops)]
        if len(found) != 1:
            raise ValueError(f"{len(found)} kernels fuse {ops}; the kernels are {self.kernels}")
        return found[0]

    def kernel_source(self, name: str) -> str:
        """The source of kernel ``name``: C++ on a CPU, Triton on a GPU."""
        m = re.search(rf"^{re.escape(name)} = async_compile\.\w+\(.*?'''(.*?)'''", self.source, re.M | re.S)
        if m is None:
            raise ValueError(f"no kernel named {name!r}; the kernels are {self.kernels}")
        return m.group(1)


def inductor_code(fn: Callable, *args: object) -> tuple[object, GeneratedCode]:
    """Compile ``fn`` with Inductor, run it on ``args``, and return its output and the generated module.

    ``torch._inductor.utils.run_and_get_code`` captures the source as Inductor writes it (with a
    backward, the first module is the forward's).
    """
    from torch._inductor.utils import run_and_get_code

    with quiet_dynamo():
        out, sources = run_and_get_code(torch.compile(fn), *args)
    return out, GeneratedCode(sources[0])


def kernel_outline(source: str) -> list[str]:
    """The loops, loads, reductions and stores of a C++ kernel, with Inductor's casts removed: its shape at a glance."""
    keep = re.compile(r"for\(|loadu|load\(|\.store\(|tmp_acc\w* = |out_ptr\d+\[")
    lines = []
    for line in source.splitlines():
        if keep.search(line) and "Vectorized<float>(0)" not in line:
            line = re.sub(r"static_cast<int64_t>\(([^()]*)\)", r"\1", line)
            line = re.sub(r"static_cast<float>\(([^()]*)\)", r"\1", line)
            line = re.sub(r"at::vec::vec_reduce_all<float, 1>\(.*?, (\w+)\)", r"sum_lanes(\1)", line)
            line = line.replace("at::vec::Vectorized<float>::loadu(", "load(")
            lines.append(re.sub(r"(\d+)L\b", r"\1", line.rstrip()))
    indent = min(len(line) - len(line.lstrip()) for line in lines) if lines else 0
    return [line[indent:] for line in lines]


def break_even_calls(compile_seconds: float, eager_seconds: float, compiled_seconds: float) -> float:
    """Calls after which compiling paid for itself: ``compile / (eager - compiled)``; ``inf`` if it never does."""
    check_positive("compile_seconds", compile_seconds)
    check_positive("eager_seconds", eager_seconds)
    check_positive("compiled_seconds", compiled_seconds)
    saved = eager_seconds - compiled_seconds
    return compile_seconds / saved if saved > 0 else float("inf")


MODES = ("eager", "fused", "eager + CUDA graph", "fused + CUDA graph")
"""The four ways :func:`chain_seconds` runs a chain: one kernel per op or one for all, launched or replayed."""


def chain_seconds(n_elements: float, n_ops: int, mode: str, gpu: str = "H100-SXM", bytes_per_element: int = 2,
                  host_seconds: float = 5e-6,
                  min_kernel_seconds: float = CUDA_GRAPHS_BLOG["kernel_seconds"].value) -> float:
    """Seconds for a chain of ``n_ops`` element-wise operations on ``n_elements``-long tensors on ``gpu``.

    Each kernel takes ``max(its bytes / B, min_kernel_seconds)`` on the GPU (``B`` the HBM bandwidth;
    a short kernel's floor, 2.9 us in NVIDIA's CUDA Graphs post). Eager, every op is a kernel that reads
    one tensor and writes one (``2 n b`` bytes); fused, one kernel reads the input once and writes the
    result once, however long the chain. Launched one by one, the CPU spends ``host_seconds`` per kernel
    (framework dispatch and the launch: microseconds) and the chain takes
    :func:`~utils.gpu.overhead.launch_bound_step_seconds` ``(kernels, host_seconds, gpu_seconds)``; replayed
    from a CUDA graph, the CPU makes one launch for all of them, ``(1, host_seconds, gpu_seconds)``.
    Intermediates are assumed to miss the cache (tensors larger than L2), and each op to be one kernel.
    """
    check_positive("n_elements", n_elements)
    check_positive_int("n_ops", n_ops)
    check_positive("host_seconds", host_seconds)
    check_positive("min_kernel_seconds", min_kernel_seconds)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    bandwidth = hardware.spec(gpu).hbm_bandwidth
    kernel = max(2 * n_elements * bytes_per_element / bandwidth, min_kernel_seconds)
    kernels = 1 if mode.startswith("fused") else n_ops
    gpu_seconds = kernels * kernel
    launches = 1 if mode.endswith("CUDA graph") else kernels
    return launch_bound_step_seconds(launches, host_seconds, gpu_seconds)


def plot_chain_seconds(n_ops: int = 8, host_us: float = 5.0, gpu: str = "H100-SXM",
                       bytes_per_element: int = 2) -> plt.Figure:
    """Time per element of a chain of ``n_ops`` element-wise ops against tensor size, in :data:`MODES`."""
    check_positive_int("n_ops", n_ops)
    check_positive("host_us", host_us)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=90)
    sizes = np.logspace(3, 9, 61)
    styles = {"eager": ("tab:red", "-"), "fused": ("tab:blue", "-"), "eager + CUDA graph": ("tab:red", "--"),
              "fused + CUDA graph": ("tab:blue", "--")}
    for mode, (color, line) in styles.items():
        t = [chain_seconds(n, n_ops, mode, gpu, bytes_per_element, host_us * 1e-6) for n in sizes]
        ax.loglog(sizes, np.array(t) / sizes * 1e12, line, color=color, label=mode)
    bandwidth = hardware.spec(gpu).hbm_bandwidth
    ax.axhline(2 * bytes_per_element / bandwidth * 1e12, color="0.5", lw=0.8, ls=":")
    ax.text(sizes[0], 2 * bytes_per_element / bandwidth * 1e12 * 0.6, "one fused pass at full bandwidth",
            fontsize=8, color="0.35")
    ax.set_xlabel("elements per tensor")
    ax.set_ylabel("time per element (ps)")
    ax.set_title(f"A chain of {n_ops} element-wise ops on {gpu}, {host_us:g} us of host time per launch",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig
