"""Waking another worker at once: a Unix datagram socket for each worker of the waiting order.

A worker whose waiter is the container's first must run its pass as soon as capacity
frees in another worker, or the waiter ahead of it (in another worker) is admitted or
leaves. Looking at the shared files every so often would cost a wait of up to the look's
interval; instead the worker that sees it happen rings the first waiter's worker, whose
event loop wakes on the ring at once (docs/configuration.md, "Waiting and priority").

Notes:

- A worker that claims a slot in the waiting order binds
  ``<shared_dir>/asgi-admission.wake.<slot>``: non-blocking and close-on-exec, mode
  0600 in the private shared directory, read on its event loop (``loop.add_reader``).
  Whatever arrives is drained at once and the wait queue woken: one pass however many
  rings came.
- A ring is one byte sent with ``MSG_DONTWAIT`` from an unbound socket: it never
  blocks. A full socket (that worker has rings unread already), one gone, or one not
  bound yet is ignored; the periodic look of each worker with waiters stays the
  fallback (``capacity_wait.FreedWatch``).
- A ring must not come before what it tells of: this worker's release is written to
  the shared ledger on its loop's next turn, unless another worker holds the ledger
  in that instant. So before each ring ``flush`` (the ledger's non-blocking critical
  section, whose end writes what is pending) is tried; where the ledger is held
  elsewhere, the ring is tried again a few milliseconds later, a few times at most.
- Named after the slot, not the pid: the worker claiming a slot holds its lock, so a
  file of that name is a dead worker's, and is replaced. A dead worker's file is
  removed by whoever finds its slot dead with waiters (holding that slot's lock), or
  by the next worker to claim the slot: at most one file per slot is ever left.
- The byte carries nothing: whoever may write to the socket (this user alone) can
  only make that worker run a pass, which decides nothing it would not decide anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import weakref
from collections.abc import Callable
from typing import Final

logger = logging.getLogger("asgi_admission")

#: The wake sockets' names in the shared directory: this, then the slot's number.
WAKE_PREFIX: Final = "asgi-admission.wake."
#: Rings read at most in one go; more are read on the loop's next turn.
_DRAIN: Final = 64
#: A ring put off while the ledger is held elsewhere: tried again after this, at most
#: ``_RETRIES`` times, and then sent all the same (the worker rung reads the ledger as it
#: is by then; what it cannot see yet, its periodic look finds).
RETRY_S: Final = 0.002
_RETRIES: Final = 25


class OrderBell:
    """This worker's wake socket in ``directory`` and its rings to the others' (see the
    module notes); ``on_ring`` is called on the loop when this worker is rung, and
    ``flush`` before each ring: it writes this worker's pending changes to the shared
    ledger and says whether it could (``False``: the ledger is held elsewhere)."""

    __slots__ = (
        "__weakref__",
        "_bound",
        "_flush",
        "_loop",
        "_on_ring",
        "_open",
        "_pid",
        "_sender",
        "_slot",
        "_socket",
        "_warned",
        "directory",
    )

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        on_ring: Callable[[], None] | None = None,
        flush: Callable[[], bool] | None = None,
    ) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self._flush = flush
        #: The socket file this worker bound (device, inode): only that one is its to remove.
        self._bound: tuple[int, int] | None = None
        #: Told on the loop when another worker rings this one (the wait queue's wake).
        self._on_ring = on_ring
        self._socket: socket.socket | None = None
        self._sender: socket.socket | None = None
        self._slot = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()
        self._warned = False
        # The sockets open now, closed with the bell where nobody closed it (a guard
        # never shut down): a file descriptor is not left to the garbage collector.
        self._open: list[socket.socket] = []
        weakref.finalize(self, _close_all, self._open)

    def tell_rings(self, on_ring: Callable[[], None]) -> None:
        """Call ``on_ring`` on the loop when another worker rings this one: for a bell
        built before what it wakes (the wait queue is built with the order it rings)."""
        self._on_ring = on_ring

    def path(self, slot: int) -> str:
        """The wake socket of the worker holding ``slot`` of the waiting order."""
        return os.path.join(self.directory, f"{WAKE_PREFIX}{slot}")

    @property
    def slot(self) -> int:
        """The slot whose socket this worker listens on (-1: none)."""
        return self._slot

    def bind(self, slot: int) -> None:
        """This worker has just claimed ``slot`` (and holds its lock): listen on its
        socket, on the running event loop, replacing a dead worker's file of that name.
        Where it cannot (no loop, a path too long for a socket), it is logged once and
        this worker is found by the others' periodic looks instead."""
        self.close(unlink=False)
        loop = asyncio._get_running_loop()
        if loop is None:
            return  # nothing would read it: the next claim, on a loop, binds
        path = self.path(slot)
        listener = self._new_socket()
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a dead worker's: this slot's lock is ours
            listener.bind(path)
            os.chmod(path, 0o600)
            made = os.stat(path)
            loop.add_reader(listener.fileno(), self._heard)
        except (OSError, NotImplementedError) as exc:
            self._drop(listener)
            with contextlib.suppress(OSError):
                os.unlink(path)
            if not self._warned:
                self._warned = True
                logger.warning(
                    "asgi-admission: the wake socket %s cannot be used (%s); this worker's "
                    "waiters are found by its periodic look instead (within a quarter of a "
                    "second) when capacity frees in another worker.",
                    path,
                    exc,
                )
            return
        self._socket, self._slot, self._loop = listener, slot, loop
        self._bound = (made.st_dev, made.st_ino)

    def ring(self, slot: int, tries: int = 0) -> None:
        """Wake the worker holding ``slot``: one byte, never blocking, never raising; put
        off a little while ``flush`` finds the ledger held elsewhere (module notes),
        ``tries`` times so far."""
        if self._flush is not None and not self._flush():
            loop = asyncio._get_running_loop()
            if loop is not None and tries < _RETRIES:
                loop.call_later(RETRY_S, self.ring, slot, tries + 1)
                return
        # Full, gone, not bound yet, or no socket to send from (out of descriptors): the
        # periodic look serves.
        with contextlib.suppress(OSError):
            sender = self._sender
            if sender is None or self._pid != os.getpid():
                self._pid = os.getpid()
                sender = self._sender = self._new_socket()
            sender.sendto(b"\0", socket.MSG_DONTWAIT, self.path(slot))

    def unlink(self, slot: int) -> None:
        """Remove the wake socket of a dead worker's ``slot`` (its lock held by the caller)
        where nobody listens on it: in a file replaced meanwhile, the slot's lock says
        nothing of the socket a worker of the new file bound under that name."""
        if slot == self._slot:
            return
        path = self.path(slot)
        with (
            contextlib.suppress(OSError),
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe,
        ):
            try:
                probe.connect(path)  # a live worker's: it stays
            except ConnectionRefusedError:
                os.unlink(path)  # bound by nobody now

    def close(self, *, unlink: bool = True) -> None:
        """Stop listening; ``unlink``: remove this worker's socket file too (not where the
        slot may be another worker's by now, as after following a replaced file)."""
        listener, self._socket = self._socket, None
        slot, self._slot = self._slot, -1
        loop, self._loop = self._loop, None
        if listener is None:
            return
        if loop is not None and not loop.is_closed():
            loop.remove_reader(listener.fileno())
        bound, self._bound = self._bound, None
        if unlink:
            path = self.path(slot)
            with contextlib.suppress(OSError):
                now = os.stat(path)
                if (now.st_dev, now.st_ino) == bound:  # not a file another worker made since
                    os.unlink(path)
        self._drop(listener)

    def forget(self) -> None:
        """In a forked child: the parent's socket is the parent's (neither read nor
        removed here); the child binds its own when it claims a slot."""
        _close_all(self._open)
        self._socket = self._sender = None
        self._slot = -1
        self._loop = None
        self._pid = os.getpid()

    def _new_socket(self) -> socket.socket:
        made = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        self._open.append(made)
        return made

    def _drop(self, sock: socket.socket) -> None:
        self._open.remove(sock)
        sock.close()

    def _heard(self) -> None:
        listener = self._socket
        if listener is None:
            return
        for _ in range(_DRAIN):
            try:
                listener.recv(16)
            except OSError:  # drained (BlockingIOError) or closed meanwhile
                break
        if self._on_ring is not None:
            self._on_ring()


def _close_all(sockets: list[socket.socket]) -> None:
    while sockets:
        sockets.pop().close()
