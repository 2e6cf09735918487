"""``tide console``: a web console of a Tidewater cluster (issue 31).

One module per job:

- ``cluster_data``: what the pages show, gathered through Tidewater's own clients
  (``AdminClient``, ``GroupAdmin``, ``Consumer``) into plain dataclasses;
- ``records``: the record browser's reads and how a key, value or header is shown
  (text, pretty JSON or hex, long ones cut);
- ``metrics``: a background scraper of the brokers' Prometheus endpoints that keeps
  the last minutes of rates (bytes/s, requests/s, ISR shrinks, p99 latency);
- ``charts``: line charts drawn server-side as SVG (no script or asset from elsewhere);
- ``app``: the Starlette application, its routes and the admin actions behind
  ``--allow-writes``; ``templates/`` holds the pages and ``static/`` the console's own
  stylesheet and the small script that swaps live fragments in.

The command is ``tools/commands/console.py``.
"""
