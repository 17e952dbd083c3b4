"""The output path of a closed window: privacy, then either one packed file gathered to a leader
(rank 0, or the host's lowest rank: then also one upload for the host) or this rank's own file and
upload, written by a thread so a slow filesystem never stalls a step. Every failure is a gap;
nothing here raises into the training loop's caller."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from eroica.collector.gather import PatternGather
from eroica.collector.privacy import Privacy
from eroica.collector.sink import PatternSink
from eroica.collector.writer import PatternWriter
from eroica.schema.patterns import CollectorGap, PatternsDoc

log = logging.getLogger("eroica.collector")


def doc_text(doc: PatternsDoc) -> str:
    """The document as one JSON line, its own size stated inside it."""
    data = doc.model_dump(mode="json", by_alias=True)
    data["overhead"]["pattern_bytes"] = len(json.dumps(data, separators=(",", ":")).encode())
    return json.dumps(data, separators=(",", ":"))


class PatternOutput:
    """Where this rank's pattern documents go (one job: get a summarized window out, or say why not)."""

    def __init__(self, out_dir: Path, rank: int, privacy: Privacy | None, gather: PatternGather | None,
                 on_gap: Callable[[CollectorGap], None], sink: PatternSink | None = None) -> None:
        self.out_dir, self.rank = out_dir, rank
        self.privacy, self.gather, self.sink = privacy, gather, sink
        self._on_gap = on_gap
        self._writer: PatternWriter | None = None

    @property
    def keeps_names(self) -> bool:
        """Raw names may leave the process (a raw trace is kept only then)."""
        return self.privacy is None or self.privacy.level == "keep"

    def private(self, doc: PatternsDoc) -> PatternsDoc:
        return self.privacy.apply(doc) if self.privacy is not None else doc

    def publish(self, window_id: str, doc: PatternsDoc | None) -> bool:
        """Send (gather) or write this rank's document of the window; True when it left this rank.
        With a gather group every rank takes part, with or without a document."""
        wdir = self.out_dir / window_id
        if self.gather is not None:
            try:
                packed = self.gather.send(None if doc is None else doc_text(doc))
                if packed:       # the leader: one file, and one upload for all the ranks it gathered
                    self._submit(wdir / self.gather.packed_name, packed)
                    self._upload(window_id, packed, batch=True)
                return doc is not None
            except Exception as exc:
                self.gather.close()
                self.gather = None
                gap = CollectorGap(source="gather", reason=f"gathering patterns to the leader failed ({exc!r}); "
                                                           "writing and sending this rank's own"[:300])
                self._on_gap(gap)
                if doc is not None:      # the fallback file says so too
                    doc = doc.model_copy(update={"gaps": [*doc.gaps, gap]})
        if doc is None:
            return False
        self._upload(window_id, doc_text(doc), batch=False)
        self._submit(wdir / f"rank-{self.rank}.json", doc_text(doc))
        return True

    def _upload(self, window_id: str, text: str, batch: bool) -> None:
        if self.sink is None:
            return
        if not (self.sink.submit_batch(text) if batch else self.sink.submit(text)):
            self._on_gap(CollectorGap(source="sink", reason=f"{window_id}: not sent to {self.sink.url}, earlier "
                                                            "documents still pending (slow or unreachable service)"))

    def _submit(self, path: Path, text: str) -> None:
        if self._writer is None:
            self._writer = PatternWriter()
        if not self._writer.submit(path, text):
            self._on_gap(CollectorGap(source="write", reason=f"{path.parent.name}/{path.name}: patterns dropped, "
                                                             "earlier writes still pending (slow or hung filesystem)"))

    def errors(self) -> list[tuple[str, BaseException]]:
        out = self._writer.errors() if self._writer is not None else []
        if self.sink is not None:
            out += self.sink.errors()
        return out

    def close(self, timeout_seconds: float) -> None:
        if self.gather is not None:
            self.gather.close()
        if self.sink is not None and not self.sink.close(timeout_seconds):
            log.warning("eroica collector: documents for %s still pending after %.0f s; the job goes on without them",
                        self.sink.url, timeout_seconds)
        if self._writer is not None and not self._writer.close(timeout_seconds):
            log.warning("eroica collector: pattern writes still pending after %.0f s; the job goes on without them",
                        timeout_seconds)
