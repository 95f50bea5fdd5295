"""Throwaway shared servers for the `server` tests: a PostgreSQL cluster, and an MLflow tracking server and a
Prefect server on it.

They stand in for the engines a team moves to when one machine is outgrown (Optuna, MLflow and Prefect's
server on a shared database server), so those tests run the same tqc code against the real thing rather
than SQLite. They need
PostgreSQL's own `initdb` and `pg_ctl` on the machine (Debian's postgresql package puts them under
/usr/lib/postgresql/<version>/bin) and a Python driver (`pip install -e '.[server]'`); without either the
tests are skipped, never faked; a cluster or server that is installed but does not start is an error, with its
log. PostgreSQL refuses to run as root, so under root the cluster runs as the `postgres` system user (through
`runuser`); without one the tests are skipped too.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


class ServerUnavailable(Exception):
    """This machine cannot run the server; the tests that need it are skipped with this reason."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A local port that takes connections (into the kernel's backlog) and never says a word: a server half up, or a
    proxy in front of one that is down. Yields the port."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        yield silent.getsockname()[1]


def _postgres_bin() -> Path:
    """The folder with initdb and pg_ctl: PATH's first, else Debian's newest /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb")
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: _version(Path(p).parent.name), reverse=True)
    for directory in ([Path(found).parent] if found else []) + [Path(p) for p in debian]:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    raise ServerUnavailable("PostgreSQL's initdb and pg_ctl are not on this machine")


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def _as_cluster_user() -> list[str]:
    """The command prefix that runs a PostgreSQL program as a user it accepts (not root)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        raise ServerUnavailable("running as root without runuser: PostgreSQL will not start as root")
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError as error:
        raise ServerUnavailable("running as root and there is no `postgres` user to run the cluster as") from error
    return ["runuser", "-u", "postgres", "--"]


@contextlib.contextmanager
def postgres_cluster(user: str = "tqc", attempts: int = 3) -> Iterator[str]:
    """A fresh cluster on a free local port with trust authentication; yields its base URL
    (`postgresql://tqc@127.0.0.1:PORT`), to which a database name is appended. Stopped and removed after.

    Only a machine without PostgreSQL (or without a driver, or a user to run it as) is a skip; a cluster
    that is there but does not start is an error, with its log."""
    try:
        import psycopg2  # noqa: F401  (the driver SQLAlchemy picks for postgresql:// URLs)
    except ImportError as error:
        raise ServerUnavailable("no PostgreSQL driver: pip install -e '.[server]'") from error
    bin_dir, prefix = _postgres_bin(), _as_cluster_user()
    # Not under pytest's tmp_path: its parent is private to root, and the cluster user must reach the folder.
    root = Path(tempfile.mkdtemp(prefix="tqc-postgres-"))
    root.chmod(0o755)
    if prefix:
        shutil.chown(root, "postgres")
    data = root / "data"
    pg_ctl = lambda *args: subprocess.run([*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), *map(str, args)],  # noqa: E731
                                          capture_output=True, text=True)
    try:
        subprocess.run([*prefix, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", user],
                       check=True, capture_output=True, text=True)
        port = _start_on_a_free_port(pg_ctl, root, attempts)
        yield f"postgresql://{user}@127.0.0.1:{port}"
    finally:
        pg_ctl("-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


def _start_on_a_free_port(pg_ctl, root: Path, attempts: int) -> int:
    """Another process may take the port between free_port() and the server's bind: then try another."""
    log = root / "server.log"
    for _ in range(attempts):
        port = free_port()
        started = pg_ctl("-l", log, "-w", "start",
                         "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off")
        if started.returncode == 0:
            return port
        if "already in use" not in log.read_text():
            break
    raise RuntimeError(f"PostgreSQL did not start: {started.stderr.strip()}\n{log.read_text()[-2000:]}")


def create_database(base_url: str, name: str) -> str:
    """A new, empty database on the cluster; returns its URL. `name` (a test's tmp_path name, say) is
    folded to lower case with `_` for `-`, so the URL needs no quoting."""
    import psycopg2

    name = name.lower().replace("-", "_")
    connection = psycopg2.connect(f"{base_url}/postgres")
    connection.autocommit = True  # CREATE DATABASE cannot run inside a transaction
    try:
        with connection.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
    finally:
        connection.close()
    return f"{base_url}/{name}"


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: Path, startup_seconds: float = 120.0) -> Iterator[str]:
    """`mlflow server` on a backend store with proxied artifacts, as a team runs it; yields its http URL.

    Its job runner is off: tqc submits no jobs, and its consumer processes outlive the server (and each
    start leaves a folder in /dev/shm)."""
    command = lambda port: [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,  # noqa: E731
                            "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(port),
                            "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with _http_server("mlflow server", command, "/health", env, artifacts.parent, startup_seconds) as url:
        yield url


@contextlib.contextmanager
def prefect_server(database_url: str, home: Path, startup_seconds: float = 180.0) -> Iterator[str]:
    """`prefect server start` on a PostgreSQL database (`postgresql+asyncpg://…`), as docs/retrain.md runs a shared
    one; yields its API URL. Its own PREFECT_HOME under `home`, no UI, no telemetry."""
    command = lambda port: [str(Path(sys.executable).parent / "prefect"), "server", "start",  # noqa: E731
                            "--host", "127.0.0.1", "--port", str(port), "--no-ui"]
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}  # a server, not a client
    env |= {"PREFECT_SERVER_DATABASE_CONNECTION_URL": database_url, "PREFECT_HOME": str(home / "prefect-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    with _http_server("prefect server", command, "/api/health", env, home, startup_seconds) as url:
        yield f"{url}/api"


@contextlib.contextmanager
def _http_server(name: str, command, health_path: str, env: dict, log_dir: Path, startup_seconds: float,
                 attempts: int = 3) -> Iterator[str]:
    """Runs `command(port)` in its own process group (stopped whole after) until `health_path` answers 200;
    yields its base http URL. Another process may take the port between free_port() and the server's bind:
    then it tries another."""
    for attempt in range(attempts):
        port = free_port()
        log = log_dir / f"{name.replace(' ', '-')}-{port}.log"
        with log.open("w") as log_file:
            server = subprocess.Popen(command(port), stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            try:
                _wait_healthy(name, url + health_path, server, log, startup_seconds)
            except RuntimeError:
                if attempt < attempts - 1 and "already in use" in log.read_text():
                    continue
                raise
            yield url
            return
        finally:
            _stop_group(server)


def _stop_group(server: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _wait_healthy(name: str, health_url: str, server: subprocess.Popen, log: Path, startup_seconds: float) -> None:
    deadline = time.monotonic() + startup_seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{name} exited with {server.returncode}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(health_url, timeout=2) as response:
                if response.status == 200:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"{name} not healthy after {startup_seconds:.0f} s:\n{log.read_text()[-2000:]}")
