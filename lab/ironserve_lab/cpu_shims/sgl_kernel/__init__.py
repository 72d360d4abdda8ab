"""ironserve LAB SHIM for sgl_kernel -- not the real package (distribution ironserve-lab-cpu-shims).

SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1) imports names from ``sgl_kernel`` at module level, but the
sgl-kernel / sglang-kernel wheels on PyPI are CUDA builds (they cannot load next to CPU torch), and the
CPU build of sgl-kernel is not on PyPI. On a CPU without Intel AMX -- every lab host -- SGLang never calls
those kernels: each CPU op falls back to its torch-native implementation (``forward_native``), because
``torch.ops.sgl_kernel.convert_weight_packed`` is absent (see sglang.srt.utils.common
``_is_intel_amx_backend_available``; this shim deliberately registers no torch ops).

So every name imported from here is a placeholder that raises if it is ever called, naming itself.
Serving a Llama (sglang 0.5.23, --attention-backend torch_native, --sampling-backend pytorch) calls none:
IMPLEMENTED is empty, and greedy output equals transformers' own generate on the same weights
(benchmarks/tiny_cpu_serving.py). Were a kernel ever needed, it would be written here with plain torch
ops and listed in IMPLEMENTED. Lives only in the ironserve lab's CPU runtime, never in a product unit.
"""

from __future__ import annotations

__version__ = "0.0.0+ironserve.lab.shim"
IRONSERVE_SHIM = True
IMPLEMENTED: tuple[str, ...] = ()


class ShimNotImplemented(NotImplementedError):
    pass


class _Missing:
    """A placeholder for an sgl_kernel function: importable, raises when called."""

    def __init__(self, name: str):
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        raise ShimNotImplemented(
            f"sgl_kernel.{self.__name__} is not implemented by the ironserve lab CPU shim "
            "(ironserve-lab-cpu-shims): the real kernel is a CUDA/AMX build; this path should not be "
            "reached on a CPU without AMX -- report it with the traceback"
        )

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Missing(f"{self.__name__}.{item}")

    def __repr__(self):
        return f"<ironserve shim placeholder sgl_kernel.{self.__name__}>"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(name)
