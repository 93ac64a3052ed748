"""The replay's core: one replayed call answered, whatever door it came through.

:mod:`.replay` (the :class:`~replay_sim.replay.core.replay.Replay` holding what answering reads),
:mod:`.answering` (resolve, refuse, miss policy, re-enact, advance the episode), :mod:`.prepared`
(exact and canonical hits as prepared bytes), :mod:`.checks` (the SDK's request checks done cheaply,
for the doors' fast paths), :mod:`.histories` and :mod:`.episodes` (whose history a call extends),
:mod:`.surface` (a recorded server's face), :mod:`.server` and :mod:`.wire` (the SDK server built over
it), :mod:`.provenance` (replies and their ``_meta``), :mod:`.conversation` (notifications and questions
re-enacted), :mod:`.keeper` (the misses kept), :mod:`.connections` (whose connection a request is on),
:mod:`.misses` (the miss-policy extension point) and :mod:`.shaper` (what shaping offers answering).

The core imports no door (``http``, ``stdio``), no miss policy and no shaping: those are handed in.
"""
