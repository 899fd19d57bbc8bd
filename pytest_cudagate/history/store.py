"""The history file: SQLite (the standard library's ``sqlite3``), safe with several writers.

The file says what it is in its header: ``application_id`` marks a cudagate history and
``user_version`` the layout's version, so a file of anything else, or one written by a newer
cudagate, is refused before anything in it is touched. Writers share the file through WAL and a busy
timeout; each record is one ``BEGIN IMMEDIATE`` transaction that inserts what is not there yet, so
a report recorded twice, or by two jobs at once, is stored once. Every SQLite failure becomes one
line naming the file.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import astuple, fields
from pathlib import Path

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.history import rows
from pytest_cudagate.history.model import Commit, History, Result, Run
from pytest_cudagate.host.paths import display_path

APPLICATION_ID = 0x63676874  # "cght": a cudagate history
SCHEMA_VERSION = 1
DEFAULT_LOCK_TIMEOUT_S = 30.0  # a record takes milliseconds; a writer still busy after this is stuck

_TABLES = (
    """CREATE TABLE commits (sha TEXT PRIMARY KEY, branch TEXT, committed TEXT, subject TEXT,
       at TEXT NOT NULL)""",  # at: the commit time, else the first run's: what orders the commits
    "CREATE TABLE tags (sha TEXT NOT NULL REFERENCES commits(sha), tag TEXT NOT NULL, PRIMARY KEY (sha, tag))",
    """CREATE TABLE runs (id TEXT PRIMARY KEY, sha TEXT NOT NULL REFERENCES commits(sha), created TEXT NOT NULL,
       host TEXT NOT NULL, fingerprint TEXT, fingerprint_description TEXT, release INTEGER NOT NULL,
       tool_version TEXT NOT NULL, report TEXT NOT NULL, recorded TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)""",
    """CREATE TABLE results (run TEXT NOT NULL REFERENCES runs(id), suite TEXT NOT NULL, kernel TEXT NOT NULL,
       "case" TEXT NOT NULL, shape_class TEXT NOT NULL, status TEXT NOT NULL, verdict TEXT NOT NULL,
       advisory INTEGER NOT NULL, threshold REAL, approved_us REAL, current_us REAL NOT NULL, level_us REAL,
       ratio REAL, low REAL, high REAL, confidence REAL, suite_path TEXT, approved_sha256 TEXT, approved_at TEXT,
       PRIMARY KEY (run, suite, kernel, "case"))""",
    # Each approvals ledger blob read from git once: kernel -> [source sha256, approved at].
    "CREATE TABLE ledgers (blob TEXT PRIMARY KEY, approvals TEXT NOT NULL)",
)
_RESULT_COLUMNS = ", ".join(f'"{f.name}"' if f.name == "case" else f.name for f in fields(Result))
_RUN_COLUMNS = ", ".join(f.name for f in fields(Run))


def _explain(path: Path, exc: sqlite3.Error, timeout_s: float) -> str:
    name = display_path(path)
    code = getattr(exc, "sqlite_errorname", "")  # Python 3.11+; 3.10 has the message alone
    text = str(exc)
    if code == "SQLITE_NOTADB" or "not a database" in text:
        return (f"{name}: not a SQLite database, so not a cudagate history (left as it is); pass --db with the "
                "history's path")
    if _busy(exc) or code.startswith("SQLITE_LOCKED"):
        return (f"{name}: the history is locked by another writer for more than {timeout_s:g} s; run again once it "
                "has finished, or give it longer with --lock-timeout")
    if code.startswith("SQLITE_CANTOPEN") or "unable to open" in text:
        return f"{name}: cannot open the history ({text}); check that its folder exists and can be written"
    return f"{name}: cannot use the history: {text}"


@contextmanager
def _one_line(path: Path, timeout_s: float) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise CudagateError(_explain(path, exc, timeout_s)) from None


def _state(conn: sqlite3.Connection, path: Path) -> str:
    """``"fresh"`` (an empty file: a history is created in it) or ``"ours"``; anything else is refused."""
    application = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    name = display_path(path)
    if application == 0 and version == 0 and not tables:
        return "fresh"
    if application != APPLICATION_ID:
        held = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise CudagateError(f"{name}: a SQLite database of something else (tables: {held or 'none'}), not a cudagate "
                            "history (left as it is); pass --db with the history's path")
    if version > SCHEMA_VERSION:
        raise CudagateError(f"{name}: written by a newer cudagate (history schema {version}; this one reads up to "
                            f"{SCHEMA_VERSION}), left as it is; upgrade: pip install -U pytest-cudagate")
    if version < SCHEMA_VERSION:
        raise CudagateError(f"{name}: history schema {version} is not one any cudagate wrote; pass --db with the "
                            "history's path")
    return "ours"


class Store:
    """An open history; :func:`writing` and :func:`reading` make one."""

    def __init__(self, conn: sqlite3.Connection, path: Path, timeout_s: float, fresh: bool):
        self.conn, self.path, self.timeout_s = conn, path, timeout_s
        self.fresh = fresh  # no tables yet (when opened)
        self.notes: list[str] = []  # what was repaired while reading, for the user

    def ledger(self, blob: str) -> dict[str, tuple[str, str | None]] | None:
        """The approvals of a ledger blob read before, or None: not read yet, or a row that is not what
        :meth:`save` writes (git is read again, and :meth:`save` replaces the row)."""
        if self.fresh:
            return None
        with _one_line(self.path, self.timeout_s):
            row = self.conn.execute("SELECT approvals FROM ledgers WHERE blob = ?", (blob,)).fetchone()
        if row is None:
            return None
        try:
            approvals = json.loads(row[0]) if isinstance(row[0], str) else None
        except ValueError:  # RecursionError included
            approvals = None
        if isinstance(approvals, dict) and all(
                isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                and isinstance(pair[1], (str, type(None))) for pair in approvals.values()):
            return {kernel: tuple(pair) for kernel, pair in approvals.items()}
        self.notes.append(f"{display_path(self.path)}: table ledgers, blob {blob[:12]}: not the approvals a history "
                          "holds; read again from git, and the row replaced")
        return None

    def save(self, commit: Commit, runs: Iterable[Run], results: Iterable[Result],
             release_tags: Mapping[str, Iterable[str]], ledgers: Mapping[str, Mapping[str, tuple]]) -> int:
        """Add what is not stored yet, in one transaction; returns the results added. ``release_tags``:
        every release tag the repository has, by commit, stored for the commits recorded (this one and
        earlier ones tagged since); ``ledgers``: approvals of ledger blobs read for this record."""
        runs, results = list(runs), list(results)
        with _one_line(self.path, self.timeout_s):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                if _state(self.conn, self.path) == "fresh":  # checked again under the lock: another writer may have won
                    for table in _TABLES:
                        self.conn.execute(table)
                    self.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                at = commit.committed or min(run.created for run in runs)
                self.conn.execute(
                    "INSERT INTO commits VALUES (?, ?, ?, ?, ?) ON CONFLICT (sha) DO UPDATE SET "
                    "branch = coalesce(excluded.branch, branch), committed = coalesce(excluded.committed, committed), "
                    "subject = coalesce(excluded.subject, subject), at = coalesce(excluded.committed, at)",
                    (commit.sha, commit.branch, commit.committed, commit.subject, at))
                tagged = [(sha, tag) for sha, tags in release_tags.items() for tag in tags]
                self.conn.executemany("INSERT OR IGNORE INTO tags SELECT sha, ? FROM commits WHERE sha = ?",
                                      [(tag, sha) for sha, tag in tagged])
                self.conn.executemany(f"INSERT OR IGNORE INTO runs ({_RUN_COLUMNS}, sha) VALUES "
                                      f"({', '.join('?' * (len(fields(Run)) + 1))})",
                                      [(*astuple(run), commit.sha) for run in runs])
                before = self.conn.total_changes
                self.conn.executemany(f"INSERT OR IGNORE INTO results ({_RESULT_COLUMNS}) VALUES "
                                      f"({', '.join('?' * len(fields(Result)))})", [astuple(r) for r in results])
                added = self.conn.total_changes - before
                # replaces a row ledger() could not use: only blobs read from git now are given
                self.conn.executemany("INSERT OR REPLACE INTO ledgers VALUES (?, ?)",
                                      [(blob, json.dumps(dict(approvals), sort_keys=True))
                                       for blob, approvals in ledgers.items()])
                self.conn.execute("COMMIT")
                self.fresh = False  # the tables exist now: later reads of this open history query them
            except BaseException:
                if self.conn.in_transaction:  # SQLite may have rolled back already (a full disk, a crash of its own)
                    self.conn.execute("ROLLBACK")
                raise
        return added

    def history(self, suite: str | None = None, kernel: str | None = None, last: int | None = None) -> History:
        """The commits that have results (of ``suite``/``kernel`` where given), oldest first, the ``last``
        N of them where given, with their entries."""
        if self.fresh:
            return History((), ())
        with _one_line(self.path, self.timeout_s):
            def table(columns, rest: str, *parameters) -> list[tuple]:
                return self.conn.execute(f"SELECT {rows.select(columns)} FROM {rest}", parameters).fetchall()

            tables = rows.Tables(
                tags=table(rows.TAGS, "tags ORDER BY tag"), commits=table(rows.COMMITS, "commits ORDER BY at, rowid"),
                runs=table(rows.RUNS, "runs"),
                results=table(rows.RESULTS, "results WHERE (?1 IS NULL OR suite = ?1) AND (?2 IS NULL OR kernel = ?2) "
                                            "ORDER BY suite, kernel, \"case\"", suite, kernel))
        commits, by_commit, skipped = tables.entries(display_path(self.path))
        kept = [commit for sha, commit in commits.items() if sha in by_commit]
        kept = kept[-last:] if last else kept
        return History(tuple(kept), tuple(entry for commit in kept for entry in
                                          sorted(by_commit[commit.sha], key=lambda e: (e.run.created, e.run.id))),
                       skipped)


def _connect(target: str, path: Path, timeout_s: float) -> sqlite3.Connection:
    with _one_line(path, timeout_s):
        # isolation_level None: transactions are the explicit BEGIN IMMEDIATE / COMMIT of Store.save
        return sqlite3.connect(target, timeout=timeout_s, isolation_level=None, uri=True)


def _busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorname", "").startswith("SQLITE_BUSY") or "locked" in str(exc)


def _wal(conn: sqlite3.Connection, path: Path, timeout_s: float) -> None:
    """Switch the file to WAL (it stays so). SQLite answers the switch with "locked" at once, without
    waiting for the busy timeout, while another connection holds a lock (two writers creating a new
    history): retried here until the timeout, as is an answer of another mode. The deadline is checked
    on every try: an in-memory database answers "memory" for ever."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() > deadline:
                raise
            mode = None
        if mode == "wal":
            return
        if mode is not None and (mode == "memory" or time.monotonic() > deadline):
            raise CudagateError(f"{display_path(path)}: SQLite cannot keep the history there in WAL mode (it answers "
                                f"journal mode {mode[:20]!r}), which several writers need; pass --db with a file on a "
                                "local disk")
        time.sleep(0.005)


@contextmanager
def writing(path: Path, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[Store]:
    """The history at ``path`` (created, with its folder, where there is none), checked and in WAL mode."""
    path = Path(path)
    if str(path) == ":memory:" or str(path).startswith("file:"):
        raise CudagateError(f"{display_path(path)}: SQLite reads this name as an in-memory database or a URI, not a "
                            "file, and a history must outlive the command; pass --db with the history file's path")
    if path.is_dir():
        raise CudagateError(f"{display_path(path)}: a folder, not a history file; pass --db with a file's path")
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = _connect(f"{path.resolve().as_uri()}?mode=rwc", path, timeout_s)  # the name as a file's, always
    try:
        with _one_line(path, timeout_s):
            fresh = _state(conn, path) == "fresh"  # before anything is written: a foreign or newer file stays as it is
            _wal(conn, path, timeout_s)
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL: a commit survives the process, and costs no fsync
        yield Store(conn, path, timeout_s, fresh)
    finally:
        conn.close()


@contextmanager
def reading(path: Path, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[Store]:
    """The history at ``path``, opened read-only (nothing is created)."""
    path = Path(path)
    if not path.is_file():
        raise CudagateError(f"{display_path(path)}: no history here; record one with `cudagate history record "
                            "REPORT_DIR`, or pass --db with the history's path")
    conn = _connect(f"{path.resolve().as_uri()}?mode=ro", path, timeout_s)
    try:
        with _one_line(path, timeout_s):
            fresh = _state(conn, path) == "fresh"
        yield Store(conn, path, timeout_s, fresh)
    finally:
        conn.close()
