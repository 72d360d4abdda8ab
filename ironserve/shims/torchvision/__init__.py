"""ironserve SHIM for torchvision -- not the real package.

PyPI's torchvision wheels are CUDA builds (they dlopen libc10_cuda.so) and cannot load next to CPU torch,
but sglang imports torchvision.transforms at module level in multimodal helpers (on the import chain of
sglang.srt.server_args). Neither argument parsing nor serving a text model calls it: every attribute here is
an inert placeholder that raises if it is ever called. Used in exactly two places, never in a product unit:
the CPU parser venvs of ironserve.engine_parser (copied in without dist-info, so transformers reports
torchvision unavailable) and the lab's CPU runtime of SGLang (inside the ironserve-lab-cpu-shims wheel).
"""
__version__ = "0.0.0+ironserve.lab.shim"
IRONSERVE_SHIM = True


class _Inert:
    def __init__(self, name="torchvision"):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Inert(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is an ironserve shim (parser venvs, lab CPU runtime): not callable")

    def __mro_entries__(self, bases):
        return (object,)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Inert(f"torchvision.{name}")
