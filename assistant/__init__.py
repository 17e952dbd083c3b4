"""eroica.assistant: drafts code or config fixes for software findings, behind change control.

Not built yet (issue 6). It will read a Diagnosis and write change requests; it never applies
anything itself.
"""
