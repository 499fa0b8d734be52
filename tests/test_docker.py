"""The container files, checked by static tools (there is no Docker engine here; the same
commands run natively in tests/test_secure_deployment.py): hadolint on every Dockerfile,
the compose files against the Compose specification, the images pinned to the Flower
version fedcluster is built for, and every flag a compose service passes known to the
Flower executable its image runs."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[1] / "docker"
BIN = Path(sys.executable).parent
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
COMPOSE_FILES = [DOCKER / "compose.yml", DOCKER / "compose.tls.yml"]


def test_there_is_a_dockerfile_per_flower_image():
    assert [p.name for p in DOCKERFILES] == [
        "superexec.Dockerfile", "superlink.Dockerfile", "supernode.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    done = subprocess.run([str(BIN / "hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_are_the_pinned_flower_release(dockerfile):
    images = re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(), flags=re.M)
    flwr = version("flwr")
    assert images == [f"flwr/{dockerfile.stem}:{flwr}"]  # the Flower the tests ran with


def test_compose_files_validate_against_the_compose_spec():
    done = subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
         *map(str, COMPOSE_FILES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _flags(executable: str) -> set[str]:
    out = subprocess.run([str(BIN / executable), "--help"], capture_output=True, text=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]+)", out))


ENTRYPOINTS = {"superexec": "flower-superexec", "superlink": "flower-superlink",
               "supernode": "flower-supernode"}


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_every_service_flag_is_known_to_its_flower_executable(compose):
    services = yaml.safe_load(compose.read_text())["services"]
    assert {"superlink", "serverapp"} <= set(services)
    assert sum(name.startswith("site-") for name in services) == 3
    known = {image: _flags(exe) for image, exe in ENTRYPOINTS.items()}
    for name, service in services.items():
        image = Path(service["build"]["dockerfile"]).stem.split(".")[0]
        assert (DOCKER.parent / service["build"]["dockerfile"]).exists()
        flags = [arg for arg in service["command"] if str(arg).startswith("--")]
        unknown = [f for f in flags if f not in known[image]]
        assert not unknown, f"{compose.name} {name}: {unknown} not flags of {ENTRYPOINTS[image]}"
        if name.startswith("clientapp-"):  # the site's data: read-only, in the executor
            assert any(v.endswith(":/data:ro") for v in service["volumes"])


def test_image_requirements_pin_every_runtime_dependency():
    """The superexec image installs fedcluster with --no-deps on top of
    docker/requirements.txt: every dependency of fedcluster (but flwr, which the base image
    brings) must be there, pinned to the version installed here."""
    import tomllib

    from packaging.requirements import Requirement

    lines = [line.split("#")[0].strip()
             for line in (DOCKER / "requirements.txt").read_text().splitlines()]
    pins = dict(line.split("==") for line in lines if line)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.+-]*", line) for line in lines if line)
    norm = {re.sub(r"[-_.]+", "-", name).lower(): v for name, v in pins.items()}
    pyproject = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())
    for dep in pyproject["project"]["dependencies"]:
        name = re.sub(r"[-_.]+", "-", Requirement(dep).name).lower()
        if name == "flwr":
            continue
        assert name in norm, f"{name} is not pinned in docker/requirements.txt"
        assert norm[name] == version(name), (name, norm[name], version(name))
