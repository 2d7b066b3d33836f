"""Reporting any study from its run folders: what finished runs hold (:mod:`.results`), the
declared claims evaluated with their verdicts (:mod:`.claims`), the one report writer
(:mod:`.report`, with the sections of a Table 1 suite in :mod:`.table1` and :mod:`.epochs`, and
those of a grid), the one figure writer (:mod:`.figures`). Nothing here trains."""
