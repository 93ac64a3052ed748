"""The stdio door: one client over this process's stdin/stdout (:mod:`.serve`), its fast path
(:mod:`.fastpath`) and the start table that answers before the replay is loaded (:mod:`.start`)."""
