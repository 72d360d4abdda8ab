"""The lab's in-memory build trees (lab/ironserve_lab/scratch.py): a tmpfs when memory allows, disk otherwise, gone
after either way, and a killed build's leftovers (its mounts too) cleared first."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from ironserve_lab import cluster, rootfs, runtime_image, scratch, system

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")


def _mount_type(path: Path) -> str | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(path):
            return fields[2]
    return None


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   12582912 kB\n")
    assert scratch.available_gib(meminfo) == 12
    meminfo.write_text("MemTotal:       24576000 kB\n")
    assert scratch.available_gib(meminfo) == 0


def test_short_of_memory_the_build_goes_to_disk_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(scratch, "available_gib", lambda: scratch.HEADROOM_GIB + 1.5)
    where = tmp_path / "build"
    with scratch.scratch_dir(where, 2, "test image") as in_memory:
        assert not in_memory and where.is_dir() and _mount_type(where) is None
        (where / "file").write_text("x")
    assert not where.exists()
    said = capsys.readouterr().err
    assert "test image: built on disk, slower: 5.5 GiB of memory available, where a tmpfs for it wants 6 " in said


@needs_root
def test_with_memory_the_build_is_a_tmpfs_gone_after(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch, "available_gib", lambda: scratch.HEADROOM_GIB + 2)
    where = tmp_path / "build"
    with scratch.scratch_dir(where, 2, "test image") as in_memory:
        assert in_memory and _mount_type(where) == "tmpfs"
        (where / "file").write_text("x")
    assert _mount_type(where) is None and not where.exists()


@needs_root
def test_a_killed_builds_tree_and_mounts_are_cleared_first(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch, "available_gib", lambda: 0)
    where = tmp_path / "build"
    (where / "merged").mkdir(parents=True)
    (where / "stale").write_text("from the killed build")
    subprocess.run(["mount", "-t", "tmpfs", "leftover", str(where / "merged")], check=True)
    try:
        with scratch.scratch_dir(where, 2, "test image"):
            assert _mount_type(where / "merged") is None and list(where.iterdir()) == []
    finally:
        system.unmount_tree(where)
    assert not where.exists()


@needs_root
def test_lab_down_finds_and_clears_a_killed_builds_tmpfs(tmp_path, monkeypatch):
    """`lab up` killed mid-build leaves its tmpfs mounted: `lab down` lists it among its leftovers and clears it."""
    monkeypatch.setattr(runtime_image, "cache_dir", lambda: tmp_path / "cache")
    root = tmp_path / "lab"
    trees = cluster._build_trees(root)
    assert trees == [rootfs.build_dir(root), runtime_image.build_dir()]
    for tree in trees:
        tree.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "killed-build", str(tree)], check=True)
    try:
        found = cluster.leftovers(root)
        assert all(f"mount {tree}" in found for tree in trees), found
        for tree in trees:
            scratch.clear(tree)
        assert not [line for line in cluster.leftovers(root) if str(tmp_path) in line]
    finally:
        for tree in trees:
            system.unmount_tree(tree)
