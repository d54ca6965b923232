"""Constructor settings as one dataclass. A class whose constructor takes many settings (the OpenAI-compatible and the
transformers backends, the text env) declares them once, as a dataclass whose fields carry their defaults, docstrings
and checks, and keeps them as ``self.settings``; its constructor takes ``settings=`` or the fields as keywords, so
that the keywords users pass keep working (``settings_from``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

Settings = TypeVar("Settings")
Owner = TypeVar("Owner")


def settings_from(cls: type[Settings], settings: Settings | None, keywords: Mapping[str, Any], owner: str) -> Settings:
    """``settings`` (an instance of dataclass ``cls``), or one made from ``keywords`` (its fields, given to ``owner``'s
    constructor as keywords); TypeError naming the fields for a keyword that is none of them, or when both are given."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    if settings is not None:
        if not isinstance(settings, cls):
            raise TypeError(f"{owner}: settings must be a {cls.__name__}, got {type(settings).__name__} (the settings "
                            f"are keywords: {', '.join(names)})")
        if keywords:
            raise TypeError(f"{owner}: pass settings= or the keywords {sorted(keywords)}, not both")
        return settings
    unknown = sorted(set(keywords) - set(names))
    if unknown:
        raise TypeError(f"{owner} got unknown keyword(s) {unknown}; its settings ({cls.__name__}): {', '.join(names)}")
    return cls(**keywords)


def settings_attributes(settings_class: type) -> Callable[[type[Owner]], type[Owner]]:
    """Class decorator for a class that keeps its settings as ``self.settings``: ``obj.NAME`` reads and writes
    ``obj.settings.NAME`` for each field of ``settings_class`` (the attributes such objects had before their settings
    were one dataclass)."""

    def decorate(cls: type[Owner]) -> type[Owner]:
        for declared in fields(settings_class):
            if declared.name not in cls.__dict__:
                setattr(cls, declared.name, _Setting(declared.name))
        return cls

    return decorate


class _Setting:
    """A data descriptor: the owner's settings' field of the same name."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, owner: Any, kind: type | None = None) -> Any:
        return self if owner is None else getattr(owner.settings, self.name)

    def __set__(self, owner: Any, value: Any) -> None:
        setattr(owner.settings, self.name, value)
