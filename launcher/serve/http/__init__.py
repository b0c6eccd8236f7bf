"""The HTTP side of `mlx-cluster serve`: a Starlette app under uvicorn, in a thread of the
launcher. app.py has every route, the key check and the counting; answers.py answers generate
requests (whole or as server-sent events, withdrawn when the client leaves); errors.py shapes
every error as the route's API's error object; server.py runs uvicorn on its socket.
Admission: up to --max-concurrency requests decode at once and --max-queue more wait on rank 0;
beyond that, 429 at once (both SDKs retry 429 by themselves).
"""

from launcher.serve.http.app import ServeApp
from launcher.serve.http.server import HttpServer

__all__ = ["HttpServer", "ServeApp"]
