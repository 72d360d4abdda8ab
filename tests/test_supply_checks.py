"""What runs as root on a host is verified (issue 32, supply chain), each check run for real in a shell here:
fetched apt keys pinned by fingerprint (roles/apt_keys.py, with gpg), installers and the uv tarball checked
against an inventory sha256 (roles/common.sha256_checked), the host data that names them, and the lab supplying
its own key's fingerprint and its installers' sums."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from ironserve_lab import supply

from ironserve.hostdata import NVIDIA_CUDA_KEY_FINGERPRINT, validate_host_data
from ironserve.problems import SpecError
from roles.apt_keys import KeyFingerprints, fetch_verified_command
from roles.common import sha256_checked

needs_gpg = pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed here")


def _sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


def _key(tmp_path: Path, name: str) -> tuple[Path, str]:
    """An armored public key made for the test, and its fingerprint."""
    home = tmp_path / f"gpg-{name}"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--quiet"]
    try:
        subprocess.run(
            [
                *gpg,
                "--passphrase",
                "",
                "--quick-gen-key",
                f"{name} <{name}@ironserve.invalid>",
                "ed25519",
                "sign",
                "never",
            ],
            check=True,
            capture_output=True,
        )
        armored = subprocess.run([*gpg, "--armor", "--export"], check=True, capture_output=True).stdout
        listing = subprocess.run([*gpg, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True)
    path = tmp_path / f"{name}.asc"
    path.write_bytes(armored)
    fingerprint = next(line.split(":")[9] for line in listing.stdout.splitlines() if line.startswith("fpr:"))
    return path, fingerprint


@needs_gpg
def test_a_fetched_key_is_installed_only_when_it_is_the_pinned_one(tmp_path):
    """The old role installed whatever key the mirror served (curl | gpg --dearmor)."""
    vendor, fingerprint = _key(tmp_path, "vendor")
    mirror, other = _key(tmp_path, "mirror")
    dest = tmp_path / "keyrings" / "ironserve-nvidia.gpg"
    dest.parent.mkdir()
    # the mirror serves its own key in place of the vendor's: refused, nothing installed, the message says all
    bad = _sh(fetch_verified_command(mirror.as_uri(), str(dest), fingerprint, "gpu1", dearmor=True))
    assert bad.returncode != 0
    assert f"gpu1: apt key {mirror.as_uri()}: expected the key {fingerprint}, found {other}" in bad.stderr
    assert not dest.exists() and not list(dest.parent.iterdir())
    # both keys in one file (a key appended to the vendor's would sign packages too): refused
    both = tmp_path / "both.asc"
    both.write_bytes(vendor.read_bytes() + mirror.read_bytes())
    assert _sh(fetch_verified_command(both.as_uri(), str(dest), fingerprint, "gpu1", dearmor=True)).returncode != 0
    assert not dest.exists()
    # the vendor's key: installed, dearmored into a binary keyring
    good = _sh(fetch_verified_command(vendor.as_uri(), str(dest), fingerprint, "gpu1", dearmor=True))
    assert good.returncode == 0, good.stderr
    assert not dest.read_bytes().startswith(b"-----BEGIN") and dest.stat().st_mode & 0o777 == 0o644
    # what the fact reads of it: exactly the pinned key (the operation's no-op), of the double file: both
    fact = KeyFingerprints()
    assert fact.process(_sh(fact.command(str(dest))).stdout.splitlines()) == [fingerprint]
    assert fact.process(_sh(fact.command(str(both))).stdout.splitlines()) == [fingerprint, other]
    assert fact.process(_sh(fact.command(str(tmp_path / "missing.gpg"))).stdout.splitlines()) == []


def test_an_installer_runs_only_when_its_sha256_is_the_inventorys(tmp_path):
    """The old roles ran a .run package (and unpacked uv_url) as root without any checksum."""
    installer = tmp_path / "Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run"
    installer.write_text('#!/bin/sh\ntouch "$(dirname "$0")/ran"\n')
    installer.chmod(0o755)
    vetted = hashlib.sha256(installer.read_bytes()).hexdigest()
    ok = _sh(f"{sha256_checked(str(installer), vetted, 'Ascend toolkit installer', 'npu1')} && {installer}")
    assert ok.returncode == 0 and (tmp_path / "ran").exists()
    (tmp_path / "ran").unlink()
    installer.write_text('#!/bin/sh\ntouch "$(dirname "$0")/ran"\necho swapped\n')
    found = hashlib.sha256(installer.read_bytes()).hexdigest()
    bad = _sh(f"{sha256_checked(str(installer), vetted, 'Ascend toolkit installer', 'npu1')} && {installer}")
    assert bad.returncode != 0 and not (tmp_path / "ran").exists()
    assert (f"npu1: Ascend toolkit installer {installer}: sha256 expected {vetted}, found {found}") in bad.stderr
    assert not installer.exists()  # removed: the next run fetches it again


def test_host_data_names_the_checksums_and_fingerprints():
    assert validate_host_data({}, "inv", "h").nvidia_apt_key_fingerprint == NVIDIA_CUDA_KEY_FINGERPRINT
    with pytest.raises(SpecError) as err:
        validate_host_data({"uv_url": "https://files.example/uv-x86_64-unknown-linux-gnu.tar.gz"}, "inv", "h")
    assert err.value.problems[0].field == "h.uv_sha256" and "sha256sum" in err.value.problems[0].fix
    for key, value in (
        ("nvidia_apt_key_fingerprint", "3bf863cc"),
        ("uv_sha256", "abc"),
        ("ascend_package_sha256", {"a.run": "x" * 64}),
    ):
        with pytest.raises(SpecError) as err:
            validate_host_data({key: value}, "inv", "h")
        assert err.value.problems[0].field.startswith(f"h.{key}")


@needs_gpg
def test_the_lab_supplies_its_keys_fingerprint_and_its_installers_sums(tmp_path):
    key, fingerprint = _key(tmp_path, "lab")
    apt = supply.ensure_dirs(tmp_path) / "apt"
    assert supply.key_fingerprint(tmp_path) == ""  # an unsigned lab repository: nothing to pin
    shutil.copy(key, apt / supply.ARMORED_KEY_NAME)
    assert supply.key_fingerprint(tmp_path) == fingerprint
    run = supply.supply_dir(tmp_path) / "ascend" / "Ascend-cann-nnal_8.3.RC1_linux-x86_64.run"
    run.write_bytes(b"installer")
    assert supply.file_sums(tmp_path, "ascend") == {run.name: hashlib.sha256(b"installer").hexdigest()}
