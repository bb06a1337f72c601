"""ps-lite's Customer: a thread that runs the app's handler on each data message
the van receives (so a slow handler never blocks the van's receive loop), and
a tracker of how many responses each request timestamp still awaits.

Also `Fatal`: the first exception of any psbench thread, which wakes the main
thread wherever it waits, so a failure ends the process instead of hanging it.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable

from workloads.psbench.timing import set_thread_name


class Fatal:
    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._wakers: list[Callable[[], None]] = []

    def on_fail(self, waker: Callable[[], None]) -> None:
        self._wakers.append(waker)

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        for wake in self._wakers:
            wake()

    def check(self) -> None:
        if self.error is not None:
            raise self.error


class Customer:
    def __init__(self, app_id: int, customer_id: int, handle: Callable, fatal: Fatal):
        self.app_id, self.customer_id = app_id, customer_id
        self._handle = handle
        self._fatal = fatal
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._tracker: list[list[int]] = []  # per timestamp: [expected, received]
        self._done_below = 0
        self._cond = threading.Condition()
        fatal.on_fail(self._wake_all)
        self._thread = threading.Thread(target=self._receiving, name="ps-customer", daemon=True)
        self._thread.start()

    def _wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ps-lite Customer::NewRequest: timestamps count up from 0 per customer.
    def new_request(self, expected: int) -> int:
        with self._cond:
            self._tracker.append([expected, 0])
            return len(self._tracker) - 1

    def add_response(self, timestamp: int, count: int = 1) -> None:
        with self._cond:
            self._tracker[timestamp][1] += count
            self._cond.notify_all()

    def done(self, timestamp: int) -> bool:
        with self._cond:
            expected, received = self._tracker[timestamp]
            return received >= expected

    def wait_request(self, timestamp: int, timeout_s: float | None = None) -> bool:
        """True once every response of `timestamp` arrived; False on timeout."""
        with self._cond:
            t = self._tracker[timestamp]
            ok = self._cond.wait_for(lambda: t[1] >= t[0] or self._fatal.error is not None, timeout_s)
        self._fatal.check()
        return ok

    def outstanding(self) -> list[int]:
        with self._cond:
            # Every timestamp below the watermark is done: scan only the rest.
            while self._done_below < len(self._tracker) and \
                    self._tracker[self._done_below][1] >= self._tracker[self._done_below][0]:
                self._done_below += 1
            return [ts for ts in range(self._done_below, len(self._tracker))
                    if self._tracker[ts][1] < self._tracker[ts][0]]

    def accept(self, msg) -> None:
        self._queue.put(msg)

    def _receiving(self) -> None:
        set_thread_name("ps-customer")
        try:
            while (msg := self._queue.get()) is not None:
                self._handle(msg)
                if not msg.meta.request:
                    self.add_response(msg.meta.timestamp)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            self._fatal.fail(e)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()
