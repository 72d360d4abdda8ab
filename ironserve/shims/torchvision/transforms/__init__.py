"""ironserve shim: see torchvision/__init__.py."""
from torchvision import _Inert
from torchvision.transforms.functional import InterpolationMode  # noqa: F401


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Inert(f"torchvision.transforms.{name}")
