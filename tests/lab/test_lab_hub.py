"""The lab's Hugging Face-compatible hub (lab/ironserve_lab/hubd.py, hub.py), offline: no root, no lab; the server
on loopback, spoken to as huggingface_hub 1.x speaks to a hub (its request paths and the headers it reads). The real
`hf download` runs against it in the lab (tests/e2e/cpu3)."""

from __future__ import annotations

import hashlib
import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from ironserve_lab import hub, state, tiny_model

from ironserve import catalogue

REPO = "ironserve-lab/tiny-llama"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    model = tiny_model.generate(root / "models" / "tiny-llama")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status = root / "served.json"
    proc = hub.start_local("127.0.0.1", port, {REPO: str(model)}, status, root / "pid")
    yield f"http://127.0.0.1:{port}", status, model
    proc.kill()
    proc.wait()


def ask(url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_the_revision_info_names_the_commit_and_every_files_hashes(served):
    base, _status, model = served
    code, _, body = ask(f"{base}/api/models/{REPO}/revision/main?blobs=true")
    info = json.loads(body)
    assert code == 200 and info["id"] == REPO and len(info["sha"]) == 40
    siblings = {s["rfilename"]: s for s in info["siblings"]}
    assert set(siblings) == set(tiny_model.files()) | {tiny_model.MANIFEST}
    weights = (model / "model.safetensors").read_bytes()
    assert siblings["model.safetensors"]["lfs"] == {
        "sha256": hashlib.sha256(weights).hexdigest(),
        "size": len(weights),
        "pointerSize": 134,
    }
    config = (model / "config.json").read_bytes()
    assert siblings["config.json"]["blobId"] == hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    assert "lfs" not in siblings["config.json"]
    plain = json.loads(ask(f"{base}/api/models/{REPO}")[2])
    assert plain["sha"] == info["sha"] and "blobId" not in plain["siblings"][0]
    tree = json.loads(ask(f"{base}/api/models/{REPO}/tree/{info['sha']}?recursive=true&expand=false")[2])
    assert {e["path"]: e["oid"] for e in tree} == {p: s["blobId"] for p, s in siblings.items()}
    assert (
        next(e for e in tree if e["path"] == "model.safetensors")["lfs"]["oid"] == hashlib.sha256(weights).hexdigest()
    )


def test_resolve_answers_head_and_ranges_with_the_hubs_headers(served):
    base, _status, model = served
    weights = (model / "model.safetensors").read_bytes()
    code, headers, body = ask(f"{base}/{REPO}/resolve/main/model.safetensors", method="HEAD")
    commit = json.loads(ask(f"{base}/api/models/{REPO}")[2])["sha"]
    assert code == 200 and body == b"" and headers["X-Repo-Commit"] == commit
    assert headers["X-Linked-Etag"] == headers["ETag"] == f'"{hashlib.sha256(weights).hexdigest()}"'
    assert headers["X-Linked-Size"] == headers["Content-Length"] == str(len(weights))
    code, headers, body = ask(f"{base}/{REPO}/resolve/{commit}/model.safetensors", headers={"Range": "bytes=1000-"})
    assert (
        code == 206
        and body == weights[1000:]
        and headers["Content-Range"] == f"bytes 1000-{len(weights) - 1}/{len(weights)}"
    )
    code, headers, _ = ask(f"{base}/{REPO}/resolve/main/config.json", method="HEAD")
    assert "X-Linked-Etag" not in headers and headers["ETag"].strip('"') != hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize(
    "path, code",
    [
        ("/api/models/nobody/nothing", "RepoNotFound"),
        (f"/api/models/{REPO}/revision/v9", "RevisionNotFound"),
        (f"/{REPO}/resolve/main/nothing.json", "EntryNotFound"),
        (f"/{REPO}/resolve/v9/config.json", "RevisionNotFound"),
    ],
)
def test_what_the_hub_does_not_have_is_a_404_with_the_hubs_error_code(served, path, code):
    status, headers, _ = ask(served[0] + path)
    assert status == 404 and headers["X-Error-Code"] == code


def test_every_byte_served_is_counted_per_repository(served):
    base, status_file, model = served
    time.sleep(0.5)
    before = json.loads(status_file.read_text())
    _, _, body = ask(f"{base}/{REPO}/resolve/main/tokenizer.json")
    time.sleep(0.5)  # the file is rewritten once each answer is out (this one's, and any before it)
    before_bytes = before["repos"][REPO]["bytes_served"]
    after = json.loads(status_file.read_text())
    assert after["repos"][REPO]["bytes_served"] - before_bytes == len(body)
    assert after["model_bytes"] == sum(p.stat().st_size for p in model.iterdir() if p.is_file())
    assert after["repos"][REPO]["files"] == 7


def test_lab_status_reports_the_hub(served, tmp_path):
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "served.json").write_text(served[1].read_text())
    report = hub.status(tmp_path, "http://10.213.7.1:8781")
    assert report["url"] == "http://10.213.7.1:8781" and report["running"] is False
    assert report["bytes_served"] > 0 and report["model_bytes"] > 0 and REPO in report["repos"]
    assert hub.url() == f"http://{state.GATEWAY}:{state.HUB_PORT}"


def test_the_hub_serves_the_generated_model_under_the_hub_id_its_recipes_name(tmp_path):
    repos = hub.served_repos(tmp_path, ["tiny-llama"])
    assert repos == {REPO: str(tmp_path / "tiny-llama")}
    named = {r.id for r in catalogue.catalogue().values() if r.model.generate == "tiny-llama"}
    assert named and all(catalogue.get_recipe(r).model.hub_id == REPO for r in named)
    assert hub.served_repos(tmp_path, []) == {}
