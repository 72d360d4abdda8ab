"""The lab's managed Pythons (lab/ironserve_lab/interpreters.py): uv's install_only layout, a relocated interpreter,
and a download list in uv's format whose hash is the archive's."""

from __future__ import annotations

import hashlib
import json
import tarfile

from ironserve_lab import interpreters


def fake_build(root, version="3.12.7"):
    prefix = root / version
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib" / "python3.12" / "test").mkdir(parents=True)
    (prefix / "lib" / "python3.12" / "site-packages" / "pip").mkdir(parents=True)
    (prefix / "lib" / "python3.12" / "os.py").write_text("# stdlib\n")
    (prefix / "lib" / "python3.12" / "test" / "test_os.py").write_text("# left out\n")
    (prefix / "lib" / "python3.12" / "site-packages" / "pip" / "__init__.py").write_text("# left out\n")
    (prefix / "lib" / "libpython3.12.so.1.0").write_bytes(b"\x7fELF lib")
    (prefix / "bin" / "python3.12").write_bytes(b"\x7fELF..." + f"{prefix}/lib".encode() + b"\0rest")
    (prefix / "bin" / "python3.12").chmod(0o755)
    (prefix / "bin" / "python3").symlink_to("python3.12")
    return prefix


def test_archive_is_uvs_install_only_layout_with_a_relocated_interpreter(tmp_path):
    prefix = fake_build(tmp_path / "versions")
    assert interpreters.find_build("3.12", tmp_path / "versions") == prefix
    assert interpreters.find_build("3.13", tmp_path / "versions") is None
    tarball = interpreters.archive(prefix, tmp_path / "cache")
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        binary = tar.extractfile("python/bin/python3.12").read()
        assert tar.getmember("python/bin/python3").issym()
        assert tar.getmember("python/bin/python3.12").mode & 0o111
    assert "python/lib/python3.12/os.py" in names and "python/lib/libpython3.12.so.1.0" in names
    assert not any("/test/" in n or n.endswith("/test") or "site-packages/pip" in n for n in names)
    # same length: the ELF's string table keeps its offsets
    assert len(binary) == len((prefix / "bin" / "python3.12").read_bytes())
    assert str(prefix).encode() not in binary and b"$ORIGIN/../lib\0" in binary and binary.endswith(b"\0rest")


def test_download_list_names_each_archive_with_its_hash(tmp_path, monkeypatch):
    fake_build(tmp_path / "versions")
    monkeypatch.setattr(interpreters, "PYTHONS_DIR", tmp_path / "versions")
    published = interpreters.publish(tmp_path / "supply", "http://10.213.7.1:8780/python", tmp_path / "cache")
    assert published == {"3.12": "3.12.7"}
    entries = json.loads((tmp_path / "supply" / interpreters.LIST_NAME).read_text())
    entry = entries["cpython-3.12.7-linux-x86_64-gnu"]
    archive = tmp_path / "supply" / entry["url"].rsplit("/", 1)[1]
    assert entry["url"].startswith("http://10.213.7.1:8780/python/") and archive.is_file()
    assert entry["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert (entry["major"], entry["minor"], entry["patch"], entry["os"], entry["libc"]) == (3, 12, 7, "linux", "gnu")
    monkeypatch.setattr(interpreters, "PYTHONS_DIR", tmp_path / "none")
    assert interpreters.publish(tmp_path / "supply2", "http://x/python", tmp_path / "cache") == {}
