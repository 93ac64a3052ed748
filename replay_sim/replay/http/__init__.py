"""The HTTP door: the ASGI app (:mod:`.app`), ``/mcp/<server>`` routing (:mod:`.router`), the raw fast
path (:mod:`.fastpath`), admission (:mod:`.admission`), JSON-or-stream responses (:mod:`.responses`),
the admin API (:mod:`.api`, :mod:`.episodes_api`, :mod:`.coverage`), the dashboard (``static/``),
uvicorn (:mod:`.runner`) and in-process serving for trainers (:mod:`.serving`)."""
