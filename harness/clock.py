"""A clock a test moves by hand: for code that takes `clock: Callable[[], float]`, so time
passes exactly when the test says, however slow the machine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Clock:
    """Call it for the time; set or add to `now` to move it."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now
