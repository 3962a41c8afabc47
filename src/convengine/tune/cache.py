"""The tuning cache: an in-memory layer in front of an SQLite file.

The file lives in ``$CONVENGINE_CACHE_DIR`` or ``$XDG_CACHE_HOME/convengine`` (default
``~/.cache/convengine``), is opened in WAL mode with a busy timeout, and one short
connection serves each read or write, so several processes and threads can tune at
once. A file on a read-only directory or mount (a cache shipped with a deployment) is
opened immutable and read; new results stay in memory. Rows that are not what
convengine wrote are ignored with one warning. A file that is corrupt, unreadable
or locked never fails a convolution: the cache warns once
(:class:`TuningCacheWarning`), leaves the file untouched, and keeps results in
memory for the rest of the process.
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
    """The entry a row holds; ValueError if it is not one convengine wrote (valid
    SQLite, but say ``results='[1, 2, 3]'``, ``null`` or a string median)."""
    key, pass_, host, version, candidates, choice, results, problem, created = row
    try:
        decoded = json.loads(results)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"row {key!r}: results are not JSON ({exc})") from None
    return Entry.from_json({"key": key, "pass_": pass_, "host": host, "version": version,
                            "candidates": candidates, "choice": choice, "results": decoded,
                            "problem": problem, "created": created}, f"row {key!r}")


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
        self._bad_rows = False  # warned about rows convengine did not write

    # ------------------------------------------------------------ the file

    @property
    def read_only(self) -> bool:
        """The file (or its directory) cannot be written: it is opened immutable, so
        a pre-tuned cache shipped on a read-only mount is read (WAL mode would need
        to write its ``-shm`` file), and new results stay in memory."""
        assert self.path is not None
        if self.path.exists():
            return not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK))
        parent = next((p for p in self.path.parents if p.exists()), self.path.parent)
        return not os.access(parent, os.W_OK)

    def _connect(self) -> sqlite3.Connection:
        assert self.path is not None
        if self.read_only:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?immutable=1", uri=True,
                                   timeout=LOCK_TIMEOUT_S)
            try:
                (found,) = conn.execute("PRAGMA user_version").fetchone()
                if found != SCHEMA_VERSION:
                    raise sqlite3.DatabaseError(
                        f"schema version {found}, this convengine reads {SCHEMA_VERSION}")
            except BaseException:
                conn.close()
                raise
            return conn
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
        if self.read_only and not self.path.exists():
            return default  # nothing to read, nowhere to write
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

    def _entry(self, row: tuple[Any, ...]) -> Entry | None:
        """The row's entry, or None (warned once) if convengine did not write it."""
        try:
            return _row_to_entry(row)
        except ValueError as exc:
            with self._lock:
                warned, self._bad_rows = self._bad_rows, True
            if not warned:
                warnings.warn(
                    f"convengine: the tuning cache {self.path} holds entries convengine "
                    f"did not write ({exc}); they are ignored (`convengine cache clear` "
                    "removes them)", TuningCacheWarning, stacklevel=4)
            return None

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
            return None if row is None else self._entry(row)

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

        if not self.read_only:
            self._use_file(write, None)

    def entries(self) -> list[Entry]:
        """Every entry, from the file and from memory, oldest first."""

        def read_all(conn: sqlite3.Connection) -> list[Entry]:
            found = (self._entry(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM tuning"))
            return [e for e in found if e is not None]

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
        """Delete every entry; a file that is not a usable convengine database is
        removed. Returns one line saying what was done; raises OSError with a clear
        message when the file cannot be changed (a directory, read-only, locked)."""
        self.forget()
        if self.path is None or not self.path.exists():
            return "the tuning cache is empty"
        if self.path.is_dir():
            raise OSError(f"{self.path} is a directory, not a tuning cache: remove it or "
                          "point CONVENGINE_CACHE_DIR elsewhere")
        try:
            n = self._delete_all()
        except sqlite3.OperationalError as exc:
            raise OSError(f"cannot clear {self.path} ({exc}): is it read-only, unreadable "
                          "or in use?") from None
        except (sqlite3.DatabaseError, ValueError) as exc:  # not ours, malformed, ...
            try:
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            except OSError as err:
                raise OSError(f"{self.path} is not a usable tuning database ({exc}) and "
                              f"cannot be removed ({err})") from None
            self.failure, self._schema_ok, self._bad_rows = None, False, False
            return f"{self.path} was not a usable tuning database ({exc}); removed the file"
        self.failure, self._schema_ok, self._bad_rows = None, False, False
        return f"removed {n} entries from {self.path}"

    def _delete_all(self) -> int:
        """Delete every row; DatabaseError if the file is not a sound convengine
        cache (then it is removed instead)."""
        assert self.path is not None
        conn = sqlite3.connect(self.path, timeout=LOCK_TIMEOUT_S)
        try:
            (check,) = conn.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {check}")
            tables = {name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables:
                return 0
            (found,) = conn.execute("PRAGMA user_version").fetchone()
            if tables != {"tuning"} or found != SCHEMA_VERSION:
                raise sqlite3.DatabaseError(
                    f"tables {sorted(tables)}, schema version {found}: not convengine's")
            with conn:
                (n,) = conn.execute("SELECT count(*) FROM tuning").fetchone()
                conn.execute("DELETE FROM tuning")
            return int(n)
        finally:
            conn.close()
