"""The cluster dashboard of `mlx-cluster serve` (GET /): the state object (state.py) built from
the facts, plan, metrics and event log serve already keeps, its stream (stream.py), the last
minute's latency windows (window.py), the charts' history (series.py), the event log
(events.py), the wiring as JSON (wiring.py) and the page's files (static/, page.py), which
`topology check --html` also uses. The routes are launcher/serve/http/dashboard.py."""
