"""A package's public names loaded on first use (PEP 562's module `__getattr__`), so importing
the package stays light: a helper process that needs one module of it does not pay for the
rest (torch, the engine). A leaf."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The package's `__getattr__`: `exports` maps each name to the submodule defining it; the
    first read imports that submodule and keeps the value in the package."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
