"""One discovery rule for every plug-in kind: a registry filled by explicit registration calls, and a folder scan.

Each kind of plug-in (tasks, advantage estimators and policy losses, training engines, samplers, metric tables) keeps
a :class:`Registry`. A plug-in registers itself with one call in its own module (``TASKS.register(name, obj)`` or a
decorator built on it). The built-in plug-ins of a package are found by :func:`discover`, which imports every module
of the package's folder: a module that registers nothing (a helper) is simply imported, so there is no deny-list and
no hand-kept import list. Plug-ins outside the repository are modules named in the ``plugins`` config key
(:func:`load_plugins`): importing them runs their registration calls.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Named plug-ins of one kind (``kind`` names it in errors: ``"task"``, ``"engine"``, ...).

    ``packages``: the packages :func:`discover` scans (their built-in plug-ins) the first time a name is looked up,
    so importing the registry alone stays cheap; ``subpackages``: the scan imports their sub-packages too (a plug-in
    that is a package of modules, such as a training engine).
    """

    def __init__(self, kind: str, packages: tuple[str, ...] = (), subpackages: bool = False):
        self.kind = kind
        self.packages = packages
        self.subpackages = subpackages
        self._items: dict[str, T] = {}
        self._discovered = not packages

    def register(self, name: str, item: T, replace: bool = False) -> T:
        """Register ``item`` as ``name`` and return it.

        Raises:
            ValueError: ``name`` is empty, or already registered to another item (unless ``replace``).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: a plug-in needs a non-empty name, got {name!r}")
        old = self._items.get(name)
        if old is not None and old is not item and not replace and _origin(old) != _origin(item):
            raise ValueError(f"{self.kind} {name!r} is registered twice ({_origin(old)} and {_origin(item)})")
        self._items[name] = item
        return item

    def _ensure(self) -> None:
        if not self._discovered:
            self._discovered = True
            for p in self.packages:
                discover(p, self.subpackages)

    def get(self, name: str) -> T:
        """The plug-in registered as ``name``.

        Raises:
            KeyError: naming the unknown ``name`` and listing the registered ones.
        """
        self._ensure()
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {self.names()}") from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self._ensure()
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """(name, plug-in) pairs in registration order."""
        self._ensure()
        return list(self._items.items())

    def __contains__(self, name) -> bool:
        self._ensure()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        self._ensure()
        return iter(list(self._items))

    def __len__(self) -> int:
        self._ensure()
        return len(self._items)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def values(self) -> list[T]:
        """The registered plug-ins in registration order."""
        self._ensure()
        return list(self._items.values())

    def keys(self) -> list[str]:
        """Registered names in registration order."""
        self._ensure()
        return list(self._items)


def _origin(item) -> str:
    mod = getattr(item, "__module__", None) or type(item).__module__
    return f"{mod}.{getattr(item, '__qualname__', type(item).__qualname__)}"


def discover(package: str, subpackages: bool = False) -> list[str]:
    """Import every module in the folder of ``package`` (and with ``subpackages`` every sub-package; never names
    starting with ``_``), so that their registration calls run. Returns the imported module names.

    Raises:
        ImportError: a module of the package fails to import (a broken built-in is an error, not a silent gap).
    """
    pkg = importlib.import_module(package)
    out = []
    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name.startswith("_") or (m.ispkg and not subpackages):
            continue
        importlib.import_module(f"{package}.{m.name}")
        out.append(f"{package}.{m.name}")
    return out


def load_plugins(modules) -> None:
    """Import the modules named in the ``plugins`` config key (their registration calls run on import).

    Raises:
        ImportError: naming the module that failed to import.
    """
    for m in modules or []:
        try:
            importlib.import_module(str(m))
        except Exception as e:
            raise ImportError(f"plugins: cannot import {m!r}: {type(e).__name__}: {e}") from None
