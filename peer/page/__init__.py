"""The swarm page every daemon serves at ``GET /``: static files, no build step, nothing from
outside (``http_api`` serves them from this package).

- ``index.html``  the page: the run and its protocol, the join command, the live peers, the loss
                  curves, the last ledgers and the protocol's panels (e.g. block coverage).
- ``page.js``     polls this daemon's ``/status`` and each live peer's, and draws the loss curves
                  as SVG (no chart library).
- ``page.css``    its looks.
"""
