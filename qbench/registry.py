"""Name-keyed registries: the extension points (precisions, calibrators, backends, metrics).

A registry entry is either an object or a lazy ``"module:attr"`` target, so
registering a backend never imports its SDK; the import happens on first `get`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from qbench.errors import QbenchError, expected_one_of

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from names to implementations of one kind of thing."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, target: T | str | None = None) -> Callable[[T], T] | None:
        """Register `target` under `name`, or return a decorator that does.

        `target` may be a ``"module:attr"`` string, resolved on first use.
        Registering a different target under a taken name is an error.
        """
        if target is None:

            def decorator(obj: T) -> T:
                self._add(name, obj)
                return obj

            return decorator
        self._add(name, target)
        return None

    def _add(self, name: str, target: T | str) -> None:
        existing = self._entries.get(name)
        if existing is not None and existing is not target and existing != target:
            raise ValueError(f"{self.kind} {name!r} is already registered to {existing!r}")
        self._entries[name] = target

    def get(self, name: str) -> T:
        """The implementation registered as `name`; unknown names get a 'did you mean' error."""
        if name not in self._entries:
            raise QbenchError(f"unknown {self.kind}: {expected_one_of(name, self._entries)}")
        entry = self._entries[name] = self.resolve(self._entries[name])
        return entry

    def resolve(self, target: T | str) -> T:
        """`target` itself, or the object a ``"module:attr"`` target names (its module imported)."""
        if not isinstance(target, str):
            return target
        module_name, _, attr = target.partition(":")
        resolved: T = getattr(importlib.import_module(module_name), attr)
        return resolved

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
