"""Retry delays: exponential, capped, with jitter inside fixed bounds."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from sqla_queue.checks import is_number

__all__ = ["RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait before attempt ``n + 1`` after attempt ``n`` failed.

    The un-jittered delay is ``min_delay * factor ** (attempt - 1)``, capped at ``max_delay``.
    Jitter then takes up to ``jitter`` (a fraction) off it, never going below ``min_delay``:
    workers that failed together spread out instead of retrying in lockstep.
    """

    min_delay: float = 1.0
    max_delay: float = 600.0
    factor: float = 2.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        for name in ("min_delay", "max_delay", "factor", "jitter"):
            value = getattr(self, name)
            if not is_number(value):
                raise TypeError(
                    f"RetryPolicy.{name} must be a number, got {value!r} ({type(value).__name__})"
                )
            if not math.isfinite(value):
                raise ValueError(f"RetryPolicy.{name} must be finite, got {value!r}")
        if self.min_delay < 0 or self.max_delay < self.min_delay:
            raise ValueError("RetryPolicy needs 0 <= min_delay <= max_delay")
        if self.factor < 1:
            raise ValueError("RetryPolicy.factor must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("RetryPolicy.jitter must be between 0 and 1")

    def ceiling(self, attempt: int) -> float:
        """The delay after ``attempt`` before jitter (the upper bound of :meth:`delay`)."""
        exponent = max(attempt - 1, 0)
        # Cap the exponent: float overflow would raise long before any sane max_delay.
        try:
            raw = self.min_delay * self.factor ** min(exponent, 64)
        except OverflowError:  # a huge factor: the cap applies
            return float(self.max_delay)
        return min(raw, self.max_delay)

    def floor(self, attempt: int) -> float:
        """The lowest delay :meth:`delay` can return after ``attempt``."""
        return max(self.min_delay, self.ceiling(attempt) * (1 - self.jitter))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """A jittered delay, in seconds, within ``[floor(attempt), ceiling(attempt)]``."""
        high = self.ceiling(attempt)
        low = self.floor(attempt)
        return (rng or random).uniform(low, high)
