"""The hang watchdog's thread ends when it is stopped: a thread left inside a store call while
the interpreter finalises aborted ranks at exit (SIGABRT), rarely, under load."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

from runtime.watchdog import Watchdog


class SlowStore:
    """A store whose calls take a while, like a TCPStore under load."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.data: dict[str, str] = {}
        self.delay_s = delay_s
        self.calls = 0

    def set(self, key: str, value: str) -> None:
        time.sleep(self.delay_s)
        self.calls += 1
        self.data[key] = value

    def get(self, key: str) -> bytes:
        time.sleep(self.delay_s)
        return self.data[key].encode()


def test_stop_joins_the_thread():
    store = SlowStore()
    wd = Watchdog(store, 0, 2, hang_s=60.0, on_hang=lambda r, m: None, interval_s=0.01).start()
    deadline = time.time() + 30  # a loaded machine may run the thread late (CI: 1 call in 0.2 s)
    while store.calls < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert store.calls >= 2  # it publishes while running
    wd.stop()
    assert not wd._thread.is_alive()
    calls = store.calls
    time.sleep(0.1)
    assert store.calls == calls  # nothing more after stop()
    assert "devplace-watchdog" not in {t.name for t in threading.enumerate()}


def test_stop_twice_and_from_its_own_thread_is_harmless():
    seen = []
    wd = Watchdog(
        SlowStore(0.0), 1, 2, hang_s=0.0, on_hang=lambda r, m: seen.append(r), interval_s=0.01
    )
    wd.start()
    wd.arm()
    wd._beat -= 10  # this rank looks stuck: the thread calls on_hang once and ends itself
    deadline = time.time() + 5
    while wd._thread.is_alive() and time.time() < deadline:
        time.sleep(0.01)
    assert len(seen) == 1  # called once (rank 0 never published: it is named)
    wd.stop()
    wd.stop()
    assert not wd._thread.is_alive()


def test_a_process_leaving_with_a_running_watchdog_exits_cleanly():
    """Without stop(), the interpreter may finalise while the thread sits in a store call."""
    code = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from test_watchdog_exit import SlowStore
        from runtime.watchdog import Watchdog
        Watchdog(SlowStore(0.02), 0, 2, hang_s=60.0, on_hang=lambda r, m: None, interval_s=0.001).start()
        time.sleep(0.05)
        """
    )
    for _ in range(5):
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
