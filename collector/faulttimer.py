"""faulthandler's one `dump_traceback_later` timer, shared between the hang watchdog's dead man's
switch (eroica.collector.hang) and the job's own code."""

from __future__ import annotations

import faulthandler
from collections.abc import Callable
from typing import Any


class TimerOwner:
    """faulthandler's one dump_traceback_later timer, shared with the job: while the watchdog runs,
    the module's functions are wrapped, so a call from the job's own code marks the timer as the
    job's and the watchdog stops re-arming it (and never cancels it)."""

    def __init__(self) -> None:
        self.user_armed = False
        self._orig: tuple[Callable[..., Any], Callable[..., Any]] | None = None

    def install(self) -> None:
        if self._orig is not None:
            return
        later, cancel = faulthandler.dump_traceback_later, faulthandler.cancel_dump_traceback_later
        self._orig = (later, cancel)
        me = self

        def user_later(*args: Any, **kwargs: Any) -> Any:
            me.user_armed = True
            return later(*args, **kwargs)

        def user_cancel(*args: Any, **kwargs: Any) -> Any:
            me.user_armed = True
            return cancel(*args, **kwargs)
        faulthandler.dump_traceback_later = user_later    
        faulthandler.cancel_dump_traceback_later = user_cancel

    def uninstall(self) -> None:
        if self._orig is not None:
            faulthandler.dump_traceback_later, faulthandler.cancel_dump_traceback_later = self._orig
            self._orig = None

    def arm(self, seconds: float, fd: int) -> None:
        later = self._orig[0] if self._orig is not None else faulthandler.dump_traceback_later
        later(seconds, repeat=False, file=fd)

    def cancel(self) -> None:
        (self._orig[1] if self._orig is not None else faulthandler.cancel_dump_traceback_later)()
