"""A throwaway PostgreSQL server for the tests: ``initdb`` and ``pg_ctl`` from Debian's
packages (``.ci/run`` installs them where absent), on a free port of 127.0.0.1, with
password (SCRAM) logins over TCP, stopped and removed when the test module is done.

Run as root (as CI is), the server runs as the ``postgres`` user Debian's package made
(PostgreSQL refuses to run as root). Its processes carry the test's tag
(``flower_processes.TAG_VAR``), so the leak check of ``conftest.py`` finds one left behind.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import flower_processes as fp

ADMIN = "fedcluster_admin"
ADMIN_PASSWORD = "admin-secret-not-a-site-password"


def server_bin() -> Path:
    """The directory of ``initdb`` and ``pg_ctl``: on PATH, else the newest
    ``/usr/lib/postgresql/*/bin``."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if not versions:
        raise RuntimeError("the PostgreSQL server (initdb, pg_ctl) is not installed: "
                           "apt-get install postgresql (.ci/run does where it is absent)")
    return versions[-1].parent


@dataclass
class PgServer:
    """A running server: its port, and the admin's connection."""

    directory: Path
    port: int
    bin: Path
    user: str | None  # the OS user it runs as (None: this process's)
    env: dict

    def url(self, user: str, database: str, password: str | None = None) -> str:
        who = user if password is None else f"{user}:{password}"
        return f"postgresql+psycopg://{who}@127.0.0.1:{self.port}/{database}"

    def admin(self, database: str = "postgres", autocommit: bool = True):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=ADMIN,
                               password=ADMIN_PASSWORD, dbname=database, autocommit=autocommit)

    def create_site(self, name: str, password: str) -> str:
        """A database ``name`` owned by a login role ``name`` with ``password``; returns
        the database's URL (without the password)."""
        with self.admin() as conn:
            conn.execute(f'CREATE ROLE "{name}" LOGIN PASSWORD %s'.replace("%s", _literal(password)))
            conn.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
        return self.url(name, name)

    def _run(self, *argv: str) -> None:
        subprocess.run([str(self.bin / argv[0]), *argv[1:]], check=True, env=self.env,
                       user=self.user, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run("pg_ctl", "stop", "-D", str(self.directory / "data"), "-m", "immediate",
                      "-w", "-t", "30")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@contextlib.contextmanager
def pg_server():
    """Start a server (about 2 s); yield a :class:`PgServer`; stop it and remove its files."""
    binary = server_bin()
    user = None
    directory = Path(tempfile.mkdtemp(prefix="fcpg-", dir="/tmp"))  # short: its socket is here
    if os.geteuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    env = fp.child_env(fp.new_tag(), LC_ALL="C.UTF-8")
    env.pop("PGPASSWORD", None)
    env.pop("PGPASSFILE", None)
    port = fp.free_port()
    server = PgServer(directory, port, binary, user, env)
    password_file = directory / "admin-password"
    password_file.write_text(ADMIN_PASSWORD + "\n")
    if user is not None:
        shutil.chown(password_file, user)
    try:
        server._run("initdb", "-D", str(directory / "data"), "-U", ADMIN, "--pwfile",
                    str(password_file), "--auth-local=scram-sha-256",
                    "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")
        options = (f"-c listen_addresses=127.0.0.1 -c port={port} "
                   f"-c unix_socket_directories={directory} -c fsync=off "
                   "-c full_page_writes=off -c synchronous_commit=off -c max_connections=40 "
                   "-c log_line_prefix=%d:")  # a logged statement names its database
        server._run("pg_ctl", "start", "-D", str(directory / "data"), "-w", "-t", "60",
                    "-l", str(directory / "server.log"), "-o", options)
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
