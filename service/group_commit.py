"""Group commit: uploads that arrive while another is being written are written together, in one
transaction, by one of their request threads.

Each upload's fixed cost of storing (a transaction, a round trip per statement, the run's and the
window's rows) is the same for one host's 8 documents as for 64, so on a busy service most of it
goes to the database's and the driver's overhead. Here the first request thread to find no write
in progress becomes the writer: it takes every waiting upload (up to MAX_GROUP_DOCUMENTS, none
holding a rank of a window another one of the group holds) and writes them with
eroica.service.bulk.write, then the next group, until its own is written; it then hands the
writing over to the first thread still waiting, or ends it. A request is answered only after its
own documents are committed, as before.

A group is all or nothing: when it is refused (a document differs from the one stored for its rank,
a world size differs from the run's) or fails, each of its uploads is written again alone, so each
request gets its own answer and no upload pays for another's refusal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from eroica.service.bulk import BulkIngested, Prepared

MAX_GROUP_DOCUMENTS = 1024       # documents per group transaction (an upload larger than this goes alone)


@dataclass(eq=False)
class _Slot:
    upload: Prepared
    written: threading.Event = field(default_factory=threading.Event)
    result: BulkIngested | None = None
    error: BaseException | None = None
    writes_next: bool = False    # handed the writing while it waited

    def outcome(self) -> BulkIngested:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class GroupCommit:
    """Writes uploads through `write(group) -> results` (one transaction, results in order), grouped."""

    def __init__(self, write: Callable[[list[Prepared]], list[BulkIngested]],
                 max_documents: int = MAX_GROUP_DOCUMENTS) -> None:
        self._write = write
        self._max = max_documents
        self._lock = threading.Lock()
        self._waiting: list[_Slot] = []
        self._writing = False
        self.groups = 0              # transactions written, and the uploads in them (for metrics and tests)
        self.uploads = 0

    def submit(self, upload: Prepared) -> BulkIngested:
        """Store `upload` (with whatever else is waiting); its result, or its refusal raised."""
        slot = _Slot(upload)
        with self._lock:
            self._waiting.append(slot)
            writer = not self._writing
            self._writing = True
        if not writer:
            slot.written.wait()
            if not slot.writes_next:
                return slot.outcome()
        try:
            while slot.result is None and slot.error is None:
                self._write_group()
        finally:
            with self._lock:
                # (only when writing failed before this upload's turn: it is answered by that failure)
                self._waiting = [s for s in self._waiting if s is not slot]
                if self._waiting:
                    nxt = self._waiting[0]
                    nxt.writes_next = True
                    nxt.written.set()
                else:
                    self._writing = False
        return slot.outcome()

    def _take(self) -> list[_Slot]:
        """The waiting uploads to write now, in arrival order: no two with a rank of the same window."""
        with self._lock:
            group: list[_Slot] = []
            keys: set[tuple[str, str, int]] = set()
            docs = 0
            for s in self._waiting:
                if group and (docs + s.upload.size > self._max or not keys.isdisjoint(s.upload.keys)):
                    continue
                group.append(s)
                keys |= s.upload.keys
                docs += s.upload.size
            taken = set(map(id, group))
            self._waiting = [s for s in self._waiting if id(s) not in taken]
        return group

    def _write_group(self) -> None:
        group = self._take()
        try:
            if len(group) > 1:
                try:
                    results = self._write([s.upload for s in group])
                except Exception:    # noqa: BLE001  (one upload's refusal: each is written alone, below)
                    results = None
                if results is not None:
                    for s, r in zip(group, results, strict=True):
                        s.result = r
                    self.groups += 1
                    self.uploads += len(group)
                    return
            for s in group:
                try:
                    s.result = self._write([s.upload])[0]
                except BaseException as exc:  # noqa: BLE001  (the request's own answer: raised in its thread)
                    s.error = exc
                self.groups += 1
                self.uploads += 1
        except BaseException as exc:  # noqa: BLE001  (never leave a request waiting)
            for s in group:
                if s.result is None and s.error is None:
                    s.error = exc
            raise
        finally:
            for s in group:
                if not s.writes_next:
                    s.written.set()
