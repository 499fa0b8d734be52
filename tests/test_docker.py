"""The container files, checked by static tools (there is no Docker engine here; the same
commands run natively in tests/test_secure_deployment.py): hadolint on every Dockerfile,
the compose files against the Compose specification, the images' Flower release chosen in
one place (``FLWR_VERSION``, a release fedcluster supports), and every flag of a compose
service's command line, as its image's entry point makes it for the installed Flower,
known to the Flower executable it runs."""

from __future__ import annotations

import functools
import os
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


#: The Flower release the images are built from unless FLWR_VERSION says otherwise: the
#: newest fedcluster supports (pyproject's range; CI tests it and 1.39).
IMAGE_FLOWER = "1.42.0"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_are_a_supported_flower_release_chosen_in_one_place(dockerfile):
    import tomllib

    from packaging.requirements import Requirement

    text = dockerfile.read_text()
    assert re.findall(r"^FROM\s+(\S+)", text, flags=re.M) == [f"flwr/{dockerfile.stem}:${{FLWR_VERSION}}"]
    assert re.findall(r"^ARG FLWR_VERSION=(\S+)$", text, flags=re.M) == [IMAGE_FLOWER]
    pyproject = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())
    flwr = next(Requirement(d) for d in pyproject["project"]["dependencies"] if d.startswith("flwr"))
    assert flwr.specifier.contains(IMAGE_FLOWER) and flwr.specifier.contains("1.39.0")
    for compose in COMPOSE_FILES:  # one switch: FLWR_VERSION, the same default
        services = yaml.safe_load(compose.read_text())["services"]
        for name, service in services.items():
            assert service["build"]["args"] == {"FLWR_VERSION": f"${{FLWR_VERSION:-{IMAGE_FLOWER}}}"}, name


@functools.cache
def _flags(executable: str) -> set[str]:
    out = subprocess.run([str(BIN / executable), "--help"], capture_output=True, text=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]+)", out))


ENTRYPOINTS = {"superexec": "flower-superexec", "superlink": "flower-superlink",
               "supernode": "flower-supernode"}


#: The installed Flower's major.minor, as deploy/flower-layout.sh reads it from `flwr --version`.
INSTALLED = ".".join(version("flwr").split(".")[:2])


def test_the_layout_script_reads_the_installed_flower():
    """deploy/flower-layout.sh (sourced by the deploy scripts and the images' entry point)
    reads the installed Flower: the gRPC Fleet API on 9092 under 1.39, else HTTP on 8000."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("FLOWER_VERSION", None)
    done = subprocess.run(["sh", "-c", '. "$0"; echo "$FLOWER_VERSION $FLEET_GRPC $FLEET_PORT"',
                           str(DOCKER.parent / "deploy" / "flower-layout.sh")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    grpc = INSTALLED == "1.39"
    assert done.stdout.split() == [INSTALLED, "1" if grpc else "0", "9092" if grpc else "8000"]


def _entry(image: str, command: list[str], environment: dict) -> list[str]:
    """The command line docker/flower-entry.sh starts in an ``image`` container, under the
    Flower installed here (its dry run)."""
    if image == "superexec":
        return ["flower-superexec", *command]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "FEDCLUSTER_LAYOUT": str(DOCKER.parent / "deploy" / "flower-layout.sh"),
           "FEDCLUSTER_ENTRY_DRY_RUN": "1", "FLOWER_VERSION": INSTALLED,
           **{k: str(v) for k, v in environment.items()}}
    done = subprocess.run(["sh", str(DOCKER / "flower-entry.sh"), ENTRYPOINTS[image], *command],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_every_service_flag_is_known_to_its_flower_executable(compose):
    """Each service's command line as its image's entry point makes it under the Flower
    installed here (1.42 or 1.39 in CI): every flag known to that executable, the SuperLink
    serving the gRPC Fleet API under 1.39 only, the sites connecting to the release's
    Fleet port (9092 gRPC, 8000 HTTP)."""
    services = yaml.safe_load(compose.read_text())["services"]
    assert {"superlink", "serverapp"} <= set(services)
    assert sum(name.startswith("site-") for name in services) == 3
    known = {image: _flags(exe) for image, exe in ENTRYPOINTS.items()}
    grpc_fleet = tuple(int(x) for x in version("flwr").split(".")[:2]) < (1, 40)
    for name, service in services.items():
        image = Path(service["build"]["dockerfile"]).stem.split(".")[0]
        assert (DOCKER.parent / service["build"]["dockerfile"]).exists()
        argv = _entry(image, [str(a) for a in service["command"]], service.get("environment", {}))
        assert argv[0] == ENTRYPOINTS[image]
        flags = [arg for arg in argv if arg.startswith("--")]
        unknown = [f for f in flags if f not in known[image]]
        assert not unknown, f"{compose.name} {name}: {unknown} not flags of {ENTRYPOINTS[image]}"
        if name == "superlink":
            assert ("--fleet-api-address" in argv) == grpc_fleet, argv
        if name.startswith("site-"):
            assert argv[argv.index("--superlink") + 1] == f"superlink:{9092 if grpc_fleet else 8000}"
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
