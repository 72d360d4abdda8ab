"""Vendor apt keys pinned by fingerprint: a key fetched over the network goes into a keyring only when it is the key
the inventory names (host data ``nvidia_apt_key_fingerprint``, ``docker_apt_key_fingerprint``,
``nvidia_container_key_fingerprint``; the vendors' published fingerprints by default).

A key fetched from the mirror it is meant to verify proves nothing by itself: whoever controls the mirror serves
packages and key alike. So the host downloads the key to a temporary file, reads its primary keys with
``gpg --show-keys --with-colons`` and installs it only when it holds exactly the pinned key (a second key appended
to the file would sign packages too). A mismatch stops the deploy naming host, URL, expected and found fingerprints,
and leaves no keyring behind. The fact ``KeyFingerprints`` makes the operation idempotent: a keyring that already
holds exactly the pinned key is left alone; any other (an older download, another key) is replaced.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation

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
