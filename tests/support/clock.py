"""A clock the reboot sequence's waits read and sleep on, moved by the test instead of by time."""

from __future__ import annotations


class Clock:
    """``clock()`` is now; ``clock.sleep(s)`` moves now by ``s`` at once."""

    now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
