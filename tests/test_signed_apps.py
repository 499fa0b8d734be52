"""Signed apps only (docs/how-to/signed-apps.md): a site's SuperNode started with
``--trusted-entities`` runs only app bundles signed by a key it trusts.

In process: a signature made by ``fedcluster.server_app.app_registry.sign_fab`` passes
Flower's own check (the SuperNode's ``_verify_fab`` on the verifications the SuperLink's
``_format_verification`` makes of the Hub's answer) and fails it for changed bytes,
another key or another key id; the registry answers Flower's own Hub client
(``request_download_link``) as Flower Hub does; ``fedcluster app sign`` refuses what
could never verify.

Over real processes, on ONE federation (the registry served by deploy/serve-apps.sh, a
SuperLink whose ``FLWR_SUPERGRID_API_URL`` points at it, one SuperNode trusting one key),
three runs side by side: (a) the app from a local directory (0.1.0, no signature) is
refused by the site; (b) the registry's 0.1.1, signed by an untrusted key under its own
id and under the trusted key's id, is refused; (c) the registry's 0.1.2, signed by the
trusted key (with deploy/sign-app.sh), runs and writes its model.json. Each site verdict
is read from the site's own log for that run id. ~50 s on an idle 2-core machine.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from flwr.cli.build import build_fab_from_disk
from flwr.supercore.fab import Fab
from flwr.superlink.servicer.control.control_handlers import _format_verification
from flwr.supercore.utils import request_download_link
from flwr.supernode.start_client_internal import _verify_fab

import fedcluster
import flower_processes as fp
from fedcluster import cli
from fedcluster.server_app import app_registry
from test_deployment import write_site_csv

REPO = Path(__file__).resolve().parents[1]
KEY_ID = "fedcluster-reviewers"
# The shortest run there is: describe, one lloyd round, evaluate (and evaluate_distances
# unless it converged; init "random" in the given data-bounds box needs no round of its
# own); ~10 s a round here,
# for the fresh ClientApp process of every message.
CONFIG = {"algorithm": "dwf", "n-clusters": 2, "num-rounds": 1, "min-sites": 1,
          "init": "random", "data-bounds": "-5:10", **fp.NO_TABLE1}
# What the site's SuperNode logs when it refuses a FAB (flwr/supernode/start_client_internal.py)
NO_VERIFICATIONS = "App verification is not supported by the connected SuperLink"
BAD_SIGNATURE = "FAB verification failed: the provided trusted entities could not verify"


def _keypair(path: Path) -> Path:
    """A fresh Ed25519 key pair in OpenSSH format (as ``ssh-keygen -t ed25519`` writes
    it, and as Flower loads it): ``path`` (private) and ``path.pub``."""
    key = ed25519.Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return path


def _stage(directory: Path, version: str) -> tuple[Path, bytes]:
    """The repository's app copied to ``directory`` as ``version``, and its FAB (what
    ``flwr build`` makes of it). Copied without the virtualenv because ``flwr`` walks
    every file under an app directory before filtering (8 s per FAB with the .venv, at
    every ``flwr run``); the FAB holds pyproject.toml and fedcluster/ either way."""
    shutil.copytree(REPO, directory, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", ".pytest_cache", "outputs"))
    pyproject = directory / "pyproject.toml"
    text, n = re.subn(r'(?m)^version = "[^"]*"$', f'version = "{version}"', pyproject.read_text())
    assert n == 1
    pyproject.write_text(text)
    return directory, build_fab_from_disk(directory)


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> tuple[Path, bytes]:
    """The app as version 0.1.0: its directory and its FAB."""
    return _stage(tmp_path_factory.mktemp("app") / "fedcluster", "0.1.0")


# ------------------------------------------------------------------ in process


def test_a_signature_passes_flowers_own_check_and_nothing_else(app, tmp_path):
    _, fab = app
    signer, other = _keypair(tmp_path / "signer"), _keypair(tmp_path / "other")
    trusted = {KEY_ID: (tmp_path / "signer.pub").read_text()}

    def verified(content: bytes, records: list[dict], entities=trusted) -> bool:
        # exactly what reaches the site: the SuperLink formats the Hub's list
        return _verify_fab(Fab("", content, _format_verification(records)), entities)

    record = app_registry.sign_fab(fab, signer, KEY_ID)
    assert set(record) == {"public_key_id", "signature", "signed_at"}
    assert "=" not in record["signature"]  # base64url without padding, as Flower Hub's
    assert verified(fab, [record])
    assert not verified(fab[:-1] + bytes([fab[-1] ^ 1]), [record])  # one bit changed
    assert not verified(fab, [app_registry.sign_fab(fab, other, KEY_ID)])  # another key
    assert not verified(fab, [app_registry.sign_fab(fab, signer, "someone-else")])  # not listed
    assert not verified(fab, [{**record, "signed_at": record["signed_at"] + 1}])  # time is signed
    # the line `fedcluster app sign` prints is what the site's YAML needs
    line = app_registry.trusted_entity_line(signer, KEY_ID)
    assert line == f"{KEY_ID}: {trusted[KEY_ID].strip()}"


@pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="no ssh-keygen")
def test_a_key_from_ssh_keygen_signs(app, tmp_path):
    """The key of the docs' first step (``ssh-keygen -t ed25519``) signs, and its ``.pub``
    is what a site's trusted-entities file takes."""
    _, fab = app
    key = tmp_path / "reviewers"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fedcluster reviewers",
                    "-f", str(key)], check=True)
    pub = key.with_suffix(".pub").read_text().strip()
    assert app_registry.trusted_entity_line(key, KEY_ID) == f"{KEY_ID}: {' '.join(pub.split()[:2])}"
    record = app_registry.sign_fab(fab, key, KEY_ID)
    assert _verify_fab(Fab("", fab, _format_verification([record])), {KEY_ID: pub})
    # Flower reads keys without a passphrase: one with a passphrase is a clear error
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(tmp_path / "locked")],
                   check=True)
    with pytest.raises(ValueError, match="password-protected"):
        app_registry.sign_fab(fab, tmp_path / "locked", KEY_ID)


def test_registry_answers_flowers_hub_client(app, tmp_path):
    _, fab = app
    app_id, version = app_registry.fab_metadata(fab)
    assert app_id == "@fedcluster/fedcluster"
    signer = _keypair(tmp_path / "signer")
    app_registry.add_fab(tmp_path / "reg", fab)
    app_registry.add_fab(tmp_path / "reg", fab)  # the same bytes again: fine
    other = io.BytesIO()  # the same app and version, one file more
    with zipfile.ZipFile(io.BytesIO(fab)) as src, zipfile.ZipFile(other, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item))
        dst.writestr("fedcluster/extra.py", "")
    with pytest.raises(ValueError, match=rf"{app_id}=={version} already holds another FAB"):
        app_registry.add_fab(tmp_path / "reg", other.getvalue())
    record = app_registry.sign_fab(fab, signer, KEY_ID)
    app_registry.add_signature(tmp_path / "reg", app_id, version, record)
    with app_registry.RegistryServer(tmp_path / "reg", "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/v1/hub/fetch-fab"
            for asked in (version, None):  # None: the latest version
                fab_url, records, _ = request_download_link(app_id, asked, url, "fab_url")
                assert records == [record]
                assert requests.get(fab_url, timeout=10).content == fab
            with pytest.raises(ValueError, match=rf"Available app versions for {app_id}: {version}"):
                request_download_link(app_id, "9.9.9", url, "fab_url")
            with pytest.raises(ValueError, match="@someone/else not found"):
                request_download_link("@someone/else", None, url, "fab_url")
            assert requests.get(fab_url.replace("fedcluster/fedcluster", "fedcluster/.."),
                                timeout=10).status_code == 404
        finally:
            server.shutdown()


def test_app_sign_command(app, tmp_path, capsys):
    _, fab = app
    key = _keypair(tmp_path / "key")
    fab_path = tmp_path / "app.fab"
    fab_path.write_bytes(fab)
    reg = tmp_path / "reg"
    assert cli.main(["app", "sign", str(fab_path), "--key", str(key), "--key-id", KEY_ID]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed.splitlines()[0])["public_key_id"] == KEY_ID
    assert f"  {KEY_ID}: ssh-ed25519 " in printed
    # ids a site's YAML cannot name, and an app spec that is not the FAB's own
    for bad in (["--key-id", "2024"], ["--key-id", "yes"], ["--key-id", "valid_license"],
                ["--key-id", KEY_ID, "--registry", str(reg), "--app", "@other/app"]):
        assert cli.main(["app", "sign", str(fab_path), "--key", str(key), *bad]) == 2
    assert not reg.exists()
    assert cli.main(["app", "sign", str(fab_path), "--key", str(key), "--key-id", KEY_ID,
                     "--registry", str(reg)]) == 0
    version = app_registry.fab_metadata(fab)[1]
    assert (reg / "fedcluster" / "fedcluster" / f"{version}.fab").read_bytes() == fab
    (record,) = json.loads((reg / "fedcluster" / "fedcluster" / f"{version}.signatures.json").read_text())
    assert record["public_key_id"] == KEY_ID


# ------------------------------------------------------------------ real processes


def _started(bed, proc):
    """Register a process started outside the sandbox's helpers with the sandbox (its
    log tail in failures, its ports in the safety net)."""
    bed.processes.append(proc)
    bed.patterns += [fp.port_pattern(p) for p in proc.ports]
    return proc


def _verdict(site_log: str, run_id: int) -> str:
    """What the site's SuperNode said on the first message of ``run_id``: it logs the run,
    ``Receiving: ...``, then accepts (``Received successfully``) or refuses (an ERROR).
    Its message loop is sequential, so no other run's ``[RUN`` header comes in between."""
    match = re.search(rf"\[RUN {run_id}\b[^\n]*\n(?:(?!.*\[RUN ).*\n)*?"
                      r".*(Received successfully|The FAB could not be verified\.[^\n]*"
                      r"|FAB verification failed[^\n]*)", site_log)
    assert match, f"run {run_id} not in the site's log:\n{site_log[-3000:]}"
    return match.group(1)


def test_site_runs_only_apps_signed_by_a_key_it_trusts(bed, tmp_path, app):
    # Three FABs of the app that differ in their version only: the SuperLink keeps a FAB's
    # signatures by its hash (the last stored win), so runs side by side need other bytes.
    local_dir, _ = app  # (a) 0.1.0 from a local directory: never signed
    staged = tmp_path / "apps"
    _, rogue_fab = _stage(staged / "rogue", "0.1.1")  # (b) in the registry, rogue-signed
    _, good_fab = _stage(staged / "good", "0.1.2")  # (c) in the registry, reviewer-signed
    app_id = app_registry.fab_metadata(good_fab)[0]
    reviewers, rogue = _keypair(tmp_path / "keys" / "reviewers"), _keypair(tmp_path / "keys" / "rogue")
    trusted = tmp_path / "trusted-entities.yaml"
    trusted.write_text(app_registry.trusted_entity_line(reviewers, KEY_ID) + "\n")
    registry = tmp_path / "registry"
    # 0.1.1: the rogue signs under its own id, and under the reviewers' (an impersonation);
    # 0.1.2: the rogue signs it too (which changes nothing), then the reviewers do, with
    # deploy/sign-app.sh (in the background: the command takes a few seconds to start)
    for fab, key_id in ((rogue_fab, "rogue"), (rogue_fab, KEY_ID), (good_fab, "rogue")):
        (tmp_path / "fab").write_bytes(fab)
        assert cli.main(["app", "sign", str(tmp_path / "fab"), "--key", str(rogue),
                         "--key-id", key_id, "--registry", str(registry)]) == 0
    (tmp_path / "good.fab").write_bytes(good_fab)
    signing = subprocess.Popen(
        ["bash", str(REPO / "deploy" / "sign-app.sh"), str(tmp_path / "good.fab"), str(reviewers),
         KEY_ID, str(registry)], env=bed.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    port = fp.free_port()
    hub = _started(bed, bed.stack.enter_context(fp.flower_process(
        "app-registry", ["bash", str(REPO / "deploy" / "serve-apps.sh"), str(registry)],
        log_dir=bed.log_dir, env={**bed.env, "FEDCLUSTER_REGISTRY_PORT": str(port)},
        ready_ports=[port], wait=False)))
    link = bed.stack.enter_context(fp.superlink(
        log_dir=bed.log_dir, simulation=False,
        env={**bed.env, "FLWR_SUPERGRID_API_URL": f"http://127.0.0.1:{port}/v1"}))
    _started(bed, link.process)
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(30, 2)) + np.repeat([[0.0, 0.0], [5.0, 5.0]], 15, axis=0)
    data = write_site_csv(tmp_path / "site.csv", rows)
    site = _started(bed, bed.stack.enter_context(fp.supernode(
        "site", fleet_address=link.fleet_address, log_dir=bed.log_dir, env=bed.env,
        node_config={"data-path": str(data), "site-id": "0"},
        extra_args=["--trusted-entities", str(trusted)])))
    fp.wait_for_log(link.process, rf"Activated node_id={site.ready_match.group(1)}\b")
    hub.wait_ready()
    printed = signing.communicate(timeout=120)[0]
    assert signing.returncode == 0, printed
    assert app_registry.trusted_entity_line(reviewers, KEY_ID) in printed
    bed.connect("signed", link.control_address)
    out = tmp_path / "outputs"

    def run(name: str, spec: str | None):
        """``flwr run`` of the local app (``spec`` None) or of ``spec`` from the registry:
        the FlwrRun, or the FlowerProcessError of a run that did not complete."""
        try:
            return fp.run_flwr(local_dir, "signed", {**CONFIG, "output-dir": str(out), "run-name": name},
                               env=bed.env, processes=bed.processes, timeout=240, app_spec=spec,
                               log_path=bed.log_dir / f"flwr-run-{name}.log")
        except fp.FlowerProcessError as err:
            return err

    # The three runs side by side on the one site (the refused ones are short).
    with ThreadPoolExecutor(3) as pool:
        local, bad, good = pool.map(run, ["local", "rogue", "signed"],
                                    [None, f"{app_id}==0.1.1", f"{app_id}==0.1.2"])
    site_log, hub_log = site.log_text(), hub.log_text()

    # (a) and (b): refused by the site, whose error reply ends the run (its only site)
    for refused in (local, bad):
        assert isinstance(refused, fp.FlowerProcessError), refused
        assert "error reply: The FAB could not be verified." in str(refused)  # the ServerApp's log
        match = re.search(r"run (\d+) ended with status 'finished:failed'", str(refused))
        assert match, str(refused)[:3000]
        refused.run_id = int(match.group(1))
    # (a) the SuperLink attached no verifications to a FAB from a local directory
    assert _verdict(site_log, local.run_id).startswith(f"The FAB could not be verified. {NO_VERIFICATIONS}")
    # (b) it attached the registry's, and no trusted key made them
    assert _verdict(site_log, bad.run_id).startswith(BAD_SIGNATURE)
    assert re.search(rf"fetch-fab {app_id}==0.1.1 .*2 signature\(s\) by rogue, {KEY_ID}", hub_log)
    for name in ("local", "rogue"):
        assert not (out / name / "model.json").exists()

    # (c) signed by the trusted key: run, to the end
    assert not isinstance(good, Exception), str(good)
    assert _verdict(site_log, good.run_id) == "Received successfully"
    assert re.search(rf"fetch-fab {app_id}==0.1.2 .*2 signature\(s\) by rogue, {KEY_ID}", hub_log)
    model = fedcluster.Model.load(out / "signed" / "model.json")
    assert model.centroids.shape == (2, 2)
