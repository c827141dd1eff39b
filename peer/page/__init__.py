"""The swarm page every daemon serves at ``GET /``: static files, no build step, nothing from outside.

- ``index.html``  the run, the join command, the live peers, loss curves, ledgers, protocol panels.
- ``page.js``     polls this daemon's ``/status`` and ``/swarm`` only; checks and draws (curves as SVG).
- ``page.css``    its looks.
- ``figures``     what the page draws of a peer's ``/status``, checked and capped; where it is fetched."""
