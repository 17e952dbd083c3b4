"""eroica.service: the online service (`eroica serve`). Ingests pattern documents (HTTP or a watched
run root), diagnoses each window as soon as it is complete, and serves the results (API, pages,
metrics). It sits above the engine; the collector never imports it."""
