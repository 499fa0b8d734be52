"""A private app registry that speaks Flower Hub's protocol, and the signing of app bundles.

A SuperNode started with ``--trusted-entities FILE`` runs only FABs signed by a key in
that file. Flower 1.39 attaches signatures to a FAB only when the SuperLink fetches it from
"Flower Hub", for a run started by app spec (``flwr run @account/app==x.y.z``); the Hub is
whatever ``FLWR_SUPERGRID_API_URL`` names in the SuperLink's environment. This is a Hub of
the coordinator's own, with the two endpoints the SuperLink calls:

- ``POST /v1/hub/fetch-fab`` ``{"app_id", "app_version", "flwr_version"}`` -> ``{"fab_url",
  "verifications": [{"public_key_id", "signature", "signed_at"}]}``;
- ``GET /v1/fabs/<account>/<app>/<version>.fab`` (the ``fab_url``): the FAB.

On disk: ``<dir>/<account>/<app>/<version>.fab`` and ``<version>.signatures.json``. The
signature is made with Flower's own helpers, as ``flwr app review`` signs and the
SuperNode's ``_verify_fab`` checks: Ed25519 over ``signed_at`` (8 bytes, big-endian) and
the FAB's SHA-256 digest. The procedure: docs/how-to/signed-apps.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from flwr.common.config import get_fab_config, get_metadata_from_config
from flwr.supercore.constant import APP_ID_PATTERN, APP_VERSION_PATTERN
from flwr.supercore.primitives.asymmetric_ed25519 import (
    create_message_to_sign,
    load_private_key,
    sign_message,
)

log = logging.getLogger("fedcluster.app_registry")

API_PREFIX = "/v1"  # as in Flower's default FLWR_SUPERGRID_API_URL, https://api.flower.ai/v1
FAB_PATH = re.compile(r"^/fabs/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)/(\d+\.\d+\.\d+)\.fab$")
RESERVED_KEY_ID = "valid_license"  # the SuperLink's own entry in verifications: never checked


class NotFound(LookupError):
    """No such app or version; ``detail`` is the 404 answer's ``detail``."""

    def __init__(self, detail: str | dict) -> None:
        super().__init__(json.dumps(detail))
        self.detail = detail


# ---------------------------------------------------------------------- signing


def check_key_id(key_id: str) -> str:
    """``key_id`` if a site's trusted-entities YAML can name it, else ValueError (the
    SuperNode matches ids against the keys ``yaml.safe_load`` makes of the file: ``2024``,
    ``yes`` or ``null`` would never match)."""
    if key_id == RESERVED_KEY_ID or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", key_id):
        raise ValueError(f"key id {key_id!r}: use letters, digits, '_', '.', '-', starting "
                         f"with a letter (and not {RESERVED_KEY_ID!r})")
    if list(yaml.safe_load(f"{key_id}: x")) != [key_id]:
        raise ValueError(f"key id {key_id!r}: YAML reads it as a non-string; pick another")
    return key_id


def sign_fab(fab_bytes: bytes, private_key_path: Path | str, public_key_id: str,
             signed_at: int | None = None) -> dict:
    """The verification record of ``fab_bytes`` signed with an Ed25519 key.

    Parameters
    ----------
    fab_bytes : bytes
        The FAB, byte for byte as the SuperLink will download it.
    private_key_path : Path or str
        The signer's Ed25519 private key, OpenSSH format (``ssh-keygen -t ed25519``).
    public_key_id : str
        The name under which sites list the matching public key in their
        trusted-entities file (Flower Hub's ids look like ``fpk_<uuid>``; any name works).
    signed_at : int, optional
        Unix time of the signature (default: now). It is part of the signed message.

    Returns
    -------
    dict
        ``{"public_key_id", "signature" (base64url, no padding), "signed_at"}``: one entry
        of the ``verifications`` list of Flower Hub's ``fetch-fab`` answer.
    """
    check_key_id(public_key_id)
    key = _load_key(private_key_path)
    signed_at = int(time.time()) if signed_at is None else int(signed_at)
    message = create_message_to_sign(hashlib.sha256(fab_bytes).digest(), signed_at)
    signature = base64.urlsafe_b64encode(sign_message(key, message)).rstrip(b"=").decode()
    return {"public_key_id": public_key_id, "signature": signature, "signed_at": signed_at}


def _load_key(path: Path | str):
    try:  # Flower's loader: OpenSSH format, Ed25519 only, no passphrase
        return load_private_key(Path(path))
    except (TypeError, UnsupportedAlgorithm) as err:  # e.g. a passphrase
        raise ValueError(f"{path}: {err}") from None


def trusted_entity_line(private_key_path: Path | str, public_key_id: str) -> str:
    """The line a site adds to its trusted-entities YAML to trust this signer."""
    public = _load_key(private_key_path).public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{check_key_id(public_key_id)}: {public.decode()}"


# ---------------------------------------------------------------------- the directory


def fab_metadata(fab_bytes: bytes) -> tuple[str, str]:
    """``("@publisher/name", "x.y.z")`` read from the FAB's own pyproject.toml."""
    try:
        fab_id, version = get_metadata_from_config(get_fab_config(fab_bytes))
    except Exception as err:  # zipfile, TOML and validation errors all mean "not a FAB"
        raise ValueError(f"not a Flower app bundle: {err}") from None
    return f"@{fab_id}", version


def _app_dir(directory: Path | str, app_id: str, version: str | None) -> Path:
    if not re.fullmatch(APP_ID_PATTERN, app_id) or any(
            part.startswith(".") for part in app_id[1:].split("/")):
        raise ValueError(f"app {app_id!r}: expected @account/app")
    if version is not None and not re.fullmatch(APP_VERSION_PATTERN, version):  # as flwr run
        raise ValueError(f"version {version!r}: expected x.y.z (digits only)")
    return Path(directory).joinpath(*app_id[1:].split("/"))


def add_fab(directory: Path | str, fab_bytes: bytes, app_id: str | None = None,
            version: str | None = None) -> Path:
    """Store a FAB in the registry ``directory``; return its path (``<directory>/<account>/
    <app>/<version>.fab``). The same bytes again change nothing; other bytes under a
    version there are refused (its signatures are over the first: publish a new version).

    Parameters
    ----------
    app_id, version : str, optional
        ``@account/app`` and ``x.y.z``: only the FAB's own (the default) is accepted, as
        the SuperLink refuses a Hub FAB whose publisher/name is not the spec it asked for.
    """
    own_id, own_version = fab_metadata(fab_bytes)
    app_id, version = app_id or own_id, version or own_version
    if (app_id, version) != (own_id, own_version):
        raise ValueError(f"the FAB is {own_id}=={own_version}, not {app_id}=={version}")
    path = _app_dir(directory, app_id, version) / f"{version}.fab"
    if path.exists():
        if path.read_bytes() != fab_bytes:
            raise ValueError(f"{path}: {app_id}=={version} already holds another FAB")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".fab.tmp")
    tmp.write_bytes(fab_bytes)
    tmp.replace(path)  # the server never serves a half-written FAB
    log.info("added %s==%s (sha256 %s)", app_id, version, hashlib.sha256(fab_bytes).hexdigest())
    return path


def add_signature(directory: Path | str, app_id: str, version: str, record: dict) -> Path:
    """Add a :func:`sign_fab` record to ``app_id==version``, a FAB of the registry
    ``directory`` (:func:`add_fab`); it replaces a record of the same key id (the SuperLink
    keys them by id). Returns the path of ``<version>.signatures.json``."""
    fab = _app_dir(directory, app_id, version) / f"{version}.fab"
    if not fab.exists():
        raise ValueError(f"{app_id}=={version} is not in the registry {directory}: add its FAB first")
    if set(record) != {"public_key_id", "signature", "signed_at"}:  # what the SuperNode reads
        raise ValueError(f"not a verification record (sign_fab makes them): {record}")
    check_key_id(record["public_key_id"])
    path = fab.with_name(f"{version}.signatures.json")
    records = [r for r in _signatures(path) if r["public_key_id"] != record["public_key_id"]]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([*records, record], indent=2) + "\n")
    tmp.replace(path)
    log.info("signed %s==%s by %s", app_id, version, record["public_key_id"])
    return path


def _signatures(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []  # none yet: unsigned


def lookup(directory: Path | str, app_id: str, version: str | None) -> tuple[Path, str, list[dict]]:
    """Find a FAB of a registry, as ``fetch-fab`` does.

    Parameters
    ----------
    directory : Path or str
        The registry directory.
    app_id, version : str
        ``@account/app`` and ``x.y.z`` (``None``: the highest version).

    Returns
    -------
    tuple of (Path, str, list of dict)
        The FAB's path, version and verification records; :class:`NotFound` if absent.
    """
    folder = _app_dir(directory, app_id, version)
    versions = sorted((p.name[:-4] for p in folder.glob("*.fab")
                       if re.fullmatch(APP_VERSION_PATTERN, p.name[:-4])),
                      key=lambda v: tuple(map(int, v.split("."))))
    if not versions:
        raise NotFound(f"{app_id} is not in this registry")
    if (version := version or versions[-1]) not in versions:
        # flwr lists available_app_versions in its error message
        raise NotFound({"message": f"{app_id}=={version} is not in this registry",
                        "available_app_versions": versions})
    return folder / f"{version}.fab", version, _signatures(folder / f"{version}.signatures.json")


# ---------------------------------------------------------------------- the server


class _Handler(BaseHTTPRequestHandler):
    server: RegistryServer
    server_version = "fedcluster-app-registry"

    def _send(self, status: int, body: bytes | dict, content_type: str = "application/json") -> None:
        body = json.dumps(body).encode() if isinstance(body, dict) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self) -> str:
        path = urlsplit(self.path).path
        return path[len(API_PREFIX):] if path.startswith(API_PREFIX + "/") else path

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self._route() != "/hub/fetch-fab":
            # e.g. Flower's daily update check, which goes to the same base URL
            log.info("404 POST %s: not a registry endpoint", self.path)
            return self._send(404, {"detail": f"no such endpoint: POST {self.path}"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            app_id, version = str(body["app_id"]), body.get("app_version")
            fab, version, records = lookup(self.server.directory, app_id, version)
        except NotFound as err:
            log.warning("fetch-fab %s==%s: not found (%s)", app_id, version, err)
            return self._send(404, {"detail": err.detail})
        except (ValueError, KeyError, TypeError) as err:
            log.warning("400 fetch-fab: %s", err)
            return self._send(400, {"detail": f"bad fetch-fab request: {err}"})
        host = self.headers.get("Host") or "%s:%s" % self.server.server_address[:2]
        url = f"http://{host}{API_PREFIX}/fabs/{app_id[1:]}/{version}.fab"
        log.info("fetch-fab %s==%s for flwr %s: %d signature(s) by %s", app_id, version,
                 body.get("flwr_version"), len(records),
                 ", ".join(r["public_key_id"] for r in records) or "nobody")
        # An unsigned app gets an empty list, not none: the site then says the FAB could
        # not be verified, rather than that the SuperLink cannot verify apps at all.
        self._send(200, {"fab_url": url, "verifications": records})

    def do_GET(self) -> None:  # noqa: N802
        match = FAB_PATH.match(self._route())
        try:
            path = _app_dir(self.server.directory, f"@{match[1]}/{match[2]}", match[3])
            path = path / f"{match[3]}.fab"
        except (TypeError, ValueError):  # no match, or a name like '..'
            path = None
        if path is None or not path.is_file():
            log.warning("404 GET %s: no such FAB", self.path)
            return self._send(404, {"detail": f"no such FAB: {self.path}"})
        log.info("download %s", path)
        self._send(200, path.read_bytes(), "application/octet-stream")

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        log.debug("%s %s", self.address_string(), format % args)  # the lines above say more


class RegistryServer(ThreadingHTTPServer):
    """The HTTP server of a registry directory (one thread per request)."""

    daemon_threads = True

    def __init__(self, directory: Path | str, host: str = "127.0.0.1", port: int = 9080) -> None:
        self.directory = Path(directory)
        super().__init__((host, port), _Handler)


def serve(directory: Path | str, host: str = "127.0.0.1", port: int = 9080) -> None:
    """Serve the registry ``directory`` on ``host:port`` until interrupted, logging every
    request; the SuperLink then needs ``FLWR_SUPERGRID_API_URL=http://HOST:PORT/v1``."""
    if not Path(directory).is_dir():
        raise ValueError(f"{directory}: no such registry directory")
    with RegistryServer(directory, host, port) as server:
        log.info("serving the apps of %s at http://%s:%d%s (FLWR_SUPERGRID_API_URL)",
                 directory, host, server.server_address[1], API_PREFIX)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
