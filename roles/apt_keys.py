"""Vendor apt keys pinned by fingerprint: a key fetched over the network goes into a keyring only when it is the key
the inventory names (host data ``nvidia_apt_key_fingerprint``, ``docker_apt_key_fingerprint``,
``nvidia_container_key_fingerprint``; the vendors' published fingerprints by default).

A key fetched from the mirror it is meant to verify proves nothing by itself: whoever controls the mirror serves
packages and key alike. So the host downloads the key to a temporary file, reads its primary keys with
``gpg --show-keys --with-colons`` and installs it only when it holds exactly the pinned key (a second key appended
to the file would sign packages too). A mismatch stops the deploy naming host, URL, expected and found fingerprints,
and leaves no keyring behind. The fact ``KeyFingerprints`` makes the operation idempotent: a keyring that already
holds exactly the pinned key is left alone; any other (an older download, another key) is replaced.

``vendor_keyring`` is what a role's vendor repository is signed by (Docker's, NVIDIA's container toolkit's): no key
with host data ``apt_trusted``, the cluster's keyring with ``apt_signed_by``, else the vendor's key pinned as above.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation
from pyinfra.operations import apt, files

from roles.context import DeploymentContext

KEYRING_DIR = "/etc/apt/keyrings"

# primary key fingerprints of a key file (armored or binary); gpg needs a home, never root's own
_SHOW_KEYS = (
    'home=$(mktemp -d) && gpg --homedir "$home" --batch --quiet --show-keys --with-colons {path} '
    '2>/dev/null | awk -F: \'$1 == "pub" {{p = 1}} $1 == "fpr" && p {{print $10; p = 0}}\'; '
    'rm -rf "$home"'
)


class KeyFingerprints(FactBase):
    """The primary key fingerprints in a key file ([] when the file is missing or holds no key)."""

    def command(self, path):
        return f"[ -f {shlex.quote(path)} ] && {{ {_SHOW_KEYS.format(path=shlex.quote(path))}; }}; true"

    def process(self, output):
        return [line.strip() for line in output if line.strip()]


def fetch_verified_command(url: str, dest: str, fingerprint: str, host_name: str, dearmor: bool) -> str:
    """Download ``url``, check that it holds exactly the key ``fingerprint``, then install it at ``dest`` (dearmored
    into a binary keyring when ``dearmor`` and the download is armored)."""
    q = shlex.quote
    tmp = dest + ".download"
    message = f"{host_name}: apt key {url}: expected the key {fingerprint}, found "
    install = (
        f"if grep -q 'BEGIN PGP' {q(tmp)}; then gpg --batch --yes --dearmor -o {q(dest)} {q(tmp)}; "
        f"else mv {q(tmp)} {q(dest)}; fi"
        if dearmor
        else f"mv {q(tmp)} {q(dest)}"
    )
    return (
        f"curl -fsSL {q(url)} -o {q(tmp)} && "
        f"found=$({_SHOW_KEYS.format(path=q(tmp))}) && "
        f"if [ \"$found\" != {q(fingerprint)} ]; then echo {q(message)}\"${{found:-no key}}\" | tr '\\n' ' ' >&2; "
        f"rm -f {q(tmp)}; exit 1; fi && {install} && rm -f {q(tmp)} && chmod 644 {q(dest)}"
    )


@operation()
def pinned_key(url: str, dest: str, fingerprint: str, dearmor: bool = False):
    """The apt key at ``url`` installed at ``dest`` when it is exactly the key ``fingerprint`` (else the deploy stops
    and nothing is installed); a keyring already holding just that key is left alone."""
    if host.get_fact(KeyFingerprints, path=dest) == [fingerprint]:
        host.noop(f"{dest} holds the key {fingerprint}")
        return
    yield fetch_verified_command(url, dest, fingerprint, host.name, dearmor)


def vendor_keyring(ctx: DeploymentContext, name: str, url: str, fingerprint: str) -> tuple[str | None, bool]:
    """(Signed-By path, trusted) for one vendor repository; downloads the public key when nothing else says, and
    keeps it only when it is exactly the key ``fingerprint`` (pinned_key). With ``apt_trusted`` the source is
    trusted without a key; with ``apt_signed_by`` it is signed by the keyring the cluster already has."""
    if ctx.host.apt_trusted:
        return None, True
    if ctx.host.apt_signed_by:
        return ctx.host.apt_signed_by, False
    path = f"{KEYRING_DIR}/{name}.asc"  # armored keys are fine for Signed-By when named *.asc
    files.directory(name="Keyring directory", path=KEYRING_DIR, mode="755")
    apt.packages(
        name="Tools to fetch and check apt keys", packages=["ca-certificates", "curl", "gpg"], no_recommends=True
    )
    pinned_key(name=f"{name} apt key (pinned by fingerprint)", url=url, dest=path, fingerprint=fingerprint)
    return path, False
