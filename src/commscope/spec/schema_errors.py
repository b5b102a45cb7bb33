"""JSON-schema errors as a few lines that name the key, say what is wrong and how to fix it.

jsonschema's own top-level error for a ``oneOf`` (the sweep is one block or a list of blocks)
is "<the whole instance> is not valid under any of the given schemas": over a thousand
characters of Python reprs that name neither the key nor the problem. :func:`schema_problems`
instead follows, under every ``oneOf``/``anyOf``, the branch the value was meant for (the one
whose type fits) and reports that branch's errors, one line per problem: the key's path
(``sweep[2].bandwidth``), what is wrong, and a did-you-mean for an unknown key. Pure: no files,
no processes.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SchemaProblem", "key_path", "schema_problems", "short_repr"]

# Validators that say "this value is not the kind of thing this branch describes": a branch
# failing one of them on the value itself was not the branch the value was meant for.
_KIND_VALIDATORS = ("type", "const", "enum")
_UNKNOWN_KEY_VALIDATORS = ("additionalProperties", "unevaluatedProperties")
# At most this many problems are listed; the rest are counted.
MAX_PROBLEMS = 8

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = 4
_short.maxdict = 4
_short.maxlevel = 1
SHORT_REPR_CHARS = 100


def short_repr(value: Any) -> str:
    """``repr`` cut to a readable length (a sweep block's keys, not its whole text)."""
    text = _short.repr(value)
    return text if len(text) <= SHORT_REPR_CHARS else text[: SHORT_REPR_CHARS - 3] + "..."


def key_path(parts: Iterable[Any]) -> str:
    """``sweep[2].bandwidth`` from ``['sweep', 2, 'bandwidth']``; ``(top level)`` for none."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


@dataclass(frozen=True)
class SchemaProblem:
    """One problem: the key's path (``sweep[2].bandwidth``) and what is wrong with it."""

    path: str
    message: str

    def line(self, what: str = "config key") -> str:
        return f"{what} {self.path}: {self.message}"


def schema_problems(
    errors: Iterable[Any], schema: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> list[SchemaProblem]:
    """The problems behind jsonschema ``errors`` (``Validator.iter_errors``), one per key.

    ``schema`` is the whole schema (for the keys a ``$ref`` brings); ``defaults`` maps a key
    that may be left out to its default, named when that key is given as an empty list.
    """
    leaves: list[Any] = []
    for error in errors:
        leaves += _leaf_errors(error)
    problems: list[SchemaProblem] = []
    unknown = [e for e in leaves if e.validator in _UNKNOWN_KEY_VALIDATORS]
    required = [e for e in leaves if e.validator == "required"]
    paired: set[tuple[str, str]] = set()  # (object path, missing key) an unknown key explains
    for error in unknown:
        problems += _unknown_key_problems(error, schema, required, paired)
    problems += _required_problems(required, paired)
    # An object with an unknown key has too many keys because of it: the unknown key says it.
    with_unknown = {key_path(e.absolute_path) for e in unknown}
    for error in leaves:
        path = key_path(error.absolute_path)
        if error.validator in (*_UNKNOWN_KEY_VALIDATORS, "required") or (
            error.validator == "maxProperties" and path in with_unknown
        ):
            continue
        problems.append(SchemaProblem(path, _message(error, defaults)))
    seen: set[SchemaProblem] = set()
    unique = [p for p in problems if not (p in seen or seen.add(p))]
    return sorted(unique, key=lambda p: p.path)


def _branches(error: Any) -> dict[int, list[Any]]:
    """The context errors of a ``oneOf``/``anyOf`` error, by branch index."""
    branches: dict[int, list[Any]] = {}
    for sub in error.context:
        branches.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
    return branches


def _mismatched(branch: list[Any]) -> bool:
    """Whether a branch failed on the value's kind itself (an object where it wants a list)."""
    return any(not e.relative_path and e.validator in _KIND_VALIDATORS for e in branch)


def _leaf_errors(error: Any) -> list[Any]:
    """``error`` itself, or under a ``oneOf``/``anyOf`` the errors of the branch the value was
    meant for (the branch whose kind fits, the fewest errors first), recursively. When no
    branch fits, one error says which kinds would (:class:`_NoBranch`)."""
    if error.validator not in ("oneOf", "anyOf") or not error.context:
        return [error]
    branches = _branches(error)
    fitting = {i: b for i, b in branches.items() if not _mismatched(b)}
    if not fitting:
        return [_NoBranch(error, branches)]
    best = min(fitting.values(), key=len)
    return [leaf for sub in best for leaf in _leaf_errors(sub)]


class _NoBranch:
    """A value no branch of a ``oneOf``/``anyOf`` takes: each branch wanted another kind."""

    validator = "noBranch"

    def __init__(self, error: Any, branches: dict[int, list[Any]]) -> None:
        self.absolute_path = error.absolute_path
        self.instance = error.instance
        self.schema = error.schema
        wanted = []
        for branch in branches.values():
            for e in branch:
                if not e.relative_path and e.validator in _KIND_VALIDATORS:
                    wanted.append(_kind_wanted(e))
                    break
        self.message = f"{short_repr(error.instance)} should be {' or '.join(wanted)}"


def _kind_wanted(error: Any) -> str:
    if error.validator == "const":
        return repr(error.validator_value)
    if error.validator == "enum":
        return f"one of {error.validator_value!r}"
    kinds = error.validator_value
    names = {"object": "a mapping (key: value)", "array": "a list", "string": "a string"}
    if isinstance(kinds, str):
        return names.get(kinds, f"of type {kinds!r}")
    return " or ".join(names.get(k, f"of type {k!r}") for k in kinds)


def _known_keys(error: Any, schema: Mapping[str, Any]) -> set[str]:
    """The keys the failing object's schema knows: its ``properties`` and those a ``$ref`` to
    ``$defs`` brings."""
    sub = error.schema if isinstance(error.schema, Mapping) else {}
    known = set(sub.get("properties") or {})
    ref = str(sub.get("$ref", ""))
    if ref.startswith("#/$defs/"):
        shape = (schema.get("$defs") or {}).get(ref.removeprefix("#/$defs/")) or {}
        known |= set(shape.get("properties") or {})
    return known


def _missing(required: list[Any], path: str) -> list[str]:
    """Required keys missing from the object at ``path`` (jsonschema: one error per key)."""
    return [
        str(e.message).split("'")[1]
        for e in required
        if key_path(e.absolute_path) == path and "'" in str(e.message)
    ]


def _unknown_key_problems(
    error: Any, schema: Mapping[str, Any], required: list[Any], paired: set[tuple[str, str]]
) -> list[SchemaProblem]:
    """One problem per unexpected key of the object, with the closest known key (or a missing
    required one it probably stands for: ``bandwidth`` for ``bw``), else the known keys."""
    where = key_path(error.absolute_path)
    known = _known_keys(error, schema)
    instance = error.instance if isinstance(error.instance, Mapping) else {}
    missing = [k for k in _missing(required, where) if (where, k) not in paired]
    out = []
    unmatched = []  # keys close to no known one: one line for all, with the known keys
    for key in [k for k in instance if k not in known]:
        path = key_path([*error.absolute_path, str(key)])
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        if not close and missing:
            # A renamed key leaves a required key missing: that is the one it stands for,
            # however unlike it is (bandwidth for bw).
            ratios = {m: difflib.SequenceMatcher(None, str(key), m).ratio() for m in missing}
            best = max(ratios, key=lambda m: ratios[m])
            if len(missing) == 1 or ratios[best] >= 0.3:
                close = [best]
        if close and close[0] in missing:
            paired.add((where, close[0]))
            missing.remove(close[0])
            hint = f"did you mean {close[0]!r} (required, not given)?"
        elif close:
            hint = f"did you mean {close[0]!r}?"
        else:
            unmatched.append(str(key))
            continue
        out.append(SchemaProblem(path, f"unknown key {str(key)!r}; {hint}"))
    hint = f"known keys: {', '.join(sorted(known))}"
    if len(unmatched) == 1:
        path = key_path([*error.absolute_path, unmatched[0]])
        out.append(SchemaProblem(path, f"unknown key {unmatched[0]!r}; {hint}"))
    elif unmatched:
        names = ", ".join(repr(k) for k in unmatched)
        out.append(SchemaProblem(where, f"unknown keys {names}; {hint}"))
    return out


def _required_problems(required: list[Any], paired: set[tuple[str, str]]) -> list[SchemaProblem]:
    """One problem per object with required keys missing (jsonschema says one per key)."""
    by_path: dict[str, list[str]] = {}
    instances: dict[str, Any] = {}
    for error in required:
        path = key_path(error.absolute_path)
        instances[path] = error.instance
        by_path.setdefault(path, [])
        by_path[path] += [k for k in _missing([error], path) if (path, k) not in paired]
    out = []
    for path, keys in by_path.items():
        if not keys:
            continue
        names = ", ".join(keys)
        if not instances[path]:
            message = f"empty; give the required keys {names}"
        elif len(keys) == 1:
            message = f"{keys[0]!r} is a required property"
        else:
            message = f"missing the required keys {names}"
        out.append(SchemaProblem(path, message))
    return out


def _message(error: Any, defaults: Mapping[str, Any] | None) -> str:
    """What is wrong with the value, shortened, with the fix where the error alone does not
    say it (the shape a pattern stands for, an empty list's default)."""
    message = str(error.message)
    if len(message) > 200:
        message = message.replace(repr(error.instance), short_repr(error.instance))
    sub = error.schema if isinstance(error.schema, Mapping) else {}
    described = str(sub.get("description", "")).rstrip(".")
    if error.validator == "minItems" and error.instance == []:
        message = "an empty list; list at least one value"
        key = list(error.absolute_path)[-1] if error.absolute_path else None
        if defaults and key in defaults:
            message += f", or leave {key} out (default {defaults[key]})"
    elif error.validator == "minProperties" and error.instance == {}:
        message = "empty; " + (described or "give at least one key")
    elif error.validator == "maxProperties":
        message = f"{len(error.instance)} keys ({', '.join(map(str, error.instance))}), at most "
        message += f"{error.validator_value}" + (f": {described}" if described else "")
    elif error.validator == "not":
        message = f"{short_repr(error.instance)} is not allowed here"
        if described:
            message += f" ({described})"
    elif error.validator == "pattern" and described:
        message += f" ({described})"
    return message
