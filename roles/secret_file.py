"""Secret files: the one operation for every secret a host keeps (env files holding the API key, the Hugging Face
token, the rank groups' shared secrets), and the controller side of secrets (reading them, generating them).

``secret_file(path, secret)`` makes ``path`` a file holding exactly the secret, ``0600 root:root``, and nothing on
the way shows it or leaves it readable:

- compared by digest: the fact ``SecretFileState`` reports mode, owner and a sha256 of (path, content) computed on
  the host, never the content. Same digest, mode and owner = no-op;
- no world-readable moment, with or without sudo: the content is uploaded (SFTP, as the SSH user) into a fresh
  ``mktemp -d`` directory (0700, only that user can enter it), then, as root with ``umask 077``, copied into a
  temporary file next to the destination (born 0600), chowned, and renamed over the destination; the upload
  directory is removed whatever happens. pyinfra's own upload with sudo (a 0644 file in /tmp, copied into place
  before its chmod) is never used for a secret;
- nothing to show: the write runs when the operation executes (a FunctionCommand whose arguments are the path and
  the mode), so ``--dry``, ``--diff``, ``-v`` and ``--debug`` print the path and a digest prefix, never a value
  (``--diff`` has no old content to read either: this is not a files.put). ``Secret`` prints as ``Secret(<hidden>)``.

Controller side: ``read_secret`` (host data ``*_file`` keys point at files on the controller) and
``generated_secret`` (secrets the deploy creates, e.g. a rank group's: generated once on the controller, kept 0600
in host data ``secret_dir`` [~/.config/ironserve/secrets], so every run and every host of the group gets the same
one; delete the file to rotate it).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, FunctionCommand, OperationError, operation

from roles.common import uses_sudo, word_lines

SECRET_DIR = "~/.config/ironserve/secrets"


class Secret:
    """A secret value that never prints: repr/str hide it; ``reveal()`` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def digest(self, path: str) -> str:
        """What SecretFileState computes on the host for a file at ``path`` holding this secret."""
        return hashlib.sha256(path.encode() + b"\n" + self._value.encode()).hexdigest()

    def __repr__(self) -> str:
        return "Secret(<hidden>)"

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def write_secret(self, state, host, path: str, mode: str, user: str, group: str) -> bool:
        """Executed by the operation (FunctionCommand): private upload, then a 0600-born copy renamed into place."""
        sudo = uses_sudo(host)
        ok, out = host.run_shell_command("umask 077 && mktemp -d")
        upload_dir = "".join(out.stdout_lines).strip() if ok else ""
        if not upload_dir.startswith("/"):
            host.log_styled(f"{path}: cannot make a private upload directory: {out.stderr}", fg="red")
            return False
        staged = f"{upload_dir}/secret"
        try:
            if not host.put_file(StringIO(self._value), staged):
                return False
            parent = shlex.quote(os.path.dirname(path) or "/")
            # the temporary file beside the target (same file system: the rename is atomic), one quoted word
            template = shlex.quote(os.path.join(os.path.dirname(path) or "/", f".{os.path.basename(path)}.XXXXXX"))
            install = (
                f"umask 077 && {{ [ -d {parent} ] || install -d -m 755 {parent}; }} && "
                f'tmp=$(mktemp {template}) && cat {shlex.quote(staged)} > "$tmp" && '
                f'chown {shlex.quote(f"{user}:{group}")} "$tmp" && chmod {shlex.quote(mode)} "$tmp" && '
                f'mv -f "$tmp" {shlex.quote(path)} || {{ rm -f "$tmp"; exit 1; }}'
            )
            ok, out = host.run_shell_command(f"sh -c {shlex.quote(install)}", _sudo=sudo)
            if not ok:
                host.log_styled(f"{path}: could not put the secret in place: {out.stderr}", fg="red")
            return bool(ok)
        finally:
            host.run_shell_command(f"rm -rf {shlex.quote(upload_dir)}", _sudo=sudo)


class SecretFileState(FactBase):
    """{mode, user, group, sha256} of a file, the digest over (path, content) taken on the host; None if absent.
    Never the content."""

    def command(self, path):
        q = shlex.quote(path)
        return (
            f"if [ -f {q} ]; then stat -c 'stat %a %U %G' {q} && "
            f"{{ printf '%s\\n' {q}; cat {q}; }} | sha256sum | sed 's/ .*//; s/^/sha256 /'; fi"
        )

    def process(self, output):
        state = {}
        for kind, rest in word_lines(output):
            if kind == "stat":
                state["mode"], state["user"], state["group"] = rest.split(" ", 2)
            elif kind == "sha256":
                state["sha256"] = rest
        return state or None


@operation()
def secret_file(path: str, secret: Secret | str, mode: str = "600", user: str = "root", group: str = "root"):
    """``path`` holds exactly ``secret``, ``mode`` (default 0600), ``user:group``; written with no readable
    moment and never shown (see the module docstring)."""
    secret = secret if isinstance(secret, Secret) else Secret(secret)
    want = secret.digest(path)
    have = host.get_fact(SecretFileState, path=path)
    if (
        have
        and have.get("sha256") == want
        and (have.get("mode"), have.get("user"), have.get("group")) == (mode.lstrip("0") or "0", user, group)
    ):
        # no digest shown, not even a prefix: a hash of a short key confirms a guess of it offline
        host.noop(f"{path}: secret in place ({mode} {user}:{group})")
        return
    yield FunctionCommand(secret.write_secret, (path, mode, user, group), {})


# --------------------------------------------------------------------------- the controller's side


def read_secret(path: str, what: str) -> Secret:
    """A secret from a file on the controller (host data *_file keys), stripped."""
    file = Path(os.path.expanduser(path))
    if not file.is_file():
        raise OperationError(
            f"{what}: {file} does not exist on this machine (host data points at a file on the "
            "controller, not on the host)"
        )
    value = file.read_text().strip()
    if not value or "\n" in value:
        raise OperationError(f"{what}: {file} must hold exactly one non-empty line")
    return Secret(value)


def generated_secret(name: str, secret_dir: str | None = None) -> Secret:
    """A secret this controller generated once (64 hex digits) and keeps, 0600 in a 0700 directory: the same for
    every run and every host that asks for ``name``."""
    directory = Path(os.path.expanduser(secret_dir or SECRET_DIR))
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_secret(str(path), f"generated secret {name}")
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return read_secret(str(path), f"generated secret {name}")
