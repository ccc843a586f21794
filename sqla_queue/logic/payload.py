"""Turning task arguments into the JSON stored on a job, and back.

Serialization happens in the caller's process at enqueue time, so a bad argument fails
before anything is written and the error can name the task and the offending value.

What a payload may hold is what PostgreSQL's ``jsonb`` can store and Python reads back
unchanged:

- dicts with string keys, lists and tuples (stored as lists), strings, ints, finite
  floats, booleans and ``None``; a non-string key is refused, because ``json`` would
  silently turn ``{1: "a"}`` into ``{"1": "a"}``;
- no NUL character (``"\\x00"``) and no lone surrogate (a code point from U+D800 to
  U+DFFF that is not half of a high-low pair) in any string, key or value: ``jsonb`` and
  ``text`` reject both (a pair is stored as the character it encodes, as JSON does);
- nesting at most :data:`MAX_DEPTH` levels, counting the stored document
  ``{"args": [...], "kwargs": {...}}`` itself as two.

A payload may also carry a few string fields beside ``args`` and ``kwargs``: what the
hooks installed with :func:`add_payload_hook` add (a W3C ``traceparent``, for instance).
They never change the arguments, and a payload without them decodes as before.

Checking all of that on every enqueue would cost a walk of every payload. The encoder's
own output proves almost always that no walk is needed (see :func:`text_suspect` and
:func:`shape_suspect`), so the walk (:func:`find_unstorable`) runs only when the
encoding fails or its text shows a reason to look.
"""

from __future__ import annotations

import json
import logging
import math
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from sqla_queue.errors import PayloadNotSerializableError

__all__ = [
    "MAX_DEPTH",
    "PayloadHook",
    "Unstorable",
    "add_payload_hook",
    "check_keywords_storable",
    "check_storable",
    "decode_arguments",
    "dump_json",
    "dump_payloads",
    "encode_arguments",
    "encode_json",
    "find_unstorable",
    "make_payload",
    "payload_extras",
    "remove_payload_hook",
    "shape_suspect",
    "text_problem",
    "text_suspect",
]

#: The deepest nesting of lists and objects a stored JSON document may have. Far below
#: what PostgreSQL's parser and Python's recursion limit allow, so that every worker can
#: decode the document from any call stack; a 5,000-deep payload is refused, not a
#: ``RecursionError``.
MAX_DEPTH = 200

# One encoder for every call: json.dumps with options builds a new one each time. Its
# output is ASCII (ensure_ascii): NUL is written \u0000, a character beyond the BMP as a
# surrogate pair \ud83d\ude00, and a surrogate code point as its own \udXXX escape.
_encode = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode

# In the encoder's output: NUL or any surrogate escape (a cheap first look)...
_ANY_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|d[89a-f])")
# ...then exactly: NUL, a high surrogate not followed by a low one, or a low one not
# preceded by a high one. Only once escaped backslashes are blanked out: in "\\ud800"
# (a backslash, then the text "ud800") no escape starts at the second backslash.
# Every branch starts with the literal \u, so the search skips ahead to each one; the
# low surrogate's look back at its predecessor comes after it.
_BAD_ESCAPE = re.compile(
    r"\\u(?:0000"
    r"|d[89ab][0-9a-f]{2}(?!\\ud[c-f])"
    r"|d[c-f][0-9a-f]{2}(?<!\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}))"
)
# The same rule on a Python string: a surrogate code point that is not half of a pair.
# (A high-low pair of code points is written as, and stored as, the character it encodes.)
_LONE_SURROGATE = re.compile(
    "[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]"
)

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60

_TOO_DEEP = f"nests lists and objects more than {MAX_DEPTH} levels deep (or contains itself)"
_NOT_JSON = "is not JSON-serializable; pass plain dicts, lists, strings, numbers, booleans or None"
_NOT_FINITE = "is not a finite number (JSON has no NaN or infinity)"


class Unstorable(NamedTuple):
    """Where a value cannot be stored, the value found there, and why."""

    where: str
    value: Any
    reason: str


def encode_json(value: Any) -> str:
    """Compact JSON text of ``value``, NaN refused; ``TypeError``/``ValueError`` otherwise.

    The bare encoder, shared by every enqueue: it does not refuse what only PostgreSQL
    rejects (NUL, lone surrogates) or what it would convert (non-string keys). Callers
    that store its output check it with :func:`text_suspect`, :func:`shape_suspect` and
    :func:`check_storable` (as :func:`dump_json` does).
    """
    return _encode(value)


def text_suspect(text: str) -> bool:
    """Whether ``text``, from :func:`encode_json`, holds a NUL or a lone surrogate.

    Exact: ``False`` proves that no string (or key) of the encoded value holds either,
    ``True`` that one does. Costs one substring test for ASCII text, and a regular
    expression or two (in C) for text with escapes.
    """
    if "\\u" not in text or _ANY_SUSPECT_ESCAPE.search(text) is None:
        return False
    return _BAD_ESCAPE.search(text.replace("\\\\", "__")) is not None


def shape_suspect(text: str, *, objects: int = 0, arrays: int = 0, depth: int = 0) -> bool:
    """Whether the value ``text`` encodes may have a non-string key or nest too deep.

    ``False`` proves that it has neither, without walking the value: its objects and
    arrays are all the caller's own (``objects`` ``{`` and ``arrays`` ``[`` that it wrote
    itself, with its values ``depth`` levels deep in them), or it has no object of its
    own and too few arrays to exceed :data:`MAX_DEPTH`. A ``True`` may be a false alarm
    (a ``{`` inside a string); :func:`check_storable` then decides.
    """
    return text.count("{") > objects or text.count("[") - arrays > MAX_DEPTH - depth


def text_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store the string ``text`` (NUL, lone surrogate), or ``None``."""
    if "\x00" in text:
        return (
            f"contains a NUL character (\\x00) at index {text.index(chr(0))}, "
            "which PostgreSQL cannot store"
        )
    found = _LONE_SURROGATE.search(text)
    if found is not None:
        return (
            f"contains a lone surrogate code point U+{ord(found.group()):04X} at index "
            f"{found.start()}, which is not a character; PostgreSQL stores only valid Unicode"
        )
    return None


Found = tuple[list[str], Any, str]


def _walk(value: Any, depth: int, strings: bool) -> Found | None:
    """The first problem under ``value``: (path parts innermost first, value, reason).

    Scalars among a container's items are checked inline: a call per container only.
    ``strings=False`` skips the text checks (the encoded text proved them unneeded).
    """
    if isinstance(value, dict):
        items: Any = value.items()
        is_dict = True
    elif isinstance(value, list | tuple):
        items = enumerate(value)
        is_dict = False
    else:
        return _leaf(value, strings)
    if depth >= MAX_DEPTH:
        return [], _DEEP, _TOO_DEEP
    for key, item in items:
        if is_dict:
            if not isinstance(key, str):
                return [f" key {_show(key)} (type {type(key).__name__})"], _KEY, _key_rule(key)
            if strings and (reason := text_problem(key)) is not None:
                return [f" key {_show(key)}"], _KEY, reason
        if isinstance(item, str):
            if strings and (reason := text_problem(item)) is not None:
                return [_part(key, is_dict)], item, reason
            continue
        if item is None or isinstance(item, int):  # bool is an int
            continue
        found = _walk(item, depth + 1, strings)
        if found is not None:
            found[0].append(_part(key, is_dict))
            return found
    return None


def _leaf(value: Any, strings: bool) -> Found | None:
    if isinstance(value, str):
        reason = text_problem(value) if strings else None
        return None if reason is None else ([], value, reason)
    if value is None or isinstance(value, int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else ([], value, _NOT_FINITE)
    return [], value, f"(type {type(value).__name__}) {_NOT_JSON}"


def _part(key: Any, is_dict: bool) -> str:
    return f"[{_show(key)}]" if is_dict else f"[{key}]"


def _key_rule(key: Any) -> str:
    rule = "is not a string: JSON object keys must be strings"
    if key is None or isinstance(key, int | float):
        # What json.dumps would silently have made of it.
        converted = next(iter(json.loads(_encode({key: 0}))))
        rule += f" (it would come back as {converted!r})"
    return rule


class _Marker:
    """A stand-in for a value a message must not show (a key, a too-deep container)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_DEEP = _Marker("<too deep>")
_KEY = _Marker("<key>")


def _show(value: Any) -> str:
    try:
        return _short.repr(value)
    except Exception:  # a __repr__ that raises must not hide the real error
        return f"<{type(value).__name__} object>"


def _path(root: str, parts: list[str]) -> str:
    ordered = parts[::-1]
    if len(ordered) > 12:
        ordered = [*ordered[:8], f"...{len(ordered) - 10} more...", *ordered[-2:]]
    return root + "".join(ordered)


def find_unstorable(value: Any, what: str = "value", *, strings: bool = True) -> Unstorable | None:
    """The first part of ``value`` that cannot be stored as JSON in PostgreSQL, or ``None``.

    ``what`` names ``value`` in the returned location (``arguments['kwargs']['to']``).
    Refused: types JSON lacks, NaN and infinities, non-string keys, nesting deeper than
    :data:`MAX_DEPTH`, and (unless ``strings=False``) NUL and lone surrogates in strings
    and keys. The walk stops at that depth, so it never recurses further however deep
    (or self-referencing) ``value`` is.
    """
    found = _walk(value, 0, strings)
    if found is None:
        return None
    parts, bad, reason = found
    return Unstorable(_path(what, parts), bad, reason)


def _doing(task: str, doing: str | None) -> str:
    """What the message says could not be done: an enqueue of ``task`` unless ``doing``."""
    return doing if doing is not None else f"enqueue task {task!r}"


def _message(doing: str, found: Unstorable) -> str:
    if found.value is _KEY or found.value is _DEEP:
        return f"cannot {doing}: {found.where} {found.reason}"
    return f"cannot {doing}: {found.where} = {_show(found.value)} {found.reason}"


def check_storable(
    value: Any,
    *,
    task: str,
    what: str = "arguments",
    strings: bool = True,
    doing: str | None = None,
) -> None:
    """Raise :class:`PayloadNotSerializableError` naming the first unstorable part of ``value``.

    See :func:`find_unstorable` for the rules and ``strings``. The message says it cannot
    enqueue ``task``, or ``doing`` when given (a durable step's result, a signal's payload).
    """
    if _walk(value, 0, strings) is None:
        return
    found = find_unstorable(value, what, strings=strings)
    assert found is not None
    raise PayloadNotSerializableError(_message(_doing(task, doing), found))


log = logging.getLogger("sqla_queue.payload")

#: Called for each payload made: the task's name (``None`` when the caller does not say)
#: to the string fields to store beside the arguments, or ``None`` for none.
PayloadHook = Callable[[str | None], Mapping[str, str] | None]


class _Hooks:
    """The installed hooks. A tuple, replaced whole, so that a payload made on another
    thread while a hook is added iterates a consistent snapshot without a lock."""

    installed: tuple[PayloadHook, ...] = ()


_HOOKS = _Hooks()

#: The payload's own fields: a hook cannot replace them.
_ARGUMENT_FIELDS = frozenset({"args", "kwargs"})


def add_payload_hook(hook: PayloadHook) -> None:
    """Call ``hook`` for every payload this process makes from now on.

    The seam the enqueue-side integrations use (tracing injects the current trace context,
    metrics count enqueues), so that the enqueue path itself knows nothing of them.
    Without a hook, making a payload costs what it always did. A hook that raises is
    logged and ignored: observing must never fail an enqueue. Fields it returns named
    ``args`` or ``kwargs``, or that are not strings PostgreSQL can store, are dropped.
    Adding a hook twice is a no-op.
    """
    if hook not in _HOOKS.installed:
        _HOOKS.installed = (*_HOOKS.installed, hook)


def remove_payload_hook(hook: PayloadHook) -> None:
    """Stop calling ``hook`` (a no-op if it is not installed)."""
    _HOOKS.installed = tuple(h for h in _HOOKS.installed if h != hook)


def make_payload(
    args: Sequence[Any], kwargs: Mapping[str, Any], *, task: str | None = None
) -> dict[str, Any]:
    """The JSON document stored in ``jobs.payload`` for a call with ``args`` and ``kwargs``.

    ``task`` names the task the payload is for, for the hooks (see :func:`add_payload_hook`).
    """
    payload = {"args": list(args), "kwargs": dict(kwargs)}
    hooks = _HOOKS.installed
    if hooks:
        _add_extras(payload, task, hooks)
    return payload


def _add_extras(payload: dict[str, Any], task: str | None, hooks: tuple[PayloadHook, ...]) -> None:
    for hook in hooks:
        try:
            extras = hook(task)
        except Exception:
            log.warning("payload hook %r failed; enqueuing without it", hook, exc_info=True)
            continue
        if not extras:
            continue
        for key, value in extras.items():
            # Only flat strings: they add no object or array to the encoded text, so the
            # enqueue's proof that a payload needs no walk (shape_suspect) still holds.
            if (
                isinstance(key, str)
                and isinstance(value, str)
                and key not in _ARGUMENT_FIELDS
                and text_problem(key) is None
                and text_problem(value) is None
            ):
                payload[key] = value


def payload_extras(payload: Any) -> dict[str, str]:
    """The string fields a stored payload carries beside its arguments (see
    :func:`add_payload_hook`); empty for a payload without any, or of another shape."""
    if not isinstance(payload, dict) or len(payload) <= 2:
        return {}
    return {
        key: value
        for key, value in payload.items()
        if key not in _ARGUMENT_FIELDS and isinstance(key, str) and isinstance(value, str)
    }


def dump_json(value: Any, *, task: str, what: str = "arguments", doing: str | None = None) -> str:
    """Serialize ``value`` to JSON text, or raise a :class:`PayloadNotSerializableError`.

    Everything :func:`find_unstorable` refuses is refused, with the task (or ``doing``,
    as :func:`check_storable`), the place and the rule in the message; the text returned
    is what PostgreSQL stores unchanged.
    """
    try:
        text = _encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        check_storable(value, task=task, what=what, doing=doing)
        raise PayloadNotSerializableError(
            f"cannot {_doing(task, doing)}: {what} {_NOT_JSON} ({exc})"
        ) from exc
    strings = text_suspect(text)
    if strings or shape_suspect(text):
        check_storable(value, task=task, what=what, strings=strings, doing=doing)
    return text


def dump_payloads(
    value: Any,
    payloads: Callable[[], Iterable[tuple[Any, str]]],
    *,
    objects: int,
    arrays: int,
) -> str:
    """The JSON text of ``value``, a structure around many jobs' payloads, or
    :class:`PayloadNotSerializableError` naming the task of the first unstorable one.

    ``payloads()`` yields each ``(payload, task)``; it is walked only when the encoder
    fails or the text is suspect. ``objects`` and ``arrays`` are those of the structure
    around the payloads (the enclosing array, each row's own objects), which the text's
    scans discount (see :func:`shape_suspect`; the payloads sit at depth 2).
    """
    try:
        text = _encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        # Slow path, only on failure: find the payload to blame by its task.
        for payload, task in payloads():
            check_storable(payload, task=task)
        raise PayloadNotSerializableError(
            f"cannot enqueue: a job's arguments are not JSON-serializable ({exc})"
        ) from exc
    strings = text_suspect(text)
    if strings or shape_suspect(text, objects=objects, arrays=arrays, depth=2):
        for payload, task in payloads():
            check_storable(payload, task=task, strings=strings)
    return text


def check_keywords_storable(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse a keyword that is not a string (in a JobSpec's or a by-name call's mapping).

    The encoder would silently turn it into one, and the encoded text cannot show it
    (``kwargs`` is one of the row's own objects, discounted by :func:`dump_payloads`'
    scans). The keys of ``**kwargs`` are always strings, so ``Task.enqueue`` needs no
    such check.
    """
    for key in kwargs:
        if not isinstance(key, str):
            check_storable(make_payload(args, kwargs), task=task)


def encode_arguments(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """Serialize a call's arguments for ``task`` to the JSON text stored on the job."""
    return dump_json(make_payload(args, kwargs), task=task)


def decode_arguments(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    """Split a stored payload into positional and keyword arguments.

    Raises ``ValueError`` for a row whose payload does not have the shape enqueue writes,
    which the worker records as the job's failure instead of crashing. Fields beside
    ``args`` and ``kwargs`` (see :func:`payload_extras`) are not arguments: they are left out.
    """
    if not isinstance(payload, dict):
        raise ValueError(f"malformed payload: expected a JSON object, got {type(payload).__name__}")
    args = payload.get("args", [])
    kwargs = payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError("malformed payload: 'args' must be a list and 'kwargs' an object")
    return args, kwargs
