"""The host scripts of files/bin loaded as modules, for tests that call their functions in-process."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

FILES_BIN = Path(__file__).resolve().parents[1] / "files" / "bin"


def load_script(name: str) -> ModuleType:
    """files/bin/NAME as a module named as its path (``files.bin.ironserve_rank_guard``): the name mutation
    testing keys its mutants by. Scripts without a .py suffix (ironserve-exec) load alike."""
    module_name = "files.bin." + name.removesuffix(".py").replace("-", "_")
    loader = importlib.machinery.SourceFileLoader(module_name, str(FILES_BIN / name))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(module_name, loader))
    loader.exec_module(module)
    return module
