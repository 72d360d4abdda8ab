"""ironserve shim: see torchvision/__init__.py."""
from torchvision import _Inert


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Inert(f"torchvision.transforms.v2.functional.{name}")
