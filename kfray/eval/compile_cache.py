"""Content-addressed compile cache: a build is keyed by everything that can change its bytes.

Builds are written to a temporary name and renamed into place, so a crash never leaves a half
file under a valid key, and concurrent evaluators (or nodes sharing the folder) can race safely.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path


def default_root() -> Path:
    return Path(os.environ.get("KFRAY_CACHE") or Path.home() / ".cache" / "kfray")


class CompileCache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root else default_root()
        self.root.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(**parts) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]

    def path(self, key: str, suffix: str) -> Path:
        return self.root / key[:2] / f"{key}{suffix}"

    def lookup(self, key: str, suffix: str) -> Path | None:
        p = self.path(key, suffix)
        if p.exists():
            self.hits += 1
            return p
        self.misses += 1
        return None

    def temp_path(self, key: str, suffix: str) -> Path:
        p = self.path(key, suffix)
        p.parent.mkdir(parents=True, exist_ok=True)
        # Unique per process and thread (a GPU evaluator compiles on several threads); suffix last:
        # compilers read it.
        return p.with_name(f".{key}.{os.getpid()}.{threading.get_ident()}.tmp{suffix}")

    def commit(self, tmp: Path, key: str, suffix: str) -> Path:
        final = self.path(key, suffix)
        os.replace(tmp, final)
        return final

    def stats(self) -> dict:
        total = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hits / total if total else 0.0}
