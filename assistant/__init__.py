"""eroica.assistant: drafts code or config fixes for software findings, behind change control.

It reads a Diagnosis and writes one change request per finding (`draft.draft_all`): a code diff or
a config change drafted from the remediation templates (`backends.offline`) or by a model behind an
OpenAI-compatible API (`backends.llm`), checked by the gate (`gate`: scope, compile, deny-list, the
repository's validation in a sandbox), or a ticket for people. It never applies anything itself.
"""
