"""A new Prefect home's database seeded from a kept, migrated copy (core.prefect_seed).

Real SQLite files, and real local Prefect APIs (flows.local_api) on new homes: the first
keeps its database, the next starts on it. The audit: every place that starts a Prefect
server seeds.
"""

from __future__ import annotations

import ast
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.prefect_seed import database_file, keep, seed, seed_for_start, template_path
from tests.code_tree import REPO, python_files


def _database(path: Path, *, revision: str | None = "abc123", rows: int = 3) -> Path:
    """A SQLite database in WAL mode, as Prefect leaves one: an Alembic revision, a table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        if revision is not None:
            db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
            db.execute("INSERT INTO alembic_version VALUES (?)", (revision,))
        db.execute("CREATE TABLE block_type (id TEXT, name TEXT)")
        db.executemany("INSERT INTO block_type VALUES (?, ?)",
                       [(f"id-{i}", f"type-{i}") for i in range(rows)])
        db.commit()
    return path


def _rows(path: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return list(db.execute("SELECT id, name FROM block_type ORDER BY id"))


_segment = st.text(st.characters(codec="ascii", categories=["L", "N"], include_characters="-_."),
                   min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))
_absolute = st.lists(_segment, min_size=1, max_size=5).map(lambda parts: "/" + "/".join(parts))


@given(path=_absolute, driver=st.sampled_from(["sqlite", "sqlite+aiosqlite", "sqlite+pysqlite"]))
def test_a_sqlite_url_names_its_file(path: str, driver: str) -> None:
    assert database_file(f"{driver}:///{path}") == Path(path)
    assert database_file(f"{driver}:///{path}?timeout=30") == Path(path)


@given(path=_absolute)
def test_other_databases_and_unplaced_files_name_none(path: str) -> None:
    relative = path.lstrip("/")
    for url in (f"postgresql+asyncpg://user:pw@host:5432{path}", f"mysql:///{path}",
                f"sqlite:///{relative}", "sqlite+aiosqlite:///:memory:", "sqlite://",
                f"sqlite:///{path}?mode=memory&cache=shared", relative):
        assert database_file(url) is None, url


def test_the_first_new_database_is_kept_and_the_next_new_home_seeded_with_it(
        tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _database(tmp_path / "home-a" / "prefect.db")
    assert keep(first, cache)
    template = template_path(cache)
    assert template is not None and template.is_file()
    assert _rows(template) == _rows(first)

    second = tmp_path / "home-b" / "prefect.db"
    assert seed(second, cache)
    assert [p.name for p in second.parent.iterdir()] == ["prefect.db"]  # nothing staged left
    assert _rows(second) == _rows(first)

    # a template already there stays as it is; a later database is not kept over it
    assert not keep(_database(tmp_path / "home-c" / "prefect.db", rows=7), cache)
    assert _rows(template) == _rows(first)


def test_a_server_start_keeps_what_it_migrated_and_only_that(tmp_path: Path) -> None:
    """`seed_for_start`: before the server starts, then once it answers."""
    cache = tmp_path / "cache"
    first = tmp_path / "home-a" / "prefect.db"
    keep_template = seed_for_start(first, cache)  # no template: this server migrates
    _database(first)  # ... as it does while it starts
    assert keep_template() and _rows(template_path(cache)) == _rows(first)
    second = tmp_path / "home-b" / "prefect.db"
    keep_template = seed_for_start(second, cache)
    assert _rows(second) == _rows(first)  # seeded before the server started
    assert not keep_template()  # a seeded database is not kept again
    existing = _database(tmp_path / "home-c" / "prefect.db", rows=5)
    assert not seed_for_start(existing, cache)() and _rows(existing) != _rows(first)
    assert not seed_for_start(None, cache)()  # another database: nothing, either side

def test_a_database_a_client_already_used_is_never_kept(tmp_path: Path) -> None:
    """Two servers on one new home: the second's client may write before the first keeps
    its copy. Rows beyond the migrations' and the block types' mean it is not new."""
    used = _database(tmp_path / "home" / "prefect.db")
    with closing(sqlite3.connect(used)) as db:
        db.execute("CREATE TABLE flow_run (id TEXT)")
        db.execute("CREATE TABLE log (id TEXT)")  # empty: no objection
        db.execute("INSERT INTO flow_run VALUES ('a run')")
        db.commit()
    cache = tmp_path / "cache"
    assert not keep(used, cache)
    template = template_path(cache)
    assert template is not None and not template.exists()
    assert not any(template.parent.iterdir())  # nothing staged left either


def test_a_database_that_exists_is_never_touched(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert keep(_database(tmp_path / "a" / "prefect.db"), cache)
    own = _database(tmp_path / "b" / "prefect.db", rows=9)
    before = own.read_bytes()
    assert not seed(own, cache)
    assert own.read_bytes() == before
    # a database whose main file is gone but whose write-ahead log is there: left alone
    orphan = tmp_path / "c" / "prefect.db"
    orphan.parent.mkdir()
    Path(f"{orphan}-wal").write_bytes(b"")
    assert not seed(orphan, cache) and not orphan.exists()


@pytest.mark.parametrize("broken", ["garbage", "no revision", "truncated"])
def test_a_broken_template_is_never_used(tmp_path: Path, broken: str) -> None:
    cache = tmp_path / "cache"
    template = template_path(cache)
    assert template is not None
    if broken == "garbage":
        template.parent.mkdir(parents=True)
        template.write_bytes(b"SQLite format 3\0" + bytes(range(256)) * 40)
    elif broken == "no revision":
        _database(template, revision=None)
    else:
        _database(tmp_path / "whole.db", rows=2000)
        template.parent.mkdir(parents=True)
        template.write_bytes((tmp_path / "whole.db").read_bytes()[:6000])
    target = tmp_path / "home" / "prefect.db"
    assert not seed(target, cache)
    assert not target.exists()  # the server will migrate it, as without a template


def test_nothing_is_seeded_without_a_database_file_or_a_template(tmp_path: Path) -> None:
    assert not seed(None, tmp_path / "cache")
    assert not seed(tmp_path / "home" / "prefect.db", tmp_path / "empty-cache")
    assert not keep(None, tmp_path / "cache")
    assert not keep(tmp_path / "missing.db", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_the_template_is_keyed_by_prefect_and_sqlite() -> None:
    import importlib.metadata

    template = template_path(Path("/cache"))
    assert template is not None and template.parent == Path("/cache")
    assert f"prefect-{importlib.metadata.version('prefect')}-sqlite-{sqlite3.sqlite_version}-" \
        in template.name


@pytest.mark.slow
def test_a_new_home_is_seeded_with_the_database_the_first_server_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first server on a new home migrates its database and keeps a copy before any
    client knows it (core.prefect_seed); the next new home starts on that copy — the same
    block types, ids and all, where a migration would have made new ones — and serves."""
    from flows.local_api import shared_api, stop
    from tests.servers.prefect_server import api_call

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # its own templates
    monkeypatch.delenv("PREFECT_API_URL", raising=False)

    def rows(db: Path, query: str) -> list[tuple[str, ...]]:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as opened:
            return list(opened.execute(query))

    block_types = "SELECT id, slug FROM block_type ORDER BY slug"
    template = template_path(tmp_path / "cache" / "telltale" / "prefect-db")
    assert template is not None
    first, second = tmp_path / "first", tmp_path / "second"
    try:
        monkeypatch.setenv("TELLTALE_PREFECT_API_HOME", str(first))
        with shared_api() as used:
            assert api_call(used.url, "POST", "/flows/", {"name": "on-the-first"})["id"]
        kept = rows(template, block_types)
        assert len(kept) > 10, kept  # Prefect's own block types, registered at its start
        assert rows(template, "SELECT name FROM flow") == []  # kept before any client
        monkeypatch.setenv("TELLTALE_PREFECT_API_HOME", str(second))
        with shared_api() as used:
            assert rows(second / "prefect.db", block_types) == kept
            flow = api_call(used.url, "POST", "/flows/", {"name": "on-the-second"})
            assert api_call(used.url, "GET", f"/flows/{flow['id']}")["name"] == "on-the-second"
    finally:
        stop(first)
        stop(second)


# --- the audit ----------------------------------------------------------------------------

def _starts_a_server(tree: ast.AST) -> bool:
    """Whether code starts a Prefect server: ``prefect server start`` in an argv list, or
    Prefect's app factory (``create_app``, ``...server:create_app`` for uvicorn)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.List):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if any(words[i:i + 2] == ["server", "start"] for i in range(len(words))):
                return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.endswith(":create_app"):
            return True
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "create_app":
            return True
    return False


def _seeds(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.Call)
               and getattr(node.func, "id", "") in ("seed", "seed_for_start")
               for node in ast.walk(tree))


def _candidates() -> list[Path]:
    files = [path for _, path in python_files()]
    for extra in ("tests", "benchmarks"):
        files += sorted((REPO / extra).rglob("*.py"))
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def test_every_prefect_server_start_seeds_its_database() -> None:
    starters = {}
    for path in _candidates():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if _starts_a_server(tree):
            starters[path.relative_to(REPO).as_posix()] = _seeds(tree)
    # the audit sees the starts there are (a scan that finds none proves nothing)
    assert {"flows/local_api.py", "flows/api_server.py",
            "tests/servers/prefect_server.py"} <= set(starters), starters
    assert [name for name, seeds in starters.items() if not seeds] == [], (
        "a Prefect server started without core.prefect_seed.seed on its database")


def test_the_audit_sees_each_kind_of_start() -> None:
    for source in ('subprocess.Popen([sys.executable, "-m", "prefect", "server", "start"])',
                   'argv = ["uvicorn", "--factory", "prefect.server.api.server:create_app"]',
                   "app = create_app()"):
        assert _starts_a_server(ast.parse(source)), source
        assert not _seeds(ast.parse(source))
    assert not _starts_a_server(ast.parse('run(["prefect", "worker", "start"])'))
    assert _seeds(ast.parse("seed(db)\napp = create_app()"))
    assert _seeds(ast.parse("keep_template = seed_for_start(db)\napp = create_app()"))
