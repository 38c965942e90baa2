"""A package's names that load their module on first use, so that `charlm --help` and Tab completion
never import torch."""

import importlib


def lazy_attribute(package: str, exports: dict[str, str], name: str):
    """The attribute ``name`` of ``package``, imported from the module ``exports`` names for it. The
    table is in the package's own code: nothing read from a file chooses the module."""
    if name not in exports:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(exports[name]), name)
