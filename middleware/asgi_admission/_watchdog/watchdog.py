"""The session watchdog: samples the processes sessions start and halts them when needed.

See docs/operations.md, "The session watchdog". Notes:

- ``run()`` is a task on the application's event loop, started and stopped with
  the lifespan. Each tick measures in a thread of its own (``measure``) and decides
  on the loop (``_decide``); ``sample_once()`` does both, for tests.
- A session being halted counts as freeing its last RSS until its process is gone,
  so one breach does not halt a second session while the first is still exiting.
- Only memory halts. CPU is measured and reported, never acted on: a busy half
  second is the container runtime's to throttle, and a CPU-bound session is not
  a danger to its neighbours the way an out-of-memory kill is.
- A session in a memory group is held to its budget by the kernel, so its sampled RSS
  (an upper bound) does not halt it; an OOM kill there is the halt ``memory_limit``.
- Each session's peak goes into ``asgi_admission_session_memory_bytes`` once, when
  it is halted or ends: its RSS, or its memory group's exact peak (``groups.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import psutil
from prometheus_client import REGISTRY, CollectorRegistry

from asgi_admission._config import MIB, AdmissionConfig
from asgi_admission._config_env import number, seconds_from
from asgi_admission._memory.reading import MemoryReader, MemoryReading
from asgi_admission._watchdog.groups import SessionGroup, SessionGroups
from asgi_admission._watchdog.halt import HaltAction, HaltReason, ProcessGroupHalt, SessionHalt
from asgi_admission._watchdog.metrics import watchdog_metrics
from asgi_admission._watchdog.sampler import (
    ProcessSample,
    ProcessTreeSampler,
    let_the_loop_run,
    read_children_map,
)
from asgi_admission._watchdog.session import (
    PeakHook,
    SessionPeak,
    SessionTicket,
    SessionWatch,
    WatchedSession,
)

logger = logging.getLogger("asgi_admission")

# --------------------------------------------------------------------------------------
# The settings: the critical watermark and the sampling interval (docs/configuration.md).

DEFAULT_CRITICAL_WATERMARK_PERCENT: Final = 90.0
DEFAULT_INTERVAL_S: Final = 0.5
ENV_CRITICAL_WATERMARK: Final = ("ADMISSION_CRITICAL_WATERMARK_PERCENT", None)
ENV_INTERVAL: Final = ("ADMISSION_WATCHDOG_INTERVAL_SECONDS", None)


class SessionWatchdog:
    """Samples registered session processes and halts them when memory runs out.

    ``config`` supplies the memory source (cgroup or host) and the high watermark
    (default ``AdmissionConfig.from_env()``); ``memory_reader`` overrides the
    reader. ``critical_watermark_percent`` must lie above the high watermark: the
    latch stops admitting at the high one, the watchdog halts at the critical one.
    ``halt`` carries out a halt (default ``ProcessGroupHalt()``: SIGTERM to the
    process group, SIGKILL 5 s later) and ``on_halt`` is told of each one; either
    may be a coroutine function. ``registry=None`` registers no metrics.
    ``session_groups`` says where process sessions get memory groups of their own
    (default: found as ``config.session_groups`` says; docs/session-groups.md).
    """

    def __init__(
        self,
        *,
        config: AdmissionConfig | None = None,
        memory_reader: MemoryReader | None = None,
        critical_watermark_percent: float = DEFAULT_CRITICAL_WATERMARK_PERCENT,
        interval_s: float = DEFAULT_INTERVAL_S,
        halt: HaltAction | None = None,
        on_halt: HaltAction | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        logical_cpus: int | None = None,
        proc: str = "/proc",
        session_groups: SessionGroups | None = None,
    ) -> None:
        if config is None:
            config = AdmissionConfig.from_env()
        high = config.high_watermark_percent
        if not (
            math.isfinite(critical_watermark_percent) and high < critical_watermark_percent <= 100
        ):
            raise ValueError(
                "critical_watermark_percent must lie above the high watermark and at most 100 "
                f"(high < critical <= 100); got critical={critical_watermark_percent!r}, "
                f"high={high!r}."
            )
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be a number of seconds above 0; got {interval_s!r}.")
        if memory_reader is None:
            from asgi_admission._factory import build_reader

            memory_reader = build_reader(config)
        self.config = config
        self.memory_reader = memory_reader
        self.critical_watermark_percent = float(critical_watermark_percent)
        self.interval_s = float(interval_s)
        self._on_peak: PeakHook | None = None  # the guard learns the peaks
        #: Told each session's peak once, when it ends, with where the figure came from.
        self.on_session_peak: Callable[[SessionPeak], None] | None = None
        self._metrics = watchdog_metrics(registry)
        self._action = ProcessGroupHalt() if halt is None else halt
        self._on_halt = on_halt
        # The halt actions still running (a SIGKILL waiting out its grace period).
        self._halt_tasks: set[asyncio.Task[Any]] = set()
        if session_groups is None:
            session_groups = SessionGroups.find(config.session_groups)
        self.session_groups = session_groups
        self._metrics.groups_enabled.set(1 if session_groups.enabled else 0)
        logger.info(session_groups.describe())
        session_groups.clean_leftovers()
        self._clock = clock
        self._sleep = sleep
        self._logical_cpus = max(1, logical_cpus or psutil.cpu_count(logical=True) or 1)
        self._proc = proc
        # Registration order, so "largest first" breaks ties by age. The lock makes
        # register/unregister safe from threads (sync endpoints run in a threadpool).
        self._sessions: dict[WatchedSession, SessionWatch] = {}
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._warned_not_running = False

    def learn_peaks_with(self, hook: PeakHook) -> None:
        """Tell ``hook`` each watched session's peak once it ends, with its route (the
        guard this watchdog runs under learns from them: ``AdmissionMiddleware`` calls
        this with its admission service's ``observe_peak``)."""
        self._on_peak = hook

    @property
    def on_peak(self) -> PeakHook | None:
        """Who is told the sessions' peaks (:meth:`learn_peaks_with`), if anyone."""
        return self._on_peak

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        config: AdmissionConfig | None = None,
        memory_reader: MemoryReader | None = None,
        halt: HaltAction | None = None,
        on_halt: HaltAction | None = None,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> SessionWatchdog:
        """Build from ``ADMISSION_CRITICAL_WATERMARK_PERCENT`` and
        ``ADMISSION_WATCHDOG_INTERVAL_SECONDS`` (and ``AdmissionConfig.from_env``).

        Like ``AdmissionConfig.from_env`` it never fails on bad values: a malformed
        number, an interval of 0 or less, or a critical watermark not above the high
        one falls back (to 90, or halfway between the high watermark and 100 when
        that is above 90) with one warning naming the variable.
        """
        env = os.environ if environ is None else environ
        if config is None:
            config = AdmissionConfig.from_env(env)
        high = config.high_watermark_percent
        critical = number(env, ENV_CRITICAL_WATERMARK, DEFAULT_CRITICAL_WATERMARK_PERCENT, float)
        if not (math.isfinite(critical) and high < critical <= 100):
            fallback = (
                DEFAULT_CRITICAL_WATERMARK_PERCENT
                if high < DEFAULT_CRITICAL_WATERMARK_PERCENT
                else (high + 100) / 2
            )
            logger.warning(
                "%s=%s must lie above the high watermark %s and at most 100; using %s.",
                ENV_CRITICAL_WATERMARK[0],
                critical,
                high,
                fallback,
            )
            critical = fallback
        return cls(
            config=config,
            memory_reader=memory_reader,
            critical_watermark_percent=critical,
            interval_s=seconds_from(env, ENV_INTERVAL, DEFAULT_INTERVAL_S),
            halt=halt,
            on_halt=on_halt,
            registry=registry,
        )

    def register(
        self,
        pid: int,
        *,
        budget_bytes: int | None = None,
        session_id: str | None = None,
        include_children: bool = True,
        route: str | None = None,
        group: SessionGroup | None = None,
        ticket: SessionTicket | None = None,
    ) -> WatchedSession:
        """Watch the process ``pid`` for one session; returns its handle.

        ``budget_bytes`` halts the session once its RSS (with its descendants' unless
        ``include_children=False``) exceeds it; ``None`` leaves it to the container
        check alone. A pid that is already gone gives a handle that has already ended.
        ``route`` (the admission ticket's) lets the guard learn from the session's peak.
        ``ticket`` (``admission_ticket(request)`` of the request that opened the session)
        does that too, and while it is pending is told the memory the session's processes
        alone hold (``AdmissionTicket.measured``): its reservation settles as soon as
        that memory is there, and is released if the session is unregistered first.
        ``group`` (from :meth:`session_group`, the process started in it) hands the
        budget to the kernel; the group is removed when the session ends.
        """
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be above 0 or None; got {budget_bytes!r}.")
        try:
            sampler: ProcessTreeSampler | None = ProcessTreeSampler(
                pid, logical_cpus=self._logical_cpus
            )
        except psutil.Error:
            sampler = None
        session = SessionWatch(
            self,
            sampler,
            pid=pid,
            session_id=str(pid) if session_id is None else session_id,
            budget_bytes=budget_bytes,
            include_children=include_children,
            route=route if route is not None or ticket is None else ticket.route,
            group=group,
            ticket=ticket,
        )
        if sampler is None:
            self._end(session)
        else:
            with self._lock:
                self._sessions[session] = session
            if self._task is None and not self._warned_not_running:
                self._warned_not_running = True
                logger.warning(
                    "A session was registered with a SessionWatchdog that is not running: "
                    "pass it to AdmissionMiddleware(watchdog=...) and serve with lifespan on, "
                    "or await its start() yourself."
                )
        return session

    def unregister(self, session: WatchedSession) -> None:
        """End ``session``: it is never sampled again. Calling it twice is harmless.

        An admission ticket it was registered with that is still pending is released: the
        session is over before its memory settled its reservation (closed young), and
        nothing more will come of it. A process that exits on its own releases nothing
        (a launcher may leave its session running): the app says when the session ends.
        """
        self._drop(session)
        ticket = session.ticket
        if ticket is not None and ticket.state == "pending":
            ticket.release()

    @property
    def sessions(self) -> tuple[WatchedSession, ...]:
        """The sessions being watched, oldest first (halted ones until their process is gone)."""
        return self._watched()

    def _watched(self) -> tuple[SessionWatch, ...]:
        with self._lock:
            return tuple(self._sessions.values())

    def session_group(self, *, session_id: str, budget_bytes: int) -> SessionGroup | None:
        """A memory group of its own for a process session about to start, limited to
        ``budget_bytes``; ``None`` where groups are off or cannot be made (the watchdog
        alone then enforces the budget). Start the process with ``group.command(argv)``
        and pass ``group=`` to :meth:`register`. A few writes to the cgroup files: cheap,
        but call it from a thread (``asyncio.to_thread``) if that matters.
        """
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be above 0; got {budget_bytes!r}.")
        if not self.session_groups.enabled:
            return None
        try:
            return self.session_groups.create(session_id, budget_bytes)
        except OSError as error:
            if self.session_groups.mode == "require":
                raise
            logger.warning(
                "asgi-admission: could not make a memory group for session %s (%s); the "
                "watchdog alone enforces its budget.",
                session_id,
                error,
            )
            return None

    def _drop(self, session: WatchedSession) -> None:
        with self._lock:
            watch = self._sessions.pop(session, None)
        if watch is not None:
            self._end(watch)

    def _end(self, session: SessionWatch) -> None:
        session.end()
        group = session.group
        if group is not None and session.halt is None and group.oom_kills():
            self._memory_limit(session)
        self._observe_peak(session)
        if group is not None:
            self.session_groups.remove(group)

    def _observe_peak(self, session: SessionWatch) -> None:
        if session.group is not None and not session.ended:
            return  # the group's peak is read once the session has ended
        exact = None if session.group is None else session.group.peak_bytes()
        peak = session.peak_rss_bytes if exact is None else exact
        if peak is None or not session.claim_peak():
            return
        self._metrics.session_memory.observe(peak)
        if self._on_peak is not None and session.route is not None:
            # Learning takes the session's own memory where it was measured, not its
            # RSS, which counts the pages it shares with the server.
            own = session.peak_own_bytes
            learned = peak if exact is not None or own is None else own
            self._on_peak(session.route, learned, exact=exact is not None)
        if self.on_session_peak is not None:
            self.on_session_peak(
                SessionPeak(
                    session_id=session.session_id,
                    route=session.route,
                    peak_bytes=peak,
                    source="rss" if exact is None else "memory_group",
                    budget_bytes=session.budget_bytes,
                    halted=None if session.halt is None else session.halt.reason,
                )
            )

    def sample_once(self) -> tuple[SessionHalt, ...]:
        """One tick: sample every live session, then halt what must be halted.

        Returns the halts decided in this tick. Never raises for a process that has gone.
        """
        sessions = self._watched()
        if not sessions:
            return ()
        return self._decide(sessions, self._measure(sessions))

    def _measure(
        self, sessions: Sequence[SessionWatch], pause: Callable[[], None] | None = None
    ) -> list[Measured]:
        return measure(
            sessions,
            now=self._clock(),
            proc=self._proc,
            session_groups=self.session_groups,
            pause=pause,
        )

    def _decide(
        self, sessions: Sequence[SessionWatch], measured: list[Measured]
    ) -> tuple[SessionHalt, ...]:
        """The decisions of a tick, on the loop: record samples, end sessions, halt."""
        halts: list[SessionHalt] = []
        for session, was_halted, sample, ooms in measured:
            if session.ended:  # unregistered meanwhile (a callback, another thread)
                continue
            if ooms and not was_halted:
                if isinstance(sample, ProcessSample):
                    session.record(sample, peak=False)
                halts.append(self._memory_limit(session))
                was_halted = True
            if was_halted or sample is None:
                if sample is None:
                    self._drop(session)
                continue
            assert isinstance(sample, ProcessSample)
            session.record(sample)
            ticket = session.ticket
            if ticket is not None and ticket.awaiting_memory and sample.unique_bytes is not None:
                ticket.measured(sample.unique_bytes)
            budget = session.budget_bytes
            if budget is not None and session.group is None and sample.rss_bytes > budget:
                halts.append(
                    self._halt(
                        session,
                        "budget_exceeded",
                        None,
                        f"The session was halted because it used {sample.rss_bytes / MIB:.0f} "
                        f"MiB of memory, over its budget of {budget / MIB:.0f} MiB.",
                    )
                )
        live = [s for s in sessions if not s.ended]
        if live:
            halts.extend(self._container_halts(live, self.memory_reader()))
        return tuple(halts)

    def _container_halts(
        self, sessions: list[SessionWatch], reading: MemoryReading
    ) -> list[SessionHalt]:
        """While the working set in ``reading`` is at or above the critical watermark:
        halt the largest of ``sessions`` until what they free brings it under."""
        critical_percent = self.critical_watermark_percent
        percent, used, limit = reading.percent, reading.used_bytes, reading.limit_bytes
        if percent is None or used is None or limit is None or percent < critical_percent:
            return []
        critical_bytes = limit * critical_percent / 100
        freeing = sum(s.last_sample.rss_bytes for s in sessions if s.halt and s.last_sample)
        candidates = sorted(
            (s for s in sessions if s.halt is None and s.last_sample is not None),
            key=lambda s: s.last_sample.rss_bytes if s.last_sample else 0,
            reverse=True,
        )
        halts: list[SessionHalt] = []
        for session in candidates:
            if used - freeing < critical_bytes:
                break
            last = session.last_sample
            assert last is not None
            freeing += last.rss_bytes
            halts.append(
                self._halt(
                    session,
                    "container_headroom",
                    reading,
                    "The session was halted because the service ran short of memory "
                    f"({percent:.1f}% of its limit in use) and it was the largest session.",
                )
            )
        return halts

    def _memory_limit(self, session: SessionWatch) -> SessionHalt:
        """The kernel killed in the session's group: report it as a halt."""
        group = session.group
        assert group is not None
        peak = group.peak_bytes()
        budget = group.budget_bytes
        event = self._halt(
            session,
            "memory_limit",
            None,
            "The session was stopped because it reached its memory limit of "
            f"{budget / MIB:.0f} MiB.",
            group_peak_bytes=peak,
        )
        logger.warning(
            "Session %s (pid %d) reached the limit of its memory group %s: the kernel killed "
            "%d of its processes (budget %d bytes, group peak %s bytes, last RSS %d bytes).",
            session.session_id,
            session.pid,
            group.path,
            group.oom_kills(),
            budget,
            peak,
            event.rss_bytes,
        )
        return event

    def _halt(
        self,
        session: SessionWatch,
        reason: HaltReason,
        reading: MemoryReading | None,
        message: str,
        *,
        group_peak_bytes: int | None = None,
    ) -> SessionHalt:
        """Halt ``session`` for ``reason``: the event, its peak (before its process is
        signalled), its count and log line, then the halt action and ``on_halt``."""
        last = session.last_sample
        event = SessionHalt(
            session=session,
            reason=reason,
            rss_bytes=last.rss_bytes if last is not None else group_peak_bytes or 0,
            budget_bytes=session.budget_bytes,
            memory=reading,
            critical_watermark_percent=self.critical_watermark_percent,
            message=message,
            group_peak_bytes=group_peak_bytes,
        )
        session.halted(event)
        self._observe_peak(session)
        self._metrics.halted.labels(reason=reason).inc()
        if reason != "memory_limit":  # that one has a line of its own, with the group's figures
            logger.warning(
                "Halting session %s (pid %d, RSS %d bytes, budget %s): %s",
                session.session_id,
                session.pid,
                event.rss_bytes,
                session.budget_bytes,
                reason,
            )
        self._dispatch(self._action, event)
        if self._on_halt is not None:
            self._dispatch(self._on_halt, event)
        return event

    def _dispatch(self, callback: HaltAction, event: SessionHalt) -> None:
        """Call ``callback``; an awaitable it returns runs as a task of its own."""
        try:
            result = callback(event)
        except Exception:
            logger.exception("A halt callback failed for session %s.", event.session_id)
            return
        if result is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if inspect.iscoroutine(result):
                result.close()
            logger.error(
                "A halt callback for session %s returned an awaitable, but no event loop "
                "is running to await it.",
                event.session_id,
            )
            return
        task = loop.create_task(_await(result))
        self._halt_tasks.add(task)
        task.add_done_callback(self._halt_done)

    def _halt_done(self, task: asyncio.Task[Any]) -> None:
        self._halt_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("A halt callback failed.", exc_info=task.exception())

    @property
    def running(self) -> bool:
        """True between ``start()`` and ``stop()``."""
        return self._task is not None

    async def run(self) -> None:
        """Sample every ``interval_s`` until cancelled; ``start()`` runs this as a task.

        The measuring runs in one thread of its own, the decisions on the loop.
        """
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asgi-admission-watchdog")
        try:
            while True:
                started = self._clock()
                try:
                    sessions = self._watched()
                    if sessions:
                        measured = await loop.run_in_executor(
                            executor, self._measure, sessions, let_the_loop_run
                        )
                        self._decide(sessions, measured)
                except Exception:
                    logger.exception("The session watchdog's tick failed; it will try again.")
                await self._sleep(max(0.0, self.interval_s - (self._clock() - started)))
        finally:
            # A tick still measuring finishes in its thread; nothing waits for it.
            executor.shutdown(wait=False, cancel_futures=True)

    async def start(self) -> None:
        """Start sampling on the running event loop; a no-op if already started."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name="asgi-admission session watchdog"
            )

    async def stop(self) -> None:
        """Stop sampling and cancel pending halt work (a pending SIGKILL is sent at once).

        Registered sessions stay registered; their processes are the application's.
        """
        task, self._task = self._task, None
        pending = [*self._halt_tasks, *([task] if task is not None else [])]
        for item in pending:
            item.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self.session_groups.pending:
            await asyncio.to_thread(self.session_groups.retry)


# --------------------------------------------------------------------------------------
# One tick's measuring, safe in a thread (its deciding is ``SessionWatchdog._decide``).

#: A halted session that still runs, in a tick's measurements.
STILL: Final = "still running"
#: One session's measurement: the session, whether it was halted, its sample
#: (``None``: the process has gone; ``STILL``: halted and still running), and the OOM
#: kills counted in its memory group (0 without one).
Measured = tuple[SessionWatch, bool, "ProcessSample | str | None", int]


def measure(
    sessions: Sequence[SessionWatch],
    *,
    now: float,
    proc: str,
    session_groups: SessionGroups,
    pause: Callable[[], None] | None = None,
) -> list[Measured]:
    """The system calls of a tick, safe in a thread; ``pause`` is called between
    sessions and every few ``/proc`` entries."""
    children = (
        read_children_map(proc, pause=pause)
        if any(s.include_children and s.halt is None for s in sessions)
        else None
    )
    measured: list[Measured] = []
    for session in sessions:
        if pause is not None:
            pause()
        sampler = session.sampler
        assert sampler is not None  # only live sessions are in the table
        if session.ended:
            continue
        ooms = 0 if session.group is None else session.group.oom_kills()
        if session.halt is not None:  # only wait for it to go
            measured.append((session, True, None if not sampler.alive() else STILL, ooms))
            continue
        # A session registered under its ticket is measured by its own memory.
        unique = session.ticket is not None
        sample = sampler.sample(children if session.include_children else None, now, unique=unique)
        measured.append((session, False, sample, ooms))
    if session_groups.pending:
        session_groups.retry()
    return measured


async def _await(awaitable: Awaitable[None]) -> None:
    await awaitable
