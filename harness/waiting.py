"""The one way a test waits for a condition: poll a probe that returns the state, until a
predicate accepts it, and fail with the state it last saw.

A wait that fails with only "condition not met in time" sends its reader back to re-run
the test with prints; one that says what it waited for, for how long, and what it saw last
(and what the probe last raised) usually says why. So every probe here returns the state
itself, not a boolean, and `until` decides whether it is the one wanted:

    used = await eventually(lambda: shim.budget.used, "the budget released",
                            until=lambda used: used == 0, within_s=10)
    wait_until(lambda: kubectl_get(...), "the Deployment", within_s=60)  # until: truthy

Polling starts fast and backs off to `interval_s`, so a condition met at once costs
milliseconds and a slow one does not spin a busy machine's CPU. `fail_if` names a reason
waiting is hopeless (a process exited), checked each round, so a dead process fails the
wait at once instead of at its deadline; `detail` adds context (a log tail) to a failure.
`wait_for_line` is the common case of both: a process's log, and the process.

`wait_until` blocks (for synchronous tests and harness code); `eventually` is its
coroutine twin and accepts a sync or an async probe. Both share one bookkeeping class,
`_Rounds`, so the two differ only in how they sleep.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, TypeVar, overload

T = TypeVar("T")

FIRST_PAUSE_S: Final[float] = 0.005
"""The shortest first pause between probes. The first is a tenth of the caller's `interval_s`
(a probe that spawns kubectl is not repeated every 5 ms), and each next one doubles, up to
`interval_s`."""
NEVER: Final[object] = object()
"""The last state before the probe first returns."""
STATE_CHARS: Final[int] = 2000
"""How much of the last state's repr a failure message quotes (its start and its end)."""


class NotMet(AssertionError):  # noqa: N818 - reads as the outcome: `raise NotMet(...)`
    """A condition waited for did not hold in time, or waiting for it became hopeless.

    An AssertionError, so pytest reports it as the test's failure, not as an error."""


class _Rounds:
    """The bookkeeping of one wait: deadline, backoff, and the last state and error seen."""

    def __init__(
        self,
        what: str,
        within_s: float,
        interval_s: float,
        until: Callable[[Any], object],
        detail: Callable[[], str] | None,
    ) -> None:
        self.what = what
        self.within_s = within_s
        self.interval_s = interval_s
        self.until = until
        self.detail = detail
        self.start = time.monotonic()
        self.deadline = self.start + within_s
        self.pause = min(interval_s, max(FIRST_PAUSE_S, interval_s / 10))
        self.probes = 0
        self.last: object = NEVER
        self.error: BaseException | None = None

    def met(self, value: object) -> bool:
        self.probes += 1
        self.last = value
        return bool(self.until(value))

    def failed(self, error: BaseException) -> None:
        self.probes += 1
        self.error = error

    def next_pause(self) -> float | None:
        """Seconds to sleep before the next probe, or None once the deadline has passed (the
        last probe was at or after it)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return None
        pause = min(self.pause, left)
        self.pause = min(self.pause * 2, self.interval_s)
        return pause

    def not_met(self, why: str | None = None) -> NotMet:
        waited = time.monotonic() - self.start
        head = why if why is not None else f"not met within {self.within_s:g} s"
        last = "(the probe never returned)" if self.last is NEVER else _cut(repr(self.last))
        lines = [f"{self.what}: {head} (waited {waited:.1f} s, {self.probes} probes)"]
        lines.append(f"last state: {last}")
        if self.error is not None:
            lines.append(f"last error from the probe: {self.error!r}")
        if self.detail is not None:
            lines.append(self.detail())
        return NotMet("\n".join(lines))


def _cut(text: str) -> str:
    if len(text) <= STATE_CHARS:
        return text
    half = STATE_CHARS // 2
    return f"{text[:half]} ... ({len(text) - 2 * half} chars) ... {text[-half:]}"


def wait_until(
    probe: Callable[[], T],
    what: str,
    *,
    within_s: float,
    interval_s: float = 0.25,
    until: Callable[[T], object] = bool,
    retry_on: tuple[type[Exception], ...] = (),
    fail_if: Callable[[], str | None] | None = None,
    detail: Callable[[], str] | None = None,
) -> T:
    """Call `probe()` until `until(state)` holds; return that state.

    `retry_on`: exceptions of the probe that mean "not yet" (a port not open yet); any other
    propagates at once. `fail_if()`: a reason to stop waiting now (the process exited), or
    None. `detail()`: context for the failure message (a log tail). Raises `NotMet` naming
    `what`, the seconds waited, the last state and the probe's last error."""
    rounds = _Rounds(what, within_s, interval_s, until, detail)
    while True:
        try:
            state = probe()
            if rounds.met(state):
                return state
        except retry_on as error:
            rounds.failed(error)
        if fail_if is not None and (why := fail_if()) is not None:
            # The condition may have been met just before the end: look once more.
            try:
                if rounds.met(state := probe()):
                    return state
            except retry_on as error:
                rounds.failed(error)
            raise rounds.not_met(why)
        pause = rounds.next_pause()
        if pause is None:
            raise rounds.not_met()
        time.sleep(pause)


@overload
async def eventually(
    probe: Callable[[], Awaitable[T]],
    what: str,
    *,
    within_s: float,
    interval_s: float = ...,
    until: Callable[[T], object] = ...,
    retry_on: tuple[type[Exception], ...] = ...,
    fail_if: Callable[[], str | None] | None = ...,
    detail: Callable[[], str] | None = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T],
    what: str,
    *,
    within_s: float,
    interval_s: float = ...,
    until: Callable[[T], object] = ...,
    retry_on: tuple[type[Exception], ...] = ...,
    fail_if: Callable[[], str | None] | None = ...,
    detail: Callable[[], str] | None = ...,
) -> T: ...


async def eventually(
    probe: Callable[[], Any],
    what: str,
    *,
    within_s: float,
    interval_s: float = 0.1,
    until: Callable[[Any], object] = bool,
    retry_on: tuple[type[Exception], ...] = (),
    fail_if: Callable[[], str | None] | None = None,
    detail: Callable[[], str] | None = None,
) -> Any:
    """`wait_until` for a coroutine: the same contract, sleeping with `asyncio.sleep` (the
    event loop runs what is being waited for), and `probe` may be sync or async."""
    rounds = _Rounds(what, within_s, interval_s, until, detail)

    async def look() -> bool:
        try:
            state = probe()
            if inspect.isawaitable(state):
                state = await state
            return rounds.met(state)
        except retry_on as error:
            rounds.failed(error)
            return False

    while True:
        if await look():
            return rounds.last
        if fail_if is not None and (why := fail_if()) is not None:
            if await look():  # met just before the end
                return rounds.last
            raise rounds.not_met(why)
        pause = rounds.next_pause()
        if pause is None:
            raise rounds.not_met()
        await asyncio.sleep(pause)


def log_tail(log_path: Path, lines: int = 30) -> str:
    """The end of a process's log file, for a failure message."""
    if not log_path.exists():
        return "(no log)"
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:]) or "(empty log)"


def wait_for_line(log_path: Path, text: str, proc: subprocess.Popen[Any], within_s: float) -> str:
    """Until the log file holds `text`; return the whole log then. Fails at once, with the
    log's tail, if `proc` exits first (a process that died will never log it)."""

    def exited() -> str | None:
        code = proc.poll()
        return None if code is None else f"the process exited {code} before logging {text!r}"

    return wait_until(
        lambda: log_path.read_text(errors="replace") if log_path.exists() else "",
        f"{text!r} in {log_path.name}",
        within_s=within_s,
        until=lambda log: text in log,
        fail_if=exited,
        detail=lambda: f"log tail:\n{log_tail(log_path)}",
    )
