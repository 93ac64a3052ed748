"""Answers changed on purpose: injected faults and latency (:mod:`.faults` parses what is asked,
:mod:`.injection` applies it per call)."""
