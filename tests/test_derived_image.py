"""A recipe's derived image built once per deployment and run by digest everywhere, offline: the host-data key's
grammar, what every host's context names (the registry's digest, or the placeholder of an image the run pushes),
the bad inputs that stop a deploy before any host, the warning without a registry, the resolution of the pushed
digest when operations execute, the push's digest check, the builder's choice, and the audit's checks.
(The lab proof, two hosts on one image ID: tests/e2e/test_serve_tiny_docker_lab.py.)"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import ssl
import subprocess
import threading
import urllib.parse
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

from .catalogue_copy import unlocked_catalogue

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


def test_a_tag_base_is_not_built_once_for_every_host(tmp_path, monkeypatch):
    # a copy of the catalogue without lock files: `ironserve lock tiny-cpu-docker` in a checkout writes one beside it
    monkeypatch.setenv("IRONSERVE_CATALOGUE", str(unlocked_catalogue(tmp_path)))
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

    def registry_digest(repository, tag_, ca_file, auth_file):
        assert (repository, tag_, ca_file, auth_file) == (REPO, tag, "/ca.crt", None)
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
    assert checks[f"derived-image:{REPO}@{PUSHED[:19]}"].expected == "present"
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


def _auth_file(tmp_path, mode=0o600, text="ci-pusher:s3cret-t0ken\n"):
    path = tmp_path / "registry-auth"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_credentials_come_only_from_a_file_its_owner_alone_reads(tmp_path):
    assert derived_image.registry_credentials(_auth_file(tmp_path)) == ("ci-pusher", "s3cret-t0ken")
    for mode, text, why in [
        (0o644, "ci-pusher:s3cret-t0ken\n", "chmod 600"),
        (0o640, "ci-pusher:s3cret-t0ken\n", "chmod 600"),
        (0o600, "no-colon\n", "USER:PASSWORD"),
        (0o600, "ci-pusher:s3cret\nsecond:line\n", "USER:PASSWORD"),
    ]:
        with pytest.raises(ValueError, match=why) as err:
            derived_image.registry_credentials(_auth_file(tmp_path, mode, text))
        assert "s3cret" not in str(err.value)
    with pytest.raises(ValueError, match="cannot read"):
        derived_image.registry_credentials(str(tmp_path / "absent"))
    config = json.loads(derived_image.docker_config_text("r.example:5000", ("ci-pusher", "s3cret-t0ken")))
    assert base64.b64decode(config["auths"]["r.example:5000"]["auth"]) == b"ci-pusher:s3cret-t0ken"


def test_a_readable_password_stops_the_deploy_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setattr(derived_image, "_LOOKED_UP", {})
    image = derived_image.DerivedImage(
        "127.0.0.1:9",
        "127.0.0.1:9/ironserve/r",
        "dockerfile-" + "0" * 64,
        "FROM x\n",
        auth_file=_auth_file(tmp_path, 0o644),
    )
    with pytest.raises(SpecError) as err:
        derived_image.pushed_digest(image)
    assert "docker_derived_registry_auth_file" in err.value.problems[0].message and "s3cret" not in str(err.value)


def test_the_hosts_get_the_credentials_as_a_0600_docker_config_never_in_a_command(tmp_path, monkeypatch):
    done = []
    monkeypatch.setattr(recipe_image, "files", SimpleNamespace(directory=lambda **kw: done.append(kw)))
    monkeypatch.setattr(recipe_image, "secret_file", lambda **kw: done.append(kw))
    assert recipe_image.registry_login("r.example:5000", None) is None and not done
    assert recipe_image.registry_login("r.example:5000", _auth_file(tmp_path)) == "/etc/ironserve/registry-auth"
    directory, secret = done
    assert directory["mode"] == "700" and secret["path"] == "/etc/ironserve/registry-auth/config.json"
    assert "s3cret" not in repr(done)
    assert base64.b64encode(b"ci-pusher:s3cret-t0ken").decode() in secret["secret"].reveal()
    with pytest.raises(OperationError, match="chmod 600"):
        recipe_image.registry_login("r.example:5000", _auth_file(tmp_path, 0o644))


@pytest.fixture
def tls_certificate(tmp_path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


def _tls_server(handler, cert: Path, key: Path) -> http.server.HTTPServer:
    """``handler`` serving https on 127.0.0.1 (an ephemeral port), in a thread until shutdown()."""
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def tls_registry(tls_certificate):
    """A registry's manifest endpoint over https on 127.0.0.1 (a self-signed certificate as its CA) that answers
    HEAD /v2/ironserve/r/manifests/TAG only with Basic auth ci-pusher:s3cret-t0ken."""
    cert, key = tls_certificate
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            seen.append(self.headers.get("Authorization"))
            expected = "Basic " + base64.b64encode(b"ci-pusher:s3cret-t0ken").decode()
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="registry"')
            else:
                self.send_response(200)
                self.send_header("Docker-Content-Digest", PUSHED)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = _tls_server(Handler, cert, key)
    yield f"127.0.0.1:{server.server_address[1]}", str(cert), seen
    server.shutdown()


def test_the_controller_reads_the_digest_with_basic_auth_only_when_asked(tls_registry, tmp_path):
    address, ca, seen = tls_registry
    repo = f"{address}/ironserve/r"
    assert derived_image.registry_digest(repo, "t", ca, _auth_file(tmp_path)) == PUSHED
    assert seen[0] is None and seen[1].startswith("Basic ")  # anonymous first, the password only on a challenge
    with pytest.raises(RegistryError, match="HTTP 401"):
        derived_image.registry_digest(repo, "t", ca)
    with pytest.raises(RegistryError, match="unreachable"):
        derived_image.registry_digest(repo, "t", None, _auth_file(tmp_path))  # TLS verified: not without its CA


# ----------------------------------------------------------------------------- the base's layers mounted, not pushed


@pytest.mark.parametrize(
    ("base", "mirror", "source"),
    [
        # a Docker Hub name, pulled through the registry as the hosts' Docker Hub mirror
        (f"ironserve-lab/sglang-cpu@{BASE}", "registry.example.internal:5000", f"ironserve-lab/sglang-cpu@{BASE}"),
        (f"ubuntu@{BASE}", "registry.example.internal:5000", f"library/ubuntu@{BASE}"),
        (f"docker.io/library/ubuntu@{BASE}", "registry.example.internal:5000", f"library/ubuntu@{BASE}"),
        # the base named in the derived images' own registry (a site lock's repository)
        (f"registry.example.internal:5000/nvidia/dynamo@{BASE}", None, f"nvidia/dynamo@{BASE}"),
        # elsewhere: the push uploads its layers (once)
        (f"ironserve-lab/sglang-cpu@{BASE}", None, None),
        (f"ironserve-lab/sglang-cpu@{BASE}", "mirror.example.internal", None),
        (f"nvcr.io/nvidia/dynamo@{BASE}", "registry.example.internal:5000", None),
        ("lmsysorg/sglang:v0.5.9", "registry.example.internal:5000", None),  # a tag: nothing to name
    ],
)
def test_the_base_is_mounted_from_where_the_registry_holds_it(base, mirror, source):
    assert derived_image.base_source(base, "registry.example.internal:5000", mirror) == source


def test_the_context_names_the_bases_repository_in_the_registry(recipe_file):
    mirrored = _context(
        recipe_file, lookup=_pushed, docker_derived_registry=REGISTRY, docker_registry_mirror=REGISTRY.split("/")[0]
    )
    assert mirrored.derived.base_source == f"ironserve-lab/sglang-cpu@{BASE}"
    assert _context(recipe_file, lookup=_pushed, docker_derived_registry=REGISTRY).derived.base_source is None


LAYERS = ["sha256:" + c * 64 for c in "cde"]


@pytest.fixture
def mounting_registry(tls_certificate):
    """A registry over https on 127.0.0.1 holding the base ironserve-lab/base (an index of two images sharing a
    layer) and, in ironserve/r, its first layer already: it answers manifests, blob HEADs and cross-repository
    mounts (201 for a blob the source holds, 202 (an upload session) for one it does not), and records them."""
    cert, key = tls_certificate
    index = {"manifests": [{"digest": "sha256:" + "1" * 64}, {"digest": "sha256:" + "2" * 64}]}
    images = {"sha256:" + "1" * 64: LAYERS[:2], "sha256:" + "2" * 64: LAYERS[1:]}
    blobs = {"ironserve-lab/base": set(LAYERS[:2]), "ironserve/r": {LAYERS[0]}}  # the source lacks the 3rd
    mounts = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ref = self.path.rsplit("/", 1)[1]
            body = json.dumps(index if ref == BASE else {"layers": [{"digest": d} for d in images[ref]]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self):
            repo, _, digest = self.path.removeprefix("/v2/").partition("/blobs/")
            self.send_response(200 if digest in blobs.get(repo, ()) else 404)
            self.end_headers()

        def do_POST(self):
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            repo = url.path.removeprefix("/v2/").removesuffix("/blobs/uploads/")
            mounts.append((repo, query["mount"], query["from"]))
            held = query["mount"] in blobs[query["from"]]
            blobs[repo] |= {query["mount"]} if held else set()
            self.send_response(201 if held else 202)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = _tls_server(Handler, cert, key)
    yield f"127.0.0.1:{server.server_address[1]}", str(cert), mounts, blobs
    server.shutdown()


def test_the_bases_layers_are_mounted_into_the_repository_before_the_push(mounting_registry):
    address, ca, mounts, blobs = mounting_registry
    mounted = derived_image.mount_base(f"{address}/ironserve/r", f"ironserve-lab/base@{BASE}", ca, None)
    # every layer of both images once; the one already there is not mounted again; the one the source lacks is not
    # mounted (202: docker push uploads it)
    assert mounted == (2, 3)
    assert mounts == [
        ("ironserve/r", LAYERS[1], "ironserve-lab/base"),
        ("ironserve/r", LAYERS[2], "ironserve-lab/base"),
    ]
    assert blobs["ironserve/r"] == set(LAYERS[:2])
    with pytest.raises(RegistryError, match="unreachable"):  # TLS verified: not without its CA
        derived_image.mount_base(f"{address}/ironserve/r", f"ironserve-lab/base@{BASE}", None, None)


def test_a_base_that_cannot_be_mounted_is_pushed_and_the_run_goes_on(monkeypatch):
    said = []
    host = SimpleNamespace(log_styled=lambda text, **kw: said.append(text))

    def unreachable(*args):
        raise RegistryError("https://r:5000/v2/ unreachable: refused")

    monkeypatch.setattr(recipe_image, "mount_base", unreachable)
    assert recipe_image._mounted_base(None, host, "r:5000/p/x", f"base@{BASE}", None, None) is True
    assert "the push uploads them" in said[0]
    monkeypatch.setattr(recipe_image, "mount_base", lambda *args: (5, 5))
    assert recipe_image._mounted_base(None, host, "r:5000/p/x", f"base@{BASE}", None, None) is True
    assert "5 of 5 base layer(s) mounted from base in the registry: the push sends only the patches'" in said[1]
