"""Native threads that keep entering Python for the first time, as gloo's threads do."""

from __future__ import annotations

import ctypes
import threading


class Chains:
    """``count`` chains of native threads, running until :meth:`stop`.

    Each thread enters Python once (ctypes gives it a fresh thread state: CPython takes its
    ``HEAD_LOCK`` without the GIL and links the state into the interpreter's list), starts the
    next thread of its chain and ends.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._stop = threading.Event()
        self._ended = threading.Semaphore(0)
        self._libc = ctypes.CDLL(None)
        self._routine = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(self._next)
        for _ in range(count):
            self._next(None)

    def _next(self, _: object) -> None:
        if self._stop.is_set():
            self._ended.release()  # no native thread of this chain enters Python after this one
            return
        thread = ctypes.c_ulong()
        self._libc.pthread_create(ctypes.byref(thread), None, self._routine, None)
        self._libc.pthread_detach(thread)

    def stop(self, timeout: float) -> bool:
        """Stop every chain; whether each ended within ``timeout`` seconds."""
        self._stop.set()
        return all(self._ended.acquire(timeout=timeout) for _ in range(self.count))
