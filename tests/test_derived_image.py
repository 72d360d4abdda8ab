"""A recipe's derived image built once per deployment and run by digest everywhere, offline: the host-data key's
grammar, what every host's context names (the registry's digest, or the placeholder of an image the run pushes),
the bad inputs that stop a deploy before any host, the warning without a registry, the resolution of the pushed
digest when operations execute, the push's digest check, the builder's choice, and the audit's checks.
(The lab proof, two hosts on one image ID: tests/e2e/test_serve_tiny_docker_lab.py.)"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pyinfra.api import OperationError
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.operations import parse_commands
from pyinfra_testing.util import FakeState, create_host

from ironserve import derived_image
from ironserve.audit.checks import derive_checks
from ironserve.catalogue import SpecError
from ironserve.hostdata import validate_inventory_data
from ironserve.registry import RegistryError
from ironserve.units import exec_argv, unit_files
from roles import common, docker_engine, recipe_image
from roles.context import build_context
from roles.sglang_service import built_here, parse_digest, runtime_identity

ROOT = Path(__file__).resolve().parents[1]
BASE = "sha256:" + "12" * 32
PUSHED = "sha256:" + "ab" * 32
REGISTRY = "registry.example.internal:5000/ironserve"
REPO = f"{REGISTRY}/tiny-cpu-docker"
UNIT = "sglang-tiny-cpu-docker-server"


@pytest.fixture
def recipe_file(tmp_path) -> str:
    """tiny-cpu-docker with its base pinned (as its lock file pins it in the lab)."""
    data = yaml.safe_load((ROOT / "recipes" / "tiny-cpu-docker.yaml").read_text())
    data["runtime"]["digest"] = BASE
    path = tmp_path / "tiny-cpu-docker.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _hosts(recipe: str, **data) -> list[tuple[str, dict]]:
    common_data = {"hardware": "cpu-lab", "recipe": recipe, "allow_open_bind": True, **data}
    return [(f"lab{i}", {**common_data, "ssh_hostname": f"10.0.0.{10 + i}"}) for i in (1, 2)]


def _context(recipe: str, host: str = "lab1", lookup=None, **data):
    return build_context("tiny", host, _hosts(recipe, **data), lookup=lookup)


def _pushed(image, where):
    return PUSHED


@pytest.mark.parametrize(
    "value", ["registry.example.internal:5000/ironserve", "10.0.0.1:5000/lab-derived", "localhost/x", "registry:5000"]
)
def test_the_key_names_an_https_registry(value):
    assert validate_inventory_data([("h", {"docker_derived_registry": value})], "inv")["h"].docker_derived_registry


@pytest.mark.parametrize(
    "value",
    [
        "https://registry.example/x",  # a scheme: Docker takes HOST[:PORT]
        "registry/x",  # a bare first name is a Docker Hub account, not a registry
        "registry.example/X",  # repository paths are lowercase
        "registry.example/a;reboot",
        "registry.example/$(id)",
        "registry.example/a b",
        "registry.example:5000/a\n",
    ],
)
def test_the_key_refuses_what_is_no_registry_path(value):
    with pytest.raises(SpecError) as err:
        validate_inventory_data([("h", {"docker_derived_registry": value})], "inv")
    assert err.value.problems[0].field == "h.docker_derived_registry"


def test_every_host_runs_the_digest_the_registry_gives_its_content_tag(recipe_file):
    contexts = [_context(recipe_file, h, _pushed, docker_derived_registry=REGISTRY) for h in ("lab1", "lab2")]
    image = contexts[0].derived
    assert image == contexts[1].derived and image.digest == PUSHED and image.ref == f"{REPO}@{PUSHED}"
    # content-addressed: the tag is the Dockerfile's sha256, the Dockerfile FROM the pinned base
    assert image.tag == "dockerfile-" + hashlib.sha256(image.dockerfile.encode()).hexdigest()
    assert f"FROM ironserve-lab/sglang-cpu@{BASE}\n" in image.dockerfile
    for ctx in contexts:
        (proc,) = ctx.processes
        argv = exec_argv(ctx.recipe, proc)
        assert f"{REPO}@{PUSHED}" in argv and not [a for a in argv if a.endswith(":derived")]
        assert f" {REPO}@{PUSHED} " in unit_files(ctx.recipe, proc, ctx.tuning).unit_text


def test_until_pushed_the_plan_names_a_placeholder_and_the_parse_marker_stays(recipe_file):
    """A run that pushes the image plans with its placeholder (not a reference Docker takes); the parse marker it
    writes is the one the next run (which names the digest) expects, and the one a host-built image had."""
    pending = _context(recipe_file, docker_derived_registry=REGISTRY)
    known = _context(recipe_file, lookup=_pushed, docker_derived_registry=REGISTRY)
    local = _context(recipe_file)
    placeholder = f"{REPO}@to-be-pushed:{pending.derived.tag}"
    assert pending.derived.digest is None and pending.derived.ref == placeholder
    assert placeholder in exec_argv(pending.recipe, pending.processes[0])
    assert derived_image.pending_images(exec_argv(pending.recipe, pending.processes[0])) == [placeholder]
    markers = {
        parse_digest(exec_argv(built_here(c.recipe), c.processes[0]), runtime_identity(c.recipe))
        for c in (pending, known, local)
    }
    assert len(markers) == 1


def test_hosts_that_disagree_stop_the_deploy_before_any_host(recipe_file):
    hosts = _hosts(recipe_file, docker_derived_registry=REGISTRY)
    hosts[1][1]["docker_derived_registry"] = "other.example:5000/ironserve"
    with pytest.raises(SpecError) as err:
        build_context("tiny", "lab1", hosts)
    assert err.value.problems[0].field == "lab2.docker_derived_registry"
    hosts = _hosts(recipe_file, docker_derived_registry=REGISTRY)
    hosts[1][1]["pip_index_url"] = "https://pypi.example/simple/"  # another Dockerfile (ARG lines): two images
    with pytest.raises(SpecError) as err:
        build_context("tiny", "lab1", hosts)
    assert err.value.problems[0].field == "lab2.pip_index_url"


def test_a_tag_base_is_not_built_once_for_every_host():
    with pytest.raises(SpecError) as err:
        _context("tiny-cpu-docker", docker_allow_unpinned=True, docker_derived_registry=REGISTRY)
    assert err.value.problems[0].field == "runtime.digest" and "no lock file pins it" in str(err.value)


def test_without_a_registry_the_deploy_warns_naming_the_key(recipe_file):
    warning = recipe_image.unshared_build_warning(_context(recipe_file))
    assert "docker_derived_registry" in warning and "lab1, lab2" in warning and "differ" in warning
    assert recipe_image.unshared_build_warning(_context(recipe_file, docker_derived_registry=REGISTRY)) is None
    uv = [("r0", {"hardware": "cpu-lab", "ironserve_role": "router", "allow_open_bind": True}), *_hosts("tiny-cpu")]
    assert recipe_image.unshared_build_warning(build_context("tiny", "lab1", uv)) is None  # no image to build


def _executing():
    state = FakeState()
    state.is_executing = True
    return state


def test_a_pushed_image_is_named_by_its_digest_when_operations_execute(monkeypatch):
    placeholder = derived_image.placeholder(REPO, "dockerfile-" + "cd" * 32)
    monkeypatch.setattr(common, "PUSHED_IMAGES", {})
    argv = ["docker", "run", placeholder, "python3"]
    assert common.pushed(argv) is argv  # planning: the placeholder stays, the same object
    shared = {"group": {0: True}}
    with ctx_state.use(_executing()), ctx_host.use(create_host(FakeState(), name="lab2")):
        with pytest.raises(OperationError, match=f"{REPO} was not pushed by this run"):
            common.pushed(argv)
        common.PUSHED_IMAGES[placeholder] = f"{REPO}@{PUSHED}"
        assert common.pushed(argv) == ["docker", "run", f"{REPO}@{PUSHED}", "python3"]
        assert common.pushed({"ranks_running": shared})["ranks_running"] is shared  # shared records stay shared
        state = FakeState()
        state.is_executing = True
        host = create_host(state, facts={"recipe_image.DockerImageDigests": {f"ref={REPO}@{PUSHED}": None}})
        with ctx_state.use(state), ctx_host.use(host):
            commands = parse_commands(list(recipe_image.derived_pulled._inner(ref=placeholder)))
    assert commands == [f"docker pull {REPO}@{PUSHED}"]


class _Builder:
    name = "lab1"
    data = {"_sudo": True}

    def __init__(self, repo_digests: list[str]):
        self.lines, self.logged = repo_digests, []

    def run_shell_command(self, command, _sudo=False):
        assert _sudo and "docker image inspect" in command
        return True, SimpleNamespace(stdout_lines=self.lines)

    def log_styled(self, text, **kwargs):
        self.logged.append(text)


@pytest.mark.parametrize(
    "registry_says, recorded",
    [(PUSHED, True), ("sha256:" + "ef" * 32, False), (None, False), (RegistryError("unreachable"), False)],
)
def test_the_push_is_checked_against_the_registry_before_any_host_pulls(monkeypatch, registry_says, recorded):
    tag = "dockerfile-" + "cd" * 32

    def registry_digest(repository, tag_, ca_file):
        assert (repository, tag_, ca_file) == (REPO, tag, "/ca.crt")
        if isinstance(registry_says, Exception):
            raise registry_says
        return registry_says

    monkeypatch.setattr(recipe_image, "registry_digest", registry_digest)
    monkeypatch.setattr(recipe_image, "PUSHED_IMAGES", {})
    builder = _Builder([f"{REPO}@{PUSHED}", f"ironserve-lab/sglang-cpu@{BASE}"])
    assert recipe_image._record_push(None, builder, REPO, tag, "/ca.crt") is recorded
    pushed = {derived_image.placeholder(REPO, tag): f"{REPO}@{PUSHED}"} if recorded else {}
    assert recipe_image.PUSHED_IMAGES == pushed
    assert ("digest mismatch" in builder.logged[0]) is not recorded


def test_the_builder_is_the_first_engine_host_of_the_run(recipe_file, monkeypatch):
    ctx = _context(recipe_file, docker_derived_registry=REGISTRY)
    monkeypatch.setattr(recipe_image, "in_run", lambda name: True)
    assert recipe_image.builder(ctx) == "lab1"
    monkeypatch.setattr(recipe_image, "in_run", lambda name: name != "lab1")  # --limit lab2
    assert recipe_image.builder(ctx) == "lab2"
    monkeypatch.setattr(recipe_image, "in_run", lambda name: False)
    assert recipe_image.builder(ctx) is None


def test_an_unreachable_registry_stops_naming_the_key(monkeypatch):
    monkeypatch.setattr(derived_image, "_LOOKED_UP", {})
    image = derived_image.DerivedImage("127.0.0.1:9", "127.0.0.1:9/ironserve/r", "dockerfile-" + "0" * 64, "FROM x\n")
    with pytest.raises(SpecError) as err:
        derived_image.pushed_digest(image, "inventories/site.py")
    problem = err.value.problems[0]
    assert problem.file == "inventories/site.py" and problem.field == "docker_derived_registry"
    assert "unreachable" in problem.message and "docker_registry_ca" in problem.fix


def pending_tag(recipe_file: str) -> str:
    return _context(recipe_file, docker_derived_registry=REGISTRY).derived.tag


def test_the_audit_checks_each_container_runs_the_digest(recipe_file):
    ctx = _context(recipe_file, "lab2", _pushed, docker_derived_registry=REGISTRY)
    checks = {c.id: c for c in derive_checks(ctx, "d", "i")}
    assert checks[f"derived-image:{REPO}@{PUSHED[:19]}"].expected == "1"
    running = checks[f"container-image:{UNIT}"]
    assert running.expected == "same" and f"{REPO}@{PUSHED}" in running.params["cmd"] and UNIT in running.params["cmd"]
    assert not [c for c in checks if c.startswith("image:")]  # the base is the builder's business
    pending = derive_checks(_context(recipe_file, "lab2", docker_derived_registry=REGISTRY), "d", "i")
    (missing,) = [c for c in pending if c.id.startswith("derived-image:")]
    assert missing.expected == "pushed" and missing.id == f"derived-image:{REPO}:{pending_tag(recipe_file)}"


def test_docker_trusts_the_derived_registry_with_the_inventorys_ca(recipe_file, monkeypatch):
    ctx = _context(recipe_file, docker_derived_registry=REGISTRY, docker_registry_ca="/site/ca.crt")
    puts = []
    monkeypatch.setattr(docker_engine, "files", SimpleNamespace(put=lambda **kw: puts.append(kw)))
    assert docker_engine.registry_mirror(ctx) == []  # no Docker Hub mirror: daemon.json untouched
    assert [(p["src"], p["dest"]) for p in puts] == [
        ("/site/ca.crt", "/etc/docker/certs.d/registry.example.internal:5000/ca.crt")
    ]
