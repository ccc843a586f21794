"""Turning task arguments into the JSON stored on a job, and back.

Serialization happens in the caller's process at enqueue time, so a bad argument fails
before anything is written and the error can name the task and the offending value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqla_queue.errors import PayloadNotSerializableError

__all__ = ["decode_arguments", "dump_json", "encode_arguments", "encode_json", "make_payload"]

# One encoder for every call: json.dumps with options builds a new one each time.
_encode = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


def encode_json(value: Any) -> str:
    """Compact JSON text of ``value``, NaN refused; ``TypeError``/``ValueError`` otherwise.

    The bare encoder, shared by every enqueue: callers that need the friendly error run
    :func:`dump_json` on the failing part.
    """
    return _encode(value)


def _find_offender(value: Any, path: str) -> tuple[str, Any] | None:
    """Locate the first value under ``value`` that the json module refuses."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool) and key is not None:
                return f"{path} key {key!r}", key
            found = _find_offender(item, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _find_offender(item, f"{path}[{index}]")
            if found:
                return found
        return None
    if value is None or isinstance(value, str | int | bool):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    return path, value


def make_payload(args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON document stored in ``jobs.payload`` for a call with ``args`` and ``kwargs``."""
    return {"args": list(args), "kwargs": dict(kwargs)}


def dump_json(value: Any, *, task: str, what: str = "arguments") -> str:
    """Serialize ``value`` to JSON text, or raise a :class:`PayloadNotSerializableError`.

    NaN and infinities are refused too: PostgreSQL's jsonb cannot store them.
    """
    try:
        return _encode(value)
    except (TypeError, ValueError) as exc:
        offender = _find_offender(value, what)
        where, bad = offender if offender else (what, value)
        raise PayloadNotSerializableError(
            f"cannot enqueue task {task!r}: {where} = {bad!r} "
            f"(type {type(bad).__name__}) is not JSON-serializable; "
            "pass plain dicts, lists, strings, numbers, booleans or None"
        ) from exc


def encode_arguments(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """Serialize a call's arguments for ``task`` to the JSON text stored on the job."""
    return dump_json(make_payload(args, kwargs), task=task)


def decode_arguments(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    """Split a stored payload into positional and keyword arguments.

    Raises ``ValueError`` for a row whose payload does not have the shape enqueue writes,
    which the worker records as the job's failure instead of crashing.
    """
    if not isinstance(payload, dict):
        raise ValueError(f"malformed payload: expected a JSON object, got {type(payload).__name__}")
    args = payload.get("args", [])
    kwargs = payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError("malformed payload: 'args' must be a list and 'kwargs' an object")
    return args, kwargs
