"""typer's help renderer without the two rich renderers `lstar` never uses.

`typer.rich_utils`, which prints every `--help` and usage error, imports rich's Markdown (for
the "markdown" markup mode) and Traceback (for pretty exceptions) when it is first imported.
`lstar` uses rich markup and turns pretty exceptions off, yet the two bring markdown_it,
mdurl, pygments and attrs: about 95 of the 330 modules `lstar --help` would load.
`import_help_renderer` imports `typer.rich_utils` with those two names bound to stand-ins
that import the real class when first called or read, so output is unchanged and a program
that does use them still gets them. If typer's module does not import as expected (a later
typer), it is imported the ordinary way.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

# (module, name) that typer.rich_utils imports at module level and lstar does not use.
DEFERRED = (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback"))


class Deferred(type):
    """The type of a stand-in class for `module.name`: calling it, or reading an attribute it
    lacks, imports the module and answers with the real class. A class, not an object, since
    typer's annotations (`Markdown | Text`) are evaluated when its module is imported."""

    _module: str
    _name: str

    def real(cls) -> Any:
        return getattr(importlib.import_module(cls._module), cls._name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)

    def __getattr__(cls, attr: str) -> Any:   # Traceback.from_exception and the like
        return getattr(cls.real(), attr)


def stand_in_class(module: str, name: str) -> type:
    return Deferred(name, (), {"_module": module, "_name": name, "__module__": module})


def import_help_renderer() -> None:
    """Import `typer.rich_utils` with the DEFERRED names as stand-ins (once per process)."""
    if "typer.rich_utils" in sys.modules:
        return
    stand_ins = {}
    for module, name in DEFERRED:
        if module not in sys.modules:
            stand_in = types.ModuleType(module, f"stand-in for {module} while typer.rich_utils is imported")
            setattr(stand_in, name, stand_in_class(module, name))
            stand_ins[module] = stand_in
    sys.modules.update(stand_ins)
    try:
        importlib.import_module("typer.rich_utils")
    except ImportError:   # typer imports something else from them now: the ordinary import below
        sys.modules.pop("typer.rich_utils", None)
    finally:
        for module, stand_in in stand_ins.items():
            if sys.modules.get(module) is stand_in:
                del sys.modules[module]
    importlib.import_module("typer.rich_utils")
