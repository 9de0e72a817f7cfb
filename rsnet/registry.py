"""One registry per concept: a class registers itself once, under the name its config uses (``model.arch``,
``trainer.name``), and every reader — the config checks, the CLI, the benchmarks, the tests — asks the registry."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T", bound=type)


class Registry(dict, Generic[T]):
    """``name -> class`` for one concept; ``@registry.register`` files a class under its ``key`` attribute."""

    def __init__(self, setting: str, key: str) -> None:
        super().__init__()
        self.setting = setting  # the config key that names an entry, for messages
        self.key = key  # the class attribute that holds the entry's name

    def register(self, cls: T) -> T:
        """Class decorator: file ``cls`` under ``getattr(cls, key)``; a name taken by another class is refused."""
        name = getattr(cls, self.key)
        taken = self.get(name)
        if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"{self.setting}={name!r} is registered twice: {self[name].__qualname__} and "
                             f"{cls.__qualname__}")
        self[name] = cls
        return cls

    def check(self, name: object, setting: str | None = None) -> str:
        """``name`` if it is registered; else ValueError naming ``setting`` and the registered names."""
        if name not in self:
            raise ValueError(f"{setting or self.setting}={name!r} is not known; valid: {', '.join(sorted(self))}")
        return str(name)
