"""The wire documents and their file conventions: what the collector writes, the service accepts and
the engine reads. It imports no other part of eroica, so each of them can depend on it alone.

- `patterns`: a rank's window of behavior patterns (`eroica.patterns/v1`), and its bounds;
- `hang`: a rank's hang snapshot (`eroica.hang/v1`) and the verdict on a hang;
- `steps`: the always-on step-time summary a job sends every N steps;
- `diagnosis`: the engine's answer (`eroica.diagnosis/v1`), with each window's history summary;
- `files`: the names of a run directory's files.
"""
