"""The tuning cache: an in-memory layer in front of an SQLite file.

The file lives in ``$CONVENGINE_CACHE_DIR`` or ``$XDG_CACHE_HOME/convengine`` (default
``~/.cache/convengine``), is opened in WAL mode with a busy timeout, and one short
connection serves each read or write, so several processes and threads can tune at
once. A file that is corrupt, unreadable, read-only or locked never fails a
convolution: the cache warns once (:class:`TuningCacheWarning`), leaves the file
untouched, and keeps results in memory for the rest of the process.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..problem import PASSES

DB_NAME = "tuning.sqlite3"
LOCK_TIMEOUT_S = 2.0  # how long a read or write waits for another process's lock
SCHEMA_VERSION = 1
EXPORT_FORMAT = "convengine-tuning-cache"

T = TypeVar("T")
Ident = tuple[str, str, str, str]  # (key, host, version, candidates)


class TuningCacheWarning(UserWarning):
    """The tuning cache file cannot be used; results stay in memory."""


def cache_dir() -> Path:
    """Where the cache file lives (``CONVENGINE_CACHE_DIR`` overrides)."""
    if os.environ.get("CONVENGINE_CACHE_DIR"):
        return Path(os.environ["CONVENGINE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "convengine"


@dataclass(frozen=True)
class Entry:
    """One tuning result: the problem class, where it is valid, every candidate's
    result (``{"median_s", "runs", "eliminated"}`` or ``{"error"}``) and the choice."""

    key: str
    pass_: str
    host: str
    version: str
    candidates: str
    choice: str
    results: dict[str, dict[str, Any]]
    problem: str
    created: float = field(default_factory=time.time)

    @property
    def ident(self) -> Ident:
        return (self.key, self.host, self.version, self.candidates)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "entry") -> Entry:
        """Validate a decoded JSON object; ValueError naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object, got {type(data).__name__}")
        for name in ("key", "pass_", "host", "version", "candidates", "choice", "problem"):
            if not isinstance(data.get(name), str):
                raise ValueError(
                    f"{where}: field {name!r} must be a string, got {data.get(name)!r}"
                )
        if data["pass_"] not in PASSES:
            raise ValueError(f"{where}: pass_ must be one of {PASSES}, got {data['pass_']!r}")
        results = data.get("results")
        if not isinstance(results, dict) or not results:
            raise ValueError(f"{where}: field 'results' must be a non-empty object")
        for name, r in results.items():
            ok = isinstance(r, dict) and (
                isinstance(r.get("error"), str)
                or (isinstance(r.get("median_s"), (int, float)) and math.isfinite(r["median_s"])
                    and r["median_s"] >= 0)
            )
            if not ok:
                raise ValueError(
                    f"{where}: results[{name!r}] must hold 'median_s' (seconds >= 0) or "
                    f"'error' (a string), got {r!r}"
                )
        if "median_s" not in results.get(data["choice"], {}):
            raise ValueError(f"{where}: choice {data['choice']!r} has no timing in 'results'")
        created = data.get("created", 0.0)
        if not isinstance(created, (int, float)):
            raise ValueError(f"{where}: field 'created' must be a number, got {created!r}")
        fields = {k: data[k] for k in ("key", "pass_", "host", "version", "candidates",
                                        "choice", "problem")}
        return cls(**fields, results=results, created=float(created))


_COLUMNS = "key, pass, host, version, candidates, choice, results, problem, created"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS tuning (
    key TEXT NOT NULL, pass TEXT NOT NULL, host TEXT NOT NULL, version TEXT NOT NULL,
    candidates TEXT NOT NULL, choice TEXT NOT NULL, results TEXT NOT NULL,
    problem TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (key, host, version, candidates)
)"""


def _row_to_entry(row: tuple[Any, ...]) -> Entry:
    key, pass_, host, version, candidates, choice, results, problem, created = row
    return Entry(key, pass_, host, version, candidates, choice, json.loads(results),
                 problem, created)


def _entry_to_row(e: Entry) -> tuple[Any, ...]:
    return (e.key, e.pass_, e.host, e.version, e.candidates, e.choice,
            json.dumps(e.results, sort_keys=True), e.problem, e.created)


class TuningCache:
    """Memory in front of the SQLite file at ``path`` (``None``: memory only)."""

    changes = 0  # puts and forgets of every cache: memos of choices compare it

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.failure: str | None = None  # why the file is not used, once it is not
        self._memory: dict[Ident, Entry] = {}
        self._absent: set[Ident] = set()
        self._lock = threading.Lock()
        self._schema_ok = False

    # ------------------------------------------------------------ the file

    def _connect(self) -> sqlite3.Connection:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=LOCK_TIMEOUT_S)
        try:
            if not self._schema_ok:
                tables = conn.execute(
                    "SELECT name FROM sqlite_master WHERE type='table' AND name='tuning'"
                ).fetchall()
                if not tables:
                    try:
                        conn.execute("PRAGMA journal_mode=WAL")
                    except sqlite3.OperationalError:
                        pass  # another connection is open: it has set WAL, or will
                    # the table and its version appear together, or not at all
                    conn.executescript(
                        f"BEGIN IMMEDIATE; {_SCHEMA}; PRAGMA user_version={SCHEMA_VERSION}; "
                        "COMMIT;"
                    )
                else:
                    (found,) = conn.execute("PRAGMA user_version").fetchone()
                    if found != SCHEMA_VERSION:
                        raise sqlite3.DatabaseError(
                            f"schema version {found}, this convengine reads {SCHEMA_VERSION}"
                        )
                self._schema_ok = True
        except BaseException:
            conn.close()
            raise
        return conn

    def _use_file(self, op: Callable[[sqlite3.Connection], T], default: T) -> T:
        """Run ``op`` on a fresh connection; on any failure warn once, return default."""
        if self.path is None or self.failure is not None:
            return default
        try:
            conn = self._connect()
            try:
                return op(conn)
            finally:
                conn.close()
        except (sqlite3.Error, OSError, ValueError) as exc:
            self._fail(exc)
            return default

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"convengine: the tuning cache {self.path} cannot be used ({self.failure}); "
            f"tuning results are kept in memory for this process only. The file was "
            f"left untouched; `convengine cache clear` resets it.",
            TuningCacheWarning,
            stacklevel=5,
        )

    # ------------------------------------------------------------ reads and writes

    def get(self, ident: Ident) -> Entry | None:
        """The entry for ``ident``: memory, else the file (remembered either way)."""
        with self._lock:
            if ident in self._memory:
                return self._memory[ident]
            if ident in self._absent:
                return None

        def read(conn: sqlite3.Connection) -> Entry | None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM tuning WHERE key=? AND host=? AND version=? "
                "AND candidates=?", ident,
            ).fetchone()
            return None if row is None else _row_to_entry(row)

        entry = self._use_file(read, None)
        with self._lock:
            if entry is None:
                self._absent.add(ident)
            else:
                self._memory[ident] = entry
        return entry

    def put(self, entries: Iterable[Entry]) -> None:
        """Store entries in memory and (if usable) in the file, replacing older ones."""
        entries = list(entries)
        with self._lock:
            for e in entries:
                self._memory[e.ident] = e
                self._absent.discard(e.ident)
            TuningCache.changes += 1

        def write(conn: sqlite3.Connection) -> None:
            with conn:
                conn.executemany(
                    f"INSERT OR REPLACE INTO tuning ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
                    [_entry_to_row(e) for e in entries],
                )

        self._use_file(write, None)

    def entries(self) -> list[Entry]:
        """Every entry, from the file and from memory, oldest first."""

        def read_all(conn: sqlite3.Connection) -> list[Entry]:
            return [_row_to_entry(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM tuning")]

        none: list[Entry] = []
        found = {e.ident: e for e in self._use_file(read_all, none)}
        with self._lock:
            found.update(self._memory)
        return sorted(found.values(), key=lambda e: (e.created, e.key))

    def forget(self) -> None:
        """Drop the memory layer (the file is read again on the next lookup)."""
        with self._lock:
            self._memory.clear()
            self._absent.clear()
            TuningCache.changes += 1

    def clear(self) -> str:
        """Delete every entry; a file that is not a usable database is removed.

        Returns one line saying what was done. Raises OSError / sqlite3.Error when
        the file exists but cannot be changed (read-only, locked)."""
        self.forget()
        if self.path is None or not self.path.exists():
            return "the tuning cache is empty"
        try:
            conn = sqlite3.connect(self.path, timeout=LOCK_TIMEOUT_S)
            try:
                with conn:
                    (n,) = conn.execute("SELECT count(*) FROM tuning").fetchone()
                    conn.execute("DELETE FROM tuning")
            finally:
                conn.close()
            self.failure, self._schema_ok = None, False
            return f"removed {n} entries from {self.path}"
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return "the tuning cache is empty"
            raise  # read-only, locked, ...: the caller reports it
        except sqlite3.DatabaseError as exc:  # not a database, or a malformed one
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self.failure, self._schema_ok = None, False
            return f"{self.path} was not a usable tuning database ({exc}); removed the file"
