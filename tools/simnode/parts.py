"""Where a new part of a simulated node plugs in: its ``build()`` options, its check, its writer, its CLI options.

A part is a module (in this package, or beside it in tools/ while a branch keeps it apart) that defines
``PART = Part(...)``. Its one hook line is its module name in ``PART_MODULES`` below; ``node.build`` and
``cli.main`` then take it in:

- ``options``: the keyword arguments of ``build()`` that the part adds, with their defaults (the defaults
  must build the node as it was without the part);
- ``check(preset, funcs, opts)``: before the first write of the node; a ValueError there writes nothing
  (the CLI prints it as ``simnode: ...`` and exits 2);
- ``write(tree, preset, funcs, opts)``: after the built-in parts, on the written node;
- ``add_arguments(parser)``: options of ``simnode build``; ``from_args(args)`` turns the parsed options into
  the part's ``build()`` keyword arguments.

``opts`` is the part's own ``{option: value}``; ``preset`` the ``machine.Preset`` after ``--cpus``/``--gpus``,
``funcs`` the node's ``machine.PciFunction`` list, ``tree`` a ``tree.Tree`` on the root.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

# The modules of the plugged parts, in build order (e.g. "simnode.aspm"): the one place a new part is named.
PART_MODULES: tuple = ("simnode.nccl", "simnode.aspm")


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    options: dict = dataclasses.field(default_factory=dict)
    check: Callable | None = None
    write: Callable | None = None
    add_arguments: Callable | None = None
    from_args: Callable | None = None


# Parts registered at run time (tests): after those of PART_MODULES.
REGISTERED: list = []


def plugged() -> list:
    """Every plugged part, in build order."""
    return [importlib.import_module(name).PART for name in PART_MODULES] + list(REGISTERED)


def split_options(options: dict) -> list:
    """``build()``'s extra keyword arguments -> ``[(part, its opts)]``; a keyword no part takes is a TypeError."""
    left = dict(options)
    out = [(part, {key: left.pop(key, default) for key, default in part.options.items()}) for part in plugged()]
    if left:
        raise TypeError(f"build() got an unexpected keyword argument {sorted(left)[0]!r}")
    return out


def checked(options: dict, preset, funcs: list) -> list:
    """``split_options``, each part's ``check`` run on its options (before the first write of the node)."""
    out = split_options(options)
    for part, opts in out:
        if part.check is not None:
            part.check(preset, funcs, opts)
    return out


def write(plugged: list, tree, preset, funcs: list) -> None:
    """Each plugged part's ``write`` (``plugged`` from ``checked``), after the built-in parts."""
    for part, opts in plugged:
        if part.write is not None:
            part.write(tree, preset, funcs, opts)


def add_arguments(parser) -> None:
    """The plugged parts' options of ``simnode build``."""
    for part in plugged():
        if part.add_arguments is not None:
            part.add_arguments(parser)


def from_args(args) -> dict:
    """The plugged parts' ``build()`` keyword arguments from the parsed ``simnode build`` options."""
    out: dict = {}
    for part in plugged():
        if part.from_args is not None:
            out.update(part.from_args(args))
    return out
