"""Live reload (SIGHUP, ``systemctl reload``, ``POST /reload``): re-read and validate
the config, apply it or keep the running one. The engine never reads a config file;
this is where the file is re-read, on the controller's side of the contract."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from tuned import config as config_mod
from tuned.config import Config, ConfigError
from tuned.config.schema import restart_changes
from tuned.config.sources import reread

log = structlog.get_logger("tuned.controller")


class Reloadable(Protocol):
    cfg: Config

    def apply_config(self, new: Config) -> None:
        """Apply ``new`` all or nothing: on an exception the running objects are as
        they were."""
        ...


class Reloader:
    """Reloads are serialised from the file read on, under the controller's lock (two
    POSTs at once: the second reads the file after the first is applied, so the last
    file wins). Fields that size the engine (``[restart]`` in ``check-config
    --explain``) keep their running values and are reported as needing a restart."""

    def __init__(self, target: Reloadable, metrics: Any, lock: threading.RLock, *,
                 source: Callable[[], Config] | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.target = target
        self.metrics = metrics
        self.lock = lock
        self.source = source or self.read_config_file
        self.wall = wall
        self.last: dict = {"t": None, "outcome": "none", "problems": [],
                           "restart_needed": []}

    def read_config_file(self) -> Config:
        """The running config's file, re-read (the embedded default when it had none);
        dropped into a vLLM command line, its sources (:func:`tuned.config.sources.reread`)."""
        return reread(self.target.cfg)

    def reload(self) -> dict:
        with self.lock:
            return self._reload()

    def _reload(self) -> dict:
        now = self.wall()
        try:
            new = self.source()
        except ConfigError as e:
            return self._refuse(now, e.problems)
        except Exception as e:  # an unreadable file that load() did not turn into problems
            return self._refuse(now, [f"{type(e).__name__}: {e}"])
        old = self.target.cfg
        restart = restart_changes(old, new)
        if restart:
            # Keep the running engine's values for fields that size the engine.
            new = dataclasses.replace(new, **{n: getattr(old, n) for n in restart})
        changed = [n for n in config_mod.FIELDS if getattr(old, n) != getattr(new, n)]
        try:
            self.target.apply_config(new)   # all or nothing
        except Exception as e:  # a profile that fails to load, a policy that fails
            return self._refuse(now, [f"{type(e).__name__}: {e}"])
        self.last = {"t": now, "outcome": "ok", "problems": [],
                     "restart_needed": restart, "changed": changed}
        self.metrics.reloads.labels("ok").inc()
        log.info("reload_applied", changed=changed, restart_needed=restart,
                 source=new.source_path or "embedded default")
        return dict(self.last)

    def _refuse(self, now: float, problems: list[str]) -> dict:
        self.last = {"t": now, "outcome": "refused", "problems": problems,
                     "restart_needed": [], "changed": []}
        self.metrics.reloads.labels("refused").inc()
        log.warning("reload_refused", problems=problems,
                    kept=self.target.cfg.source_path or "embedded default")
        return dict(self.last)
