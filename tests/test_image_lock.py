"""`ironserve lock` and the lock files: tag -> digest against a registry speaking the v2 API (a small in-process
one on loopback here; the lab test uses Debian's docker-registry), the lock
applied when a recipe loads, and the deploy's refusal of a docker recipe that nothing pins."""

from __future__ import annotations

import hashlib
import http.server
import json
import tarfile
import threading
from pathlib import Path

import pytest
from ironserve_lab import oci

from ironserve import catalogue, cli, imagelock
from ironserve.problems import SpecError
from ironserve.registry import Registry, repository_path
from roles.context import build_context, require_pinned_image

from .catalogue_copy import unlocked_catalogue

ROOT = Path(__file__).resolve().parents[1]


class FakeRegistry(http.server.BaseHTTPRequestHandler):
    """Just the v2 calls the lab and `ironserve lock` make: HEAD/PUT manifests, HEAD/POST/PUT blobs."""

    blobs: dict[str, bytes] = {}
    manifests: dict[tuple[str, str], bytes] = {}

    def log_message(self, *args):
        pass

    def _send(self, code, headers=None, body=b""):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        parts = self.path.split("/")
        if "manifests" in parts:
            repo, ref = "/".join(parts[2:-2]), parts[-1]
            blob = self.manifests.get((repo, ref))
            if blob is None:
                return self._send(404)
            return self._send(200, {"Docker-Content-Digest": "sha256:" + hashlib.sha256(blob).hexdigest()})
        return self._send(200 if parts[-1] in self.blobs else 404)

    def do_POST(self):
        self._send(202, {"Location": self.path + "upload-1"})

    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if "/manifests/" in self.path:
            parts = self.path.split("/")
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
            self.manifests[("/".join(parts[2:-2]), parts[-1])] = body
            self.manifests[("/".join(parts[2:-2]), digest)] = body
            return self._send(201)
        digest = self.path.split("digest=")[1]
        assert digest == "sha256:" + hashlib.sha256(body).hexdigest()
        self.blobs[digest] = body
        self._send(201)


@pytest.fixture()
def registry():
    FakeRegistry.blobs, FakeRegistry.manifests = {}, {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_push_then_resolve_the_tag(tmp_path, registry):
    src = tmp_path / "src"
    (src / "opt").mkdir(parents=True)
    (src / "opt" / "hello").write_text("hi\n")
    store, ref = tmp_path / "store", tmp_path / "store" / "images" / "x.json"
    layer = oci.layer_from_dir(store, src, normalize_mtime=True)
    again = oci.layer_from_dir(store, src, normalize_mtime=True)
    assert layer == again  # a layer's digest depends on its content only
    image = oci.write_image(store, ref, [layer], {"Cmd": ["python3"]}, ["test"])
    client = Registry(registry, scheme="http")
    assert client.digest("ironserve-lab/x", "1") is None
    pushed = oci.push(client, store, ref, "ironserve-lab/x", ["1"])
    assert pushed == image["manifest_digest"] == client.digest("ironserve-lab/x", "1")
    assert set(FakeRegistry.blobs) == {layer["digest"], image["config_digest"]}
    manifest = json.loads(FakeRegistry.manifests[("ironserve-lab/x", "1")])
    assert manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert manifest["layers"][0]["digest"] == layer["digest"]
    # a plain tar layer (the lab's bridge is local): its digest is its diff_id, its blob a tar Docker unpacks
    assert manifest["layers"][0]["mediaType"] == "application/vnd.docker.image.rootfs.diff.tar"
    assert layer["digest"] == layer["diff_id"]
    with tarfile.open(oci.blob_path(store, layer["digest"])) as tar:
        assert tar.extractfile("./opt/hello").read() == b"hi\n"


def test_a_seeded_blob_is_not_uploaded(tmp_path, registry):
    """The lab puts layers into its registry's storage as hard links (registry.seed_blob): what the seed takes is not
    uploaded; what it refuses (another filesystem) is."""
    src = tmp_path / "src"
    (src / "opt").mkdir(parents=True)
    (src / "opt" / "hello").write_text("hi\n")
    store, ref = tmp_path / "store", tmp_path / "store" / "images" / "x.json"
    layer = oci.layer_from_dir(store, src, normalize_mtime=True)
    image = oci.write_image(store, ref, [layer], {"Cmd": ["python3"]}, ["test"])
    seeded = []

    def seed(repo, digest, path):
        seeded.append((repo, digest, path))
        return digest == layer["digest"]

    client = Registry(registry, scheme="http")
    assert oci.push(client, store, ref, "ironserve-lab/x", ["1"], seed=seed) == image["manifest_digest"]
    assert set(FakeRegistry.blobs) == {image["config_digest"]}  # the layer was seeded, the config uploaded
    assert ("ironserve-lab/x", layer["digest"], oci.blob_path(store, layer["digest"])) in seeded


def test_reference_parsing():
    assert imagelock.split_reference("lmsysorg/sglang:v1") == ("registry-1.docker.io", "lmsysorg/sglang", "v1")
    assert imagelock.split_reference("ubuntu") == ("registry-1.docker.io", "library/ubuntu", "latest")
    assert imagelock.split_reference("docker.io/ubuntu:24.04") == ("registry-1.docker.io", "library/ubuntu", "24.04")
    assert imagelock.split_reference("docker.io/lmsysorg/sglang") == (
        "registry-1.docker.io",
        "lmsysorg/sglang",
        "latest",
    )
    assert imagelock.split_reference("nvcr.io/nvidia/x:1.1") == ("nvcr.io", "nvidia/x", "1.1")
    assert imagelock.split_reference("10.0.0.5:5000/team/img:2") == ("10.0.0.5:5000", "team/img", "2")
    assert repository_path("ubuntu") == "library/ubuntu"


def _recipes(tmp_path: Path) -> Path:
    """A copy of the catalogue to write locks into (the repository stays untouched)."""
    return unlocked_catalogue(tmp_path)


def test_lock_writes_the_digest_and_loading_applies_it(tmp_path, registry, monkeypatch, capsys):
    recipes = _recipes(tmp_path)
    monkeypatch.setenv("IRONSERVE_CATALOGUE", str(recipes))
    digest = "sha256:" + "ab" * 32
    FakeRegistry.manifests[("ironserve-lab/sglang-cpu", "0.5.23")] = b"{}"
    digest = "sha256:" + hashlib.sha256(b"{}").hexdigest()
    monkeypatch.setattr(imagelock, "Registry", lambda address, ca: Registry(address, ca, scheme="http"))
    assert cli.main(["lock", "tiny-cpu-docker", "--registry", registry]) == 0
    lock = json.loads((recipes / "tiny-cpu-docker.lock.json").read_text())
    assert lock == {
        "recipe": "tiny-cpu-docker",
        "docker": {"image": "ironserve-lab/sglang-cpu:0.5.23", "digest": digest, "registry": registry},
    }
    assert "1 lock file(s) written" in capsys.readouterr().out
    assert catalogue.load_recipe_file(recipes / "tiny-cpu-docker.yaml").runtime.digest == digest
    assert catalogue.load_recipe_file(recipes / "tiny-cpu-docker.yaml", locked=False).runtime.digest is None
    # a lock for another tag is stale: not applied
    lock["docker"]["image"] = "ironserve-lab/sglang-cpu:0.5.22"
    (recipes / "tiny-cpu-docker.lock.json").write_text(json.dumps(lock))
    assert catalogue.load_recipe_file(recipes / "tiny-cpu-docker.yaml").runtime.digest is None


def test_lock_of_a_tag_the_registry_lacks_names_the_fix(tmp_path, registry, monkeypatch, capsys):
    monkeypatch.setenv("IRONSERVE_CATALOGUE", str(_recipes(tmp_path)))
    monkeypatch.setattr(imagelock, "Registry", lambda address, ca: Registry(address, ca, scheme="http"))
    assert cli.main(["lock", "tiny-cpu-docker", "--registry", registry]) != 0
    err = capsys.readouterr().err
    assert "has no tag 0.5.23" in err and "push the image there" in err


def _ctx(recipe: str, **data):
    hosts = [("h1", {"hardware": "cpu-lab", "recipe": recipe, **data})]
    return build_context("tiny", "h1", hosts)


def test_deploy_refuses_an_image_nothing_pins(tmp_path, monkeypatch):
    monkeypatch.setenv("IRONSERVE_CATALOGUE", str(_recipes(tmp_path)))
    with pytest.raises(SpecError) as err:
        require_pinned_image(_ctx("tiny-cpu-docker"))
    assert "ironserve lock tiny-cpu-docker" in str(err.value) and "docker_allow_unpinned" in str(err.value)
    require_pinned_image(_ctx("tiny-cpu-docker", docker_allow_unpinned=True))
    imagelock.write(
        tmp_path / "recipes" / "tiny-cpu-docker.lock.json",
        {"docker": {"image": "ironserve-lab/sglang-cpu:0.5.23", "digest": "sha256:" + "0" * 64}},
    )
    catalogue._catalogue_cached.cache_clear()
    try:
        ctx = _ctx("tiny-cpu-docker")
        require_pinned_image(ctx)
        assert ctx.recipe.runtime.digest == "sha256:" + "0" * 64
        # the units run the locked image: the derived image's Dockerfile starts FROM it
        assert "ironserve-lab/sglang-cpu@sha256:" + "0" * 64 in ctx.recipe.runtime.pinned_ref
    finally:
        catalogue._catalogue_cached.cache_clear()


def _gpu_ctx(recipe: str, **data):
    hosts = [("h1", {"hardware": "rtx6000-pro-maxq", "recipe": recipe, **data})]
    return build_context("glm5", "h1", hosts)


def test_a_site_lock_pins_the_sites_digest_in_place_of_the_upstream_one(tmp_path):
    """A site whose registry holds rebuilt images: the deploy, the units and the audit run the site's digest,
    and only while the entry replaces the digest the recipe pins."""
    recipe = catalogue.get_recipe("glm5-nvfp4-mtp-rtx6000-tp8")
    upstream, site = recipe.runtime.digest, "sha256:" + "5" * 64
    lock = tmp_path / "site-lock.json"
    imagelock.write(lock, {"docker": {recipe.runtime.image: imagelock.site_entry(site, upstream)}})
    ctx = _gpu_ctx(recipe.id, docker_image_lock=str(lock))
    assert ctx.recipe.runtime.digest == site and ctx.recipe.runtime.image == recipe.runtime.image
    assert f"lmsysorg/sglang@{site}" in ctx.recipe.runtime.pinned_ref
    assert upstream not in json.dumps([p.argv for p in ctx.processes], default=str)
    # without the site lock: the recipe's own pin
    assert _gpu_ctx(recipe.id).recipe.runtime.digest == upstream
    # the recipe moved on to another upstream digest: the site's entry is stale, the deploy stops and says why
    imagelock.write(lock, {"docker": {recipe.runtime.image: imagelock.site_entry(site, "sha256:" + "7" * 64)}})
    with pytest.raises(SpecError) as err:
        _gpu_ctx(recipe.id, docker_image_lock=str(lock))
    assert "stale" in str(err.value) and "ironserve lock --all --site" in str(err.value)
    with pytest.raises(SpecError, match="names no file"):
        _gpu_ctx(recipe.id, docker_image_lock=str(tmp_path / "missing.json"))


def test_a_site_lock_pins_a_tag_and_names_the_sites_repository(tmp_path):
    """A tag-only recipe needs no docker_allow_unpinned where the site lock pins it; an image Docker cannot
    mirror (not Docker Hub) runs from the repository the site lock names."""
    recipe = catalogue.get_recipe("glm5-nvfp4-gb200-disagg")
    assert recipe.runtime.digest is None and recipe.runtime.image.startswith("nvcr.io/")
    site = "sha256:" + "6" * 64
    lock = tmp_path / "site-lock.json"
    imagelock.write(
        lock,
        {
            "docker": {
                recipe.runtime.image: imagelock.site_entry(
                    site, None, "registry.site:5000/nvidia/ai-dynamo/sglang-runtime"
                )
            }
        },
    )
    hosts = [
        (f"h{i}", {"hardware": "gb200", "recipe": recipe.id, "nic": "eth0", "docker_image_lock": str(lock)})
        for i in range(1, 6)
    ]
    ctx = build_context("glm5", "h1", hosts)
    require_pinned_image(ctx)
    assert ctx.recipe.runtime.image == "registry.site:5000/nvidia/ai-dynamo/sglang-runtime:1.1.1-cuda13"
    assert ctx.recipe.runtime.pinned_ref == f"registry.site:5000/nvidia/ai-dynamo/sglang-runtime@{site}"
    # a site lock's values are data checked like the recipe's: a repository that is no image name is refused
    imagelock.write(
        lock,
        {"docker": {recipe.runtime.image: imagelock.site_entry(site, None, "registry.site:5000/x;touch /tmp/pwned")}},
    )
    with pytest.raises(SpecError, match="repository"):
        build_context("glm5", "h1", hosts)


def test_lock_site_resolves_every_docker_image_in_the_sites_registry(tmp_path, registry, monkeypatch, capsys):
    """`ironserve lock --all --site FILE`: one entry per image, each replacing its recipe's pin, the non-Docker-Hub
    image under its path in the site's registry; the deploy then takes it (docker_image_lock)."""
    monkeypatch.setattr(imagelock, "Registry", lambda address, ca: Registry(address, ca, scheme="http"))
    docker = {r.runtime.image: r for r in catalogue.catalogue().values() if r.runtime.kind == "docker"}
    for image in docker:
        _, path, tag = imagelock.split_reference(image)
        FakeRegistry.manifests[(path, tag)] = image.encode()
    site = tmp_path / "site-lock.json"
    assert cli.main(["lock", "--all", "--site", str(site), "--registry", registry]) == 0
    data = json.loads(site.read_text())["docker"]
    assert set(data) == set(docker)
    for image, recipe in docker.items():
        assert data[image]["digest"] == "sha256:" + hashlib.sha256(image.encode()).hexdigest()
        assert data[image]["replaces"] == recipe.runtime.digest
    gb200 = "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.1.1-cuda13"
    assert data[gb200]["repository"] == f"{registry}/nvidia/ai-dynamo/sglang-runtime"
    assert data["lmsysorg/sglang:glm5-blackwell"]["repository"] is None  # Docker pulls it through its mirror
    assert "in place of sha256:426d1fa4" in capsys.readouterr().out
    ctx = _gpu_ctx("glm5-nvfp4-mtp-rtx6000-tp8", docker_image_lock=str(site))
    assert ctx.recipe.runtime.digest == data["lmsysorg/sglang:glm5-blackwell"]["digest"]
