"""The lab's runtimes behind one interface (lab/ironserve_lab/runtime.py), their pins read from requirements files,
and the lab's stand-in hardware read from the catalogue (profiles.py): `lab up` builds a wheelhouse only when it is
missing or incomplete (what it is built from first), says why it could not, and publishes every wheel of it."""

from __future__ import annotations

import json

import pytest
from ironserve_lab import cluster, cpu_runtime, cuda_runtime, npu_runtime, pinfiles, profiles, runtime, supply
from ironserve_lab.system import LabError

from ironserve import catalogue
from ironserve.hostdata import DEFAULTS


class Fake(runtime.LabRuntime):
    """A runtime whose build writes the wheels it is told to (or fails)."""

    name = "fake runtime"
    hardware = ("cpu-lab",)

    def __init__(self, cache: str, wheels: list[str], requires: tuple = (), fails: bool = False):
        self.cache, self.want, self.requires, self.fails, self.builds = cache, wheels, requires, fails, []

    def contents(self) -> str:
        return f"{len(self.want)} wheels"

    def problems(self, wheelhouse):
        return [w for w in self.want if not (wheelhouse / w).is_file()]

    def build(self, wheelhouse):
        for needed in self.requires:  # what it is built from is complete by now
            assert not needed.problems(needed.wheelhouse())
        if self.fails:
            raise runtime.WheelhouseError("pip download failed: no such version")
        wheelhouse.mkdir(parents=True, exist_ok=True)
        for w in self.want:
            (wheelhouse / w).write_bytes(b"wheel")
        self.builds.append(wheelhouse)
        return {"wheels": len(self.want), "bytes": 5 * len(self.want)}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IRONSERVE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_wheelhouse_is_built_once_after_what_it_is_built_from(cache):
    base = Fake("base", ["a-1-py3-none-any.whl"])
    top = Fake("top/1.0", ["b-2-py3-none-any.whl"], requires=(base,))
    assert runtime.ensure(top) == cache / "top/1.0"
    assert base.builds == [cache / "base"] and top.builds == [cache / "top/1.0"]
    assert json.loads((cache / "top/1.0/build.json").read_text())["wheels"] == 1
    runtime.ensure(top)  # complete: nothing built again
    assert len(base.builds) == len(top.builds) == 1
    (cache / "top/1.0/b-2-py3-none-any.whl").unlink()  # incomplete: built again, its base still complete
    runtime.ensure(top)
    assert len(base.builds) == 1 and len(top.builds) == 2


def test_a_failed_build_is_a_lab_error_naming_the_runtime(cache):
    with pytest.raises(LabError, match="fake runtime wheelhouse could not be built: pip download failed"):
        runtime.ensure(Fake("x", ["a-1-py3-none-any.whl"], fails=True))


def test_publish_puts_every_wheel_of_the_wheelhouse_in_the_lab_index(cache, tmp_path, monkeypatch):
    published = []
    monkeypatch.setattr(supply, "add_wheels", lambda root, wheels: published.extend(wheels) or len(wheels))
    fake = Fake("x", ["b-2-py3-none-any.whl", "a-1-py3-none-any.whl"])
    runtime.publish(tmp_path / "lab", fake)
    assert [w.name for w in published] == ["a-1-py3-none-any.whl", "b-2-py3-none-any.whl"]


def test_the_runtimes_serve_lab_profiles_and_are_built_from_each_other():
    assert cluster.RUNTIMES == (cpu_runtime.RUNTIME, npu_runtime.RUNTIME, cuda_runtime.RUNTIME)
    assert cpu_runtime.RUNTIME.hardware == ("cpu-lab",) and npu_runtime.RUNTIME.hardware == ("atlas-800i-a3",)
    assert cuda_runtime.RUNTIME.hardware == cuda_runtime.HARDWARE
    for r in cluster.RUNTIMES:
        assert set(r.hardware) <= set(profiles.HARDWARE_IDS), r.name
        assert isinstance(r, runtime.LabRuntime) and r.contents()
    assert npu_runtime.RUNTIME.requires == (cpu_runtime.RUNTIME,)
    caches = [r.cache for r in cluster.RUNTIMES]
    assert caches == ["lab-cpu-wheelhouse/0.5.23", "lab-npu-wheelhouse/0.5.10.post1", "lab-cuda-wheelhouse/py312"]


def test_the_cpu_wheelhouse_is_stale_when_its_uv_settings_differ(tmp_path):
    (tmp_path / "requirements.txt").write_text(cpu_runtime.requirements_text())
    (tmp_path / "uv.toml").write_text("# another comment\n" + cpu_runtime.uv_config())
    assert cpu_runtime.stale_files(tmp_path) == []  # comments aside, the same settings
    (tmp_path / "uv.toml").write_text(cpu_runtime.uv_config().replace('"tilelang",', ""))
    assert cpu_runtime.stale_files(tmp_path) == [f"{tmp_path / 'uv.toml'}: not the runtime's exclusions and overrides"]
    problems = cpu_runtime.RUNTIME.problems(tmp_path)
    assert any("sglang==0.5.23: no wheel" in p for p in problems) and any("uv.toml" in p for p in problems)


# --------------------------------------------------------------------------- pins: requirements files


def test_pins_files_read_in_order_without_comments(tmp_path, monkeypatch):
    monkeypatch.setattr(pinfiles, "DIR", tmp_path)
    (tmp_path / "x.txt").write_text("# header\n\nb==2  # why b\na==1\n  c  # why c\n")
    assert pinfiles.read("x.txt") == ["b==2", "a==1", "c"]
    assert pinfiles.commented("x.txt") == {"b==2": "why b", "a==1": "", "c": "why c"}
    assert pinfiles.version(["a==1", "ab==2"], "ab") == "2"
    with pytest.raises(KeyError, match="no torch==VERSION"):
        pinfiles.version(["a==1"], "torch")


def test_the_runtimes_pins_are_their_requirements_files():
    assert cpu_runtime.REQUIREMENTS == pinfiles.read("cpu.txt") and cpu_runtime.SHIM_VERSION == "0.1.0"
    assert list(cpu_runtime.EXCLUDED) == pinfiles.read("cpu-excludes.txt") and all(cpu_runtime.EXCLUDED.values())
    assert npu_runtime.REAL_PINS + [f"{n}=={v[0]}" for n, v in npu_runtime.STANDINS.items()] == pinfiles.read("npu.txt")
    for key, r in cuda_runtime.RUNTIMES.items():
        assert sorted([*r.real, *r.standins]) == sorted(pinfiles.read(f"cuda-{key}.txt"))
    # what the roles install beside the runtimes: their versions
    assert f"uv=={DEFAULTS.uv_version}" in cluster.DEFAULT_WHEELS
    assert f"sglang-router=={cpu_runtime.ROUTER_VERSION}" in cluster.DEFAULT_WHEELS


# --------------------------------------------------------------------------- hardware: the catalogue's profiles


def test_the_stand_in_profiles_are_the_catalogues():
    hardware = catalogue.load_hardware(catalogue.recipes_dir() / "hardware.yaml")
    assert profiles.HARDWARE_IDS == ("rtx6000-pro", "rtx6000-pro-maxq", "gb200", "atlas-800i-a3", "cpu-lab")
    # every device figure is one a catalogue profile names; every profile without one is left out
    assert set(profiles.DEVICES) == {p.accelerator.name for pid, p in hardware.items() if pid in profiles.PROFILES} - {
        "none"
    }
    for pid, answer in profiles.PROFILES.items():
        acc = hardware[pid].accelerator
        if acc.vendor == "none":
            assert answer == {"kind": "none"}
            continue
        assert (answer["name"], answer["count"]) == (acc.name, acc.count)
        memory = answer.get("memory_mib", answer.get("hbm_mib"))
        assert acc.memory_gib * 1024 * 0.98 <= memory <= acc.memory_gib * 1024 * 1.01, pid  # what the driver reports
    rtx = profiles.PROFILES["rtx6000-pro-maxq"]
    assert (rtx["compute_cap"], rtx["nvlink"], profiles.PROFILES["gb200"]["nvlink"]) == ("12.0", False, True)
    assert profiles.DRIVER_VERSION == f"{hardware['gb200'].driver_branch}.95.05" == "580.95.05"
    assert profiles.CUDA_VERSION == hardware["gb200"].toolkit == "13.0"
    assert (profiles.ASCEND_DRIVER_VERSION, profiles.CANN_VERSION) == ("25.2.0", "8.3.RC1")
    assert profiles.PROFILES["atlas-800i-a3"] == {
        "kind": "ascend",
        "count": 16,
        "name": "Ascend910",
        "chip_name": "910C",
        "hbm_mib": 65536,
        "driver_version": "25.2.0",
    }


def test_compute_capability_from_the_architecture():
    assert [profiles._compute_cap(a) for a in ("sm120", "sm100", "sm103", "sm90")] == ["12.0", "10.0", "10.3", "9.0"]
