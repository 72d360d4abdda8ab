"""The lab's Ascend runtime supply (lab/ironserve_lab/npu_runtime.py): it covers the Atlas recipes' pins, its stand-ins
carry the Atlas build's metadata, and a rebranded wheel installs as the distribution it stands in for."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile

import pytest
from ironserve_lab import npu_runtime
from ironserve_lab.wheels import rebrand_wheel, write_wheel

from ironserve import catalogue
from ironserve.spec import UvRuntime


def _pins(packages):
    return dict(p.partition("==")[::2] for p in packages)


def test_every_atlas_pin_is_a_real_wheel_or_a_standin_of_that_version():
    supply = {**_pins(npu_runtime.REAL_PINS), **{n: v[0] for n, v in npu_runtime.STANDINS.items()}}
    atlas = [r for r in catalogue.catalogue().values() if "atlas-800i-a3" in r.hardware]
    assert len(atlas) == 9
    for recipe in atlas:
        assert isinstance(recipe.runtime, UvRuntime)
        for name, version in _pins([*recipe.runtime.packages, *recipe.runtime.overrides]).items():
            assert supply.get(name) == version, (recipe.id, name)
        # nothing the recipe excludes is served under another name's pins
        assert not set(recipe.runtime.excludes) & set(supply), recipe.id


def test_torch_standin_has_the_atlas_metadata_without_the_x86_64_cuda_lines():
    meta = npu_runtime.standin_metadata("torch")
    assert "Version: 2.8.0" in meta and "Requires-Dist: sympy>=1.13.3" in meta
    assert "nvidia" not in meta and "triton" not in meta and "x86_64" not in meta
    assert "Provides-Extra: optree" in meta


def _wheel_with(tmp_path, name, version, members, entry_points=None):
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    path = write_wheel(tmp_path / "src", name, version, members, meta, [name])
    if entry_points:
        with zipfile.ZipFile(path, "a") as zf:
            zf.writestr(f"{name}-{version}.dist-info/entry_points.txt", entry_points)
    return path


def test_standins_placeholders_and_entry_points(tmp_path):
    cpu = tmp_path / "cpu"
    _wheel_with(
        cpu,
        "torch",
        "2.13.0+cpu",
        {"torch/__init__.py": b"REAL = True\n"},
        "[console_scripts]\ntorchrun = torch.distributed.run:main\n",
    )
    built = {p.name.split("-")[0]: p for p in npu_runtime.build_standins(tmp_path / "out", cpu / "src")}
    assert set(built) == {"torch", "torch_npu", "torchvision", "triton_ascend", "memfabric_hybrid"}
    names = {k: zipfile.ZipFile(p).namelist() for k, p in built.items()}
    # torch-npu's real torch.backends entry point would make `import torch` load it (CANN): not in the stand-in
    assert not any(n.endswith("entry_points.txt") for n in names["torch_npu"])
    # triton-ascend ships `triton`, here the real triton's: metadata only, no package that would overwrite it
    assert all(".dist-info/" in n for n in names["triton_ascend"])
    assert "torchvision/transforms/__init__.py" in names["torchvision"]
    torch = zipfile.ZipFile(built["torch"])
    assert torch.read("torch/__init__.py") == b"REAL = True\n"  # the CPU build's files
    assert "torchrun" in torch.read("torch-2.8.0.dist-info/entry_points.txt").decode()
    assert not any(n.startswith("torch-2.13.0") for n in names["torch"])


def test_rebranded_wheel_records_and_installs_as_the_standin(tmp_path):
    src = _wheel_with(tmp_path, "realpkg", "9.9", {"realpkg/__init__.py": b"X = 1\n", "realpkg/bin.so": b"\x7fELF"})
    meta = "Metadata-Version: 2.1\nName: standin\nVersion: 1.2.3\nRequires-Dist: realdep==1\n"
    out = rebrand_wheel(src, tmp_path / "out", "standin", "1.2.3", meta, "py3-none-any")
    zf = zipfile.ZipFile(out)
    record = zf.read("standin-1.2.3.dist-info/RECORD").decode().splitlines()
    for line in record:
        path, digest, size = line.rsplit(",", 2)
        if digest:
            data = zf.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
    assert zf.read("standin-1.2.3.dist-info/top_level.txt") == b"realpkg\n"
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target), str(out)],
        capture_output=True,
        text=True,
    )
    if proc.returncode and "No module named pip" in proc.stderr:
        pytest.skip("no pip in this interpreter")
    assert proc.returncode == 0, proc.stderr
    assert (target / "realpkg" / "__init__.py").read_bytes() == b"X = 1\n"
    assert (target / "standin-1.2.3.dist-info" / "METADATA").read_text() == meta
