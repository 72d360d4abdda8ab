"""Seeding the lab registry's storage with this machine's image blobs (lab/ironserve_lab/registry.py), offline.

The registry serving seeded blobs to the hosts' real Docker engines is shown by every lab bring-up of a fresh lab
directory (tests/e2e/test_deploy_glm5_lab.py pulls the stand-in image by digest; benchmarks/cold_demo.py).
"""

from __future__ import annotations

import errno
import hashlib

import pytest
from ironserve_lab import registry
from ironserve_lab.system import LabError


def _blob(tmp_path, data: bytes = b"layer bytes"):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = tmp_path / "store" / digest.removeprefix("sha256:")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest, path


def test_a_seeded_blob_is_a_hard_link_in_the_registrys_layout(tmp_path):
    """The distribution registry's own layout: blobs/sha256/<2>/<hex>/data, and the repository's layer link naming
    the digest (what a finished upload writes); seeding twice, or into a second repository, links again."""
    root = tmp_path / "lab"
    digest, source = _blob(tmp_path)
    hexdigest = digest.removeprefix("sha256:")
    v2 = root / "registry/data/docker/registry/v2"
    assert registry.seed_blob(root, "lmsysorg/sglang", digest, source)
    data = v2 / "blobs/sha256" / hexdigest[:2] / hexdigest / "data"
    assert data.read_bytes() == b"layer bytes" and data.stat().st_ino == source.stat().st_ino
    for repo in ("lmsysorg/sglang", "nvidia/ai-dynamo"):
        assert registry.seed_blob(root, repo, digest, source)
        assert (v2 / "repositories" / repo / "_layers/sha256" / hexdigest / "link").read_text() == digest
    assert [p.name for p in data.parent.iterdir()] == ["data"]  # no staged link left behind


def test_a_blob_that_cannot_be_linked_is_left_to_the_upload(tmp_path, monkeypatch):
    digest, source = _blob(tmp_path)

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(registry.os, "link", cross_device)
    assert not registry.seed_blob(tmp_path / "lab", "lmsysorg/sglang", digest, source)
    assert not list((tmp_path / "lab").rglob("link"))  # the repository is not told of a blob it does not hold


@pytest.mark.parametrize(
    ("repo", "digest"),
    [("../escape", "sha256:" + "0" * 64), ("lmsysorg/sglang", "sha256:../../x"), ("Upper/case", "sha256:" + "0" * 64)],
)
def test_names_outside_the_grammar_are_refused(tmp_path, repo, digest):
    _, source = _blob(tmp_path)
    with pytest.raises(LabError, match="not a"):
        registry.seed_blob(tmp_path / "lab", repo, digest, source)
    assert not (tmp_path / "lab").exists()
