"""Dataclass configs as command-line flags: one ``--flag`` per field, its help text the field's docstring (used by
``python -m baselines.meta.train`` and ``python -m baselines.llm.train_llm``)."""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
import types
import typing
from collections.abc import Collection
from dataclasses import MISSING, fields
from typing import Any, cast


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (attribute docstrings), for cls and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not hasattr(klass, "__dataclass_fields__"):
            continue
        source = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        body = cast(ast.ClassDef, source).body  # the source of a class is one class statement
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(scalar type, optional?) of a field annotation such as ``int``, ``str | None``."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"typing": typing, "Any": Any})  # annotations are postponed strings here
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kinds = [a for a in args if a is not type(None)]
        return kinds[0], True
    return annotation, False


def _optional(kind: type):
    def parse(text: str):
        return None if text.lower() in ("none", "") else kind(text)

    parse.__name__ = kind.__name__
    return parse


def add_config_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                         skip: Collection[str] = ()) -> None:
    """One --flag per field of dataclass cls (except ``skip``), help text from its docstring, default shown."""
    docs = field_docs(cls)
    for f in fields(cls):
        if f.name in skip:
            continue
        kind, optional = _base_type(f.type)
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        text = f"{docs.get(f.name, '')} (default: {default})"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=text)
        else:
            parser.add_argument(flag, dest=f.name, type=_optional(kind) if optional else kind, default=default,
                                metavar=kind.__name__.upper(), help=text)


def config_from_args(cls: type, args: argparse.Namespace):
    """An instance of dataclass cls from the parsed flags of its fields."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})
