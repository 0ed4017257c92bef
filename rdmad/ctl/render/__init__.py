"""Text for people: the API's documents (docs/API.md) as tables and lines, one module
per document.

Pure functions from a document (and the time now) to lines, so the golden tests
pin exactly what an operator reads. Every text entry point starts with
``formats.printable``: names, holders' ``comm``, reasons and errors come from others.

* ``formats``: colour, terminal-safe strings, times and values, the aligned table;
* ``status``: ``GET /v1/status``, and the answer to ``reload``/``reconcile``;
* ``plan``: ``GET /v1/plan`` and ``rdmad plan``'s own plan;
* ``history``: ``GET /v1/history`` and the ``/v1/events`` stream (``watch``);
* ``config``: ``GET /v1/config``;
* ``saved``: the state file, for ``status`` when the daemon is down.
"""
