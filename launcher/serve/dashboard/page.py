"""The dashboard's files, shipped inside the package (no CDN, no build step), and the wiring
page `topology check --html` writes: the same stylesheet and drawing code inlined into one
self-contained file, for a cluster that is not serving yet."""

from __future__ import annotations

import html
import json
from functools import cache
from importlib import resources
from typing import Any

# Every file the server hands out, by exact name: no path from a request reaches the disk.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "wiring.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "panels.js": "text/javascript; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
}


@cache
def static_file(name: str) -> bytes:
    """One of FILES (KeyError for any other name)."""
    if name not in FILES:
        raise KeyError(name)
    return (resources.files(__package__) / "static" / name).read_bytes()


def _script_json(value: Any) -> str:
    """JSON safe inside <script>: no `</script>` or `<!--` can close or open anything."""
    text = json.dumps(value, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
<style>
{css}
</style>
</head>
<body>
<header><h1>mlx-cluster</h1><span>{title}</span></header>
<main><section id="wiring-panel"><h2>Wiring</h2><div id="wiring"></div></section></main>
<script>
{wiring_js}
</script>
<script>
"use strict";
MLX.renderWiring(document.getElementById("wiring"), {data});
</script>
</body>
</html>
"""


def wiring_page(wiring: dict[str, Any], title: str) -> str:
    """One HTML file that draws `wiring` (wiring.py's object) with nothing to fetch."""
    return _PAGE.format(
        title=html.escape(title),
        css=static_file("style.css").decode(),
        wiring_js=static_file("wiring.js").decode(),
        data=_script_json(wiring),
    )
