"""A test helper that runs in a daemon thread while its ``with`` block lasts (watchers, monitors, job enders)."""

from __future__ import annotations

import threading


class Background:
    """Subclasses write ``_run``, which loops until ``self._stop`` is set; ``with`` starts it and stops it."""

    join_timeout = 30.0

    def __init__(self, name: str | None = None):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.join_timeout)
