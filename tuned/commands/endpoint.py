"""A running tuned's endpoint as `tuned status` and `tuned reload` reach it: the default
URL, a URL as the operator gives it made the endpoint's base, and the one error both
commands answer with."""

from __future__ import annotations

import urllib.request

from tuned.commands.lines import EXIT_INVALID

DEFAULT_URL = "http://127.0.0.1:9464"


class EndpointError(Exception):
    """Why the endpoint could not be asked, with the exit code it ends the command with."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def base_url(url: str) -> str:
    """``127.0.0.1:9464``, ``http://h:9464/`` or ``http://h:9464/decisions`` -> ``http://h:9464``."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    if not url.lower().startswith(("http://", "https://")):
        raise EndpointError(EXIT_INVALID, f"bad URL {url!r}: tuned's endpoint speaks http")
    url = url.rstrip("/")
    for suffix in ("/decisions", "/metrics"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


# Status asks a local daemon: never route it through an HTTP proxy from the environment.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
