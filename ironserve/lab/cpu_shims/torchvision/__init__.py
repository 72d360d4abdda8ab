"""ironserve LAB SHIM for torchvision -- not the real package (distribution ironserve-lab-cpu-shims).

PyPI's torchvision wheels are CUDA builds (they dlopen libc10_cuda.so) and cannot load next to the CPU
torch of the lab's SGLang runtime, but sglang imports torchvision.transforms at module level in
multimodal helpers (sglang.srt.multimodal.internvl_utils, on the import chain of server_args). Serving a
text model never calls torchvision; every attribute here is an inert placeholder that raises if it is
ever called. (transformers 5.x finds the module and reports torchvision available; only image/video
processors would use it, and they fail loudly here.) Same shim as the parser venvs of
ironserve.engine_parser. Lives only in the ironserve lab's CPU runtime, never in a product unit.
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
        raise RuntimeError(f"{self._name}: torchvision is a shim in the ironserve lab CPU runtime (ironserve-lab-cpu-shims)")

    def __mro_entries__(self, bases):
        return (object,)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Inert(f"torchvision.{name}")
