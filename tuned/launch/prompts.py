"""Prompts of an exact token length for an OpenAI-compatible server, shared by
``tuned profile`` and ``tuned bench --engine vllm``."""

from __future__ import annotations

import random
import threading

_WORDS = ("time person year way day thing man world life hand part child eye woman place "
          "work week case point government company number group problem fact river stone "
          "light music paper window garden table market letter story engine cloud signal "
          "7 42 1999 3.14 alpha beta gamma delta , . ; ( ) + - = ? !").split()


class PromptFactory:
    """Token-length-controlled prompts: lists of token ids sent directly as the
    completions ``prompt`` (vLLM accepts token ids), drawn at random from a pool of
    ids the server's tokenizer produces, so no two prompts share a prefix (which
    would let prefix caching skip their prefill)."""

    def __init__(self, pool: list[int], seed: int = 0):
        if not pool:
            raise ValueError("empty token pool")
        self.pool = pool
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def make(self, n_tokens: int) -> list[int]:
        with self._lock:
            return [self._rng.choice(self.pool) for _ in range(n_tokens)]

    @classmethod
    def from_server(cls, base_url: str, model: str, vocab_size: int | None = None,
                    seed: int = 0, session=None) -> "PromptFactory":
        """Pool from the server's ``/tokenize`` of a word list; if that endpoint fails,
        the middle of the vocabulary (or ids 100-999). ``session``: a ``requests``
        session or module (default ``requests``)."""
        if session is None:
            import requests as session
        text = " ".join(random.Random(seed).choices(_WORDS, k=600))
        try:
            r = session.post(f"{base_url}/tokenize", json={"model": model, "prompt": text,
                                                           "add_special_tokens": False},
                             timeout=30)
            r.raise_for_status()
            pool = sorted(set(int(t) for t in r.json()["tokens"]))
            if len(pool) >= 16:
                return cls(pool, seed)
        except Exception:  # any failure: fall back to an id range
            pass
        if vocab_size and vocab_size > 64:
            return cls(list(range(vocab_size // 10, vocab_size * 9 // 10)), seed)
        return cls(list(range(100, 1000)), seed)
