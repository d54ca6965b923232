"""A replay set's card (``card.json``), where a set is found, and its identity (the set digest).

``card.json`` lists every data file of a set with its sha256 and record count, and loading checks the files against
it (``format.verify``), so a digest of the card is a digest of the whole set: ``set_digest``. The shipped sets'
digests are pinned here (``PINNED``): a set that carries a shipped set's name but not its digest (an altered,
resealed or foreign copy) is refused when it is loaded, naming both digests. Any set can be pinned by the one who
cites it: ``ReplaySet("hf://owner/name@revision", digest="...")``, or ``"<set>#<digest>"`` wherever a set is named.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from deliberation_env.core.deliberation import DeliberationConfig
from deliberation_env.core.roles import roles_setting
from deliberation_env.core.seeds import REQUEST_FORMAT, REQUEST_FORMATS
from deliberation_env.replay.format import DAMAGE_FIX, MIGRATE_COMMAND, read_chunk

FORMAT = "deliberation-replay/2"
"""Parquet chunks and problem tables, checksummed in the card (``replay.format``)."""
OLD_FORMATS = ("deliberation-replay/1",)
"""Formats ``replay.migrate`` converts (JSON-lines chunks, no checksums, no problem table)."""
SETS_DIR = Path(__file__).resolve().parent / "sets"
"""Where the replay sets shipped with the package live (one folder each)."""
HUB_PREFIX = "hf://"
PIN_MARK = "#"
"""``<set>#<digest>``: a set named with the digest it must have."""
DIGEST_CHARS = 16
"""Hex characters of a set digest (64 bits of sha256: a forged set of the same digest is out of reach)."""
PINNED: dict[str, str] = {
    "qwen05-arith": "94707a73bacf9fe8",
    "qwen05-arith-v2": "89b24af15d44ca1e",
    "qwen05-team-arith": "17841882296d6727",
}
"""The digest of each set shipped with this version of the package (``set_digest``), by the card's name."""
KEY_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""The canonical JSON that request keys, fingerprints and digests hash."""


class ReplayError(ValueError):
    """A replay set that cannot serve the env asked of it (names the set, the difference and the fix)."""


def _sha256(value: Any) -> str:
    return hashlib.sha256(KEY_JSON.encode(value).encode("utf-8", "surrogatepass")).hexdigest()


def card_digest(text: str) -> str:
    """The set digest of a ``card.json`` text: sha256 of its canonical JSON (key order and spacing do not count),
    ``DIGEST_CHARS`` hex characters."""
    return _sha256(json.loads(text))[:DIGEST_CHARS]


def problem_digests(records: Iterable[Mapping[str, Any]], problems: Iterable[str] | None = None) -> dict[str, str]:
    """Each problem's digest of its records (every field, in key order): what ``card.contents`` holds. ``problems``:
    only these (default: every problem of the records)."""
    wanted = None if problems is None else set(problems)
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        if wanted is None or record["problem"] in wanted:
            grouped.setdefault(record["problem"], []).append(record)
    return {problem: _sha256(sorted(rows, key=lambda r: r["key"]))[:DIGEST_CHARS] for problem, rows in grouped.items()}


EMPTY_DIGEST = _sha256([])[:DIGEST_CHARS]
"""The contents digest of a problem with no records of its own (its requests are all another problem's)."""


@dataclass
class ReplayCard:
    """``card.json``: everything that determines a replay set's requests, and what it holds."""

    name: str
    model: str
    """The recording backend's ``identity()``."""
    backend: str
    """How the model was run (backend class and options, quantisation)."""
    task: str
    task_kwargs: dict[str, Any]
    settings: dict[str, Any]
    """``SETTING_FIELDS`` of the recording env."""
    rounds: int
    confidence: str
    """The confidence source ``replay_env`` uses by default."""
    confidence_sources: list[str]
    """Every source whose tree is recorded (each episode's requests under it are all in the set)."""
    streams: int
    prompt_fingerprint: str
    splits: dict[str, list[str]] = field(default_factory=dict)
    """Recorded problem ids per split, in recording order."""
    concede_targets: str = "rule"
    """``rule``: CONCEDE recorded to the target of ``settings["concede_target"]`` only; ``all``: to every peer that
    holds another answer, so the set serves every concede-target rule (and chosen targets)."""
    notes: list[str] = field(default_factory=list)
    """Known limits of the recording, shown in its README."""
    partial: bool = False
    """True when rounds past the first were recorded on sampled branches only (``branch_limit``)."""
    branch_limit: int | None = None
    format: str = FORMAT
    request_format: int = REQUEST_FORMAT
    sampling: dict[str, Any] = field(default_factory=dict)
    """Every sampling parameter of the requests (temperatures, top_p, token limits, how seeds are derived)."""
    weights: dict[str, Any] = field(default_factory=dict)
    """The model file's ``sha256``, ``bytes``, ``file``, ``source`` and ``license``; or ``sha256`` None and why."""
    versions: dict[str, str] = field(default_factory=dict)
    """Library versions of the recording (Python, deliberation_env, torch, transformers, llama_cpp, ...)."""
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every data file (``chunks/...``, ``problems/...``) with its ``sha256``, ``records`` and ``bytes``:
    loading checks them."""
    commands: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    """Coverage, tree sizes, accuracy per level and size (written by the recorder)."""
    reproducibility: dict[str, Any] = field(default_factory=dict)
    """Whether the recording engine gives a request's completion again, measured
    (``bench/studies/recording_determinism.py``): ``reproduces`` (True, False, or None when not measured), ``summary``
    (what was measured, in words), ``measured`` (when and with what command). Empty in sets recorded before it was
    stated."""
    index: dict[str, dict[str, int]] = field(default_factory=dict)
    """Each recorded chunk's problems and how many records of each it holds (``records_per_problem``): the whole
    tree the recorder walked. Binding checks the records against it; empty in sets recorded before it."""
    contents: dict[str, str] = field(default_factory=dict)
    """Each indexed problem's digest of its records as recorded (``problem_digests``; written with the card when its
    chunk is indexed): binding compares the records' content, not only their count. Empty in sets recorded before
    it (the shipped ones, which ``PINNED`` covers whole)."""

    folder: Path | None = field(default=None, compare=False, repr=False, metadata={"stored": False})
    """The set's folder, where the card was read from (not stored in ``card.json``)."""

    def to_json(self) -> str:
        stored = {name: value for name, value in asdict(self).items() if name != "folder"}
        return json.dumps(stored, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str, formats: tuple[str, ...] = (FORMAT,)) -> ReplayCard:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ReplayError(f"{where} is not valid JSON ({error}); {DAMAGE_FIX}") from error
        known = {f.name for f in fields(cls)}
        found = data.get("format") if isinstance(data, dict) else None
        if found in OLD_FORMATS and found not in formats:
            raise ReplayError(f"{where} has the old format {found!r} (JSON-lines chunks without checksums); this "
                              f"package reads {FORMAT!r}: convert the set once with `{MIGRATE_COMMAND} "
                              f"{Path(where).parent}`")
        if found not in formats:
            raise ReplayError(f"{where} has format {found!r}, this package reads {FORMAT!r}")
        missing = [name for name in ("name", "model", "task", "settings", "rounds", "streams") if name not in data]
        if missing:
            raise ReplayError(f"{where} lacks {missing}; {DAMAGE_FIX}")
        card = cls(**{key: value for key, value in data.items() if key in known - {"folder"}},
                   folder=Path(where).parent)
        if card.request_format not in REQUEST_FORMATS:
            raise ReplayError(f"{where} was recorded with request format {card.request_format!r}; this version of "
                              f"deliberation_env reads formats {REQUEST_FORMATS}: record the set again")
        return card

    def config(self, **overrides: Any) -> DeliberationConfig:
        """The recording's ``DeliberationConfig`` (its settings, rounds, default confidence and streams)."""
        values: dict[str, Any] = {**self.settings, "max_rounds": self.rounds, "confidence": self.confidence,
                                  "streams": self.streams, "request_format": self.request_format}
        values.update(overrides)
        return DeliberationConfig(**values)


def split_pin(name_or_path: str | os.PathLike[str], digest: str | None = None) -> tuple[str, str | None]:
    """``"<set>#<digest>"`` -> (``"<set>"``, digest), else (the name, ``digest``); a ``digest`` given beside a pin
    must be the same one."""
    text = os.fspath(name_or_path)
    spec, _, pinned = text.rpartition(PIN_MARK)
    if not spec or not re.fullmatch(rf"[0-9a-f]{{{DIGEST_CHARS}}}", pinned):
        return text, digest
    if digest is not None and digest != pinned:
        raise ReplayError(f"{text!r} pins digest {pinned}, digest= pins {digest}: give one")
    return spec, pinned


def resolve(name_or_path: str | os.PathLike[str]) -> Path:
    """The folder of a replay set: a path, a set shipped in the package, or ``hf://owner/name[@revision]`` on the
    hub (a revision, a branch, tag or commit, pins what is loaded; ``#<digest>`` pins its content)."""
    text = split_pin(name_or_path)[0]
    if text.startswith(HUB_PREFIX):
        return _from_hub(text[len(HUB_PREFIX):])
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if re.fullmatch(r"[A-Za-z0-9_.-]+", text) and (SETS_DIR / text).is_dir():
        return SETS_DIR / text
    raise ReplayError(f"no replay set {text!r}: not a folder, not one of the shipped sets ({', '.join(shipped())}), "
                      f"and not a hub id (write {HUB_PREFIX}owner/name or {HUB_PREFIX}owner/name@revision)")


def read_card(name_or_path: str | os.PathLike[str], digest: str | None = None,
              not_a_set: str = "not a replay set") -> tuple[Path, ReplayCard, str]:
    """(folder, card, set digest) of a set, after checking the digest against ``digest`` (or a ``#<digest>`` pin)
    and, for a set named like a shipped one, against ``PINNED``: ReplayError naming both digests if not."""
    spec, digest = split_pin(name_or_path, digest)
    folder = resolve(spec)
    path = folder / "card.json"
    if not path.is_file():
        raise ReplayError(f"{folder} has no card.json: {not_a_set}")
    text = path.read_text(encoding="utf-8")
    card = ReplayCard.from_json(text, str(path))
    found = card_digest(text)
    if digest is not None and found != digest:
        raise ReplayError(f"replay set {card.name!r} ({folder}) has digest {found}, not the pinned {digest}: it is "
                          "another set than the one pinned (another revision, or altered); load the pinned one")
    shipped_digest = PINNED.get(card.name)
    if shipped_digest is not None and found != shipped_digest:
        raise ReplayError(f"replay set {card.name!r} ({folder}) has digest {found}, but the set of that name shipped "
                          f"with this package has digest {shipped_digest}: its card or what it lists was changed (a "
                          "forged, resealed or damaged copy, or a set written into); restore the shipped set "
                          "(reinstall the package or check it out again from git), or give a set of your own "
                          "another name")
    return folder, card, found


def load_card(name_or_path: str | os.PathLike[str]) -> ReplayCard:
    """A replay set's card alone (without reading its completions), checked against its pins (``read_card``)."""
    return read_card(name_or_path)[1]


def set_digest(name_or_path: str | os.PathLike[str]) -> str:
    """The digest that names a set in results (``card_digest`` of its card.json)."""
    return read_card(name_or_path)[2]


def env_settings(card: ReplayCard) -> dict[str, Any]:
    """The ``parallel_env`` keywords that reproduce a set's recording (task, prompts, agents, rounds, sampling)."""
    settings = dict(card.settings)
    return {"task": card.task, "task_kwargs": dict(card.task_kwargs), "num_agents": settings.pop("num_agents"),
            "max_rounds": card.rounds, "confidence": card.confidence, "request_format": card.request_format, **settings}


def departures(card: ReplayCard, config: DeliberationConfig, *, extensions: bool = True) -> list[str]:
    """Where ``config`` plays another game than the set's recording (settings a set can serve differently: fewer
    rounds, another recorded confidence source), e.g. ``["confidence='critic' (recorded 'critic_text')"]``.
    ``extensions=False`` leaves out rounds past the recording played with REFINE masked (``refine_rounds`` up to the
    recorded rounds): a game the set serves exactly, as the benchmark's sequential cells play it."""
    recorded = env_settings(card)
    played = {name: roles_setting(config.roles) if name == "roles" else getattr(config, name)
              for name in recorded if hasattr(config, name)}
    refine = getattr(config, "refine_rounds", None)
    extended = refine is not None and refine <= card.rounds < config.max_rounds
    return [f"{name}={value!r} (recorded {recorded[name]!r})" for name, value in played.items()
            if value != recorded[name] and (extensions or not (extended and name == "max_rounds"))]


def shipped() -> list[str]:
    """The names of the replay sets shipped in the package."""
    return sorted(p.name for p in SETS_DIR.iterdir() if (p / "card.json").is_file()) if SETS_DIR.is_dir() else []


def write_card(path: Path, card: ReplayCard) -> None:
    """Write ``card.json`` atomically; first, each indexed problem without a ``contents`` digest gets one from its
    chunk as written (an existing digest is kept: a chunk rewritten later must match it)."""
    for name, counts in card.index.items():
        if any(problem not in card.contents for problem in counts) and (path / name).is_file():
            found = problem_digests(read_chunk(path / name), counts)
            card.contents.update({p: found.get(p, EMPTY_DIGEST) for p in counts if p not in card.contents})
    partial = path / "card.json.tmp"
    partial.write_text(card.to_json(), encoding="utf-8")
    os.replace(partial, path / "card.json")


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]*")


def _from_hub(spec: str) -> Path:
    """``owner/name[@revision]`` downloaded (or found in the local hub cache) by ``snapshot_download``."""
    repo_id, _, revision = spec.partition("@")
    form = f"write {HUB_PREFIX}owner/name, or {HUB_PREFIX}owner/name@revision to pin a branch, tag or commit"
    if (not _HUB_ID.fullmatch(repo_id) or ".." in repo_id or repo_id.endswith(".")
            or (revision and (not _REVISION.fullmatch(revision) or ".." in revision)) or spec.endswith("@")):
        raise ReplayError(f"{HUB_PREFIX}{spec} is not a hub dataset id: {form}")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RevisionNotFoundError
    except ImportError as error:  # pragma: no cover - huggingface_hub comes with `datasets`, a dependency
        raise ReplayError("loading a replay set from the hub needs huggingface_hub (pip install huggingface_hub)") from error
    try:
        return Path(snapshot_download(repo_id=repo_id, repo_type="dataset", revision=revision or None))
    except LocalEntryNotFoundError as error:
        raise ReplayError(f"replay set {HUB_PREFIX}{spec} is not in the local hub cache and the hub cannot be "
                          "reached (offline?); download it once with network access, or pass a local folder") from error
    except RevisionNotFoundError as error:
        raise ReplayError(f"replay set {HUB_PREFIX}{repo_id} has no revision {revision!r}: name a branch, tag or "
                          "commit of the dataset repository") from error
    except HFValidationError as error:
        raise ReplayError(f"{HUB_PREFIX}{spec} is not a hub dataset id ({error}): {form}") from error
