#!/usr/bin/env python3
"""ironserve-converged: what this host looked like after a deploy that found nothing to change, and whether it
still does.

    ironserve-converged record INPUTS READS_JSON   # run the reads, keep their digests with the deployment's INPUTS
    ironserve-converged check [INPUTS]             # run the kept reads again: {"inputs": ..., "changed": [...]}
    ironserve-converged forget                     # a deploy is about to act on this host: no record until it is done

The deploy (roles/converged.py) records after a run that planned and ran no change on any host: the digest of the
deployment's inputs, and a light read of everything that run read of this host (the files it manages by their
inode status, which changes with any write, even one that restores the mtime; the package database; its own
reads for the rest). The next run checks every host in one command each and plans nothing when all of them match.

READS_JSON: ``[[label, {"paths": [...], "dirs": [...], "sums": [...], "units": [...], "props": [...], "sh": command}],
...]``: paths or globs read by inode status (``paths``), a directory's own status, not its entries (``dirs``), a
regular file's contents (``sums``), systemd units' properties (``units`` with ``props``: one ``systemctl show`` for
all the reads' units), a command's output (``sh``: a command several reads name runs once). ``check INPUTS`` answers
without running any read when the record is of other inputs (that run plans in full anyway). The record is root's,
0600, in a directory only root can write; anything else is no record. Standard library only.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import secrets
import stat
import subprocess
import sys

STAMP = "/var/lib/ironserve/converged.json"
READ_TIMEOUT_S = 60  # the reads are stat calls and short commands; a hung one is a changed one


def _path_status(path: str) -> str:
    """A path's inode status: every write to it, or to its mode, owner or links, changes the ctime."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} error {exc.errno}"
    fields = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_ino, st.st_dev, st.st_size, st.st_uid]
    fields += [st.st_gid, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns]
    if stat.S_ISLNK(st.st_mode):
        fields.append(os.readlink(path))
    return f"{path} " + " ".join(str(f) for f in fields)


def _dir_status(path: str) -> str:
    """A directory's own status (what makes it, its mode and owner), not its entries: files other parts write in a
    managed directory (metrics, a guard's state) change nothing a directory's operation acts on."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} error {exc.errno}"
    return (
        f"{path} {stat.S_IFMT(st.st_mode)} {stat.S_IMODE(st.st_mode)} {st.st_ino} {st.st_dev} {st.st_uid} {st.st_gid}"
    )


def _content_status(path: str) -> str:
    """A regular file's contents (never a link's target, a device or a pipe: read as root, in directories that may
    be another user's)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"{path} error {exc.errno}"
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            return f"{path} {stat.S_IFMT(mode)}"
        digest = hashlib.sha256()
        for chunk in iter(lambda: handle.read(1 << 16), b""):
            digest.update(chunk)
    return f"{path} {digest.hexdigest()}"


_STATUS = {"paths": _path_status, "dirs": _dir_status, "sums": _content_status}


def _paths_read(patterns: list[str], status=_path_status) -> str:
    lines = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        lines += [status(p) for p in found] or [f"{pattern} no match"]
    return "\n".join(lines)


def _read(spec: dict) -> str:
    return "\n".join(f"{kind}:\n" + _paths_read(spec[kind], _STATUS[kind]) for kind in _STATUS if kind in spec)


def _units_shown(reads: list) -> dict[tuple[str, str], str]:
    """Every ``units`` read's units and properties in one ``systemctl show`` (each unit's block in the order asked):
    {(unit, property): value}; a unit systemd does not know shows its defaults, a failed call shows nothing."""
    units = sorted({u for _, spec in reads for u in spec.get("units", [])})
    props = sorted({p for _, spec in reads for p in spec.get("props", [])} | {"Id"})
    if not units:
        return {}
    argv = ["systemctl", "show", "--all", *(f"--property={p}" for p in props), "--", *units]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=READ_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    blocks = out.split("\n\n")
    shown = {}
    for unit, block in zip(units, blocks if len(blocks) == len(units) else []):
        for line in block.strip().splitlines():
            key, _, value = line.partition("=")
            shown[(unit, key)] = value
    return shown


def _units_read(spec: dict, shown: dict) -> str:
    return "\n".join(f"{u} {p}={shown.get((u, p), '?')}" for u in spec["units"] for p in spec["props"])


def _shell_reads(commands: list[str]) -> list[str]:
    """Each command's exit status and output, all in one shell. The commands are facts' own reads as the deploy
    composed them (their values quoted there, ironserve/batch.py's way); this script is standalone (standard
    library only), so it marks them itself, with a nonce no output can forge."""
    if not commands:
        return []
    unique = list(dict.fromkeys(commands))  # a command several facts share (a file, a device query) runs once
    if len(unique) < len(commands):
        answers = dict(zip(unique, _shell_reads(unique)))
        return [answers[c] for c in commands]
    mark = f"ironserve-converged-{secrets.token_hex(8)}"
    script = "".join(f"( {cmd}\n) </dev/null 2>&1; printf '\\n{mark} %s\\n' \"$?\"\n" for cmd in commands)
    try:
        out = subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, errors="replace", timeout=READ_TIMEOUT_S
        ).stdout
    except subprocess.TimeoutExpired:
        return ["timeout"] * len(commands)
    parts = out.split(f"\n{mark} ")
    answers = [parts[0]] + [p.split("\n", 1)[1] if "\n" in p else "" for p in parts[1:-1]]
    codes = [p.split("\n", 1)[0] for p in parts[1:]]
    if len(codes) != len(commands):
        return ["cut off"] * len(commands)
    return [f"rc {code}\n{answer}" for code, answer in zip(codes, answers)]


def digests(reads: list) -> list[str]:
    """The sha256 of each read's answer, in order."""
    shell = [spec["sh"] for _, spec in reads if "sh" in spec]
    answers = iter(_shell_reads(shell))
    shown = _units_shown(reads)
    out = []
    for _, spec in reads:
        parts = [next(answers)] if "sh" in spec else []
        parts += [_units_read(spec, shown)] if "units" in spec else []
        parts += [_read(spec)] if set(spec) & set(_STATUS) else []
        out.append(hashlib.sha256("\n".join(parts).encode()).hexdigest())
    return out


def valid_reads(reads) -> bool:
    def absolute(paths) -> bool:
        return isinstance(paths, list) and all(isinstance(p, str) and p.startswith("/") for p in paths)

    def one(item) -> bool:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)):
            return False
        spec = item[1]
        paths = {k: v for k, v in spec.items() if k in _STATUS}
        if "sh" in spec and not isinstance(spec["sh"], str):
            return False
        if ("units" in spec) != ("props" in spec) or not all(_names(spec.get(k, ["x"])) for k in ("units", "props")):
            return False
        return bool(spec) and set(spec) <= {*_STATUS, "sh", "units", "props"} and all(map(absolute, paths.values()))

    return isinstance(reads, list) and all(one(item) for item in reads)


def _names(values) -> bool:
    """Unit and property names: no option, no path, nothing a shell or systemctl reads as anything else."""
    ok = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@._:-\\")
    return isinstance(values, list) and bool(values) and all(
        isinstance(v, str) and v and not v.startswith("-") and set(v) <= ok for v in values
    )


def _private_dir(directory: str) -> bool:
    """Root's, and writable by no one else (root never writes where another user could swap a path)."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def load(path: str = STAMP) -> dict | None:
    """The record, when root's 0600 file in a private directory holds a valid one."""
    if not _private_dir(os.path.dirname(path)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as handle:
        st = os.fstat(handle.fileno())
        if st.st_uid != 0 or st.st_mode & 0o077:
            return None
        try:
            record = json.load(handle)
        except ValueError:
            return None
    ok = isinstance(record, dict) and isinstance(record.get("inputs"), str) and valid_reads(record.get("reads"))
    return record if ok and len(record.get("digests", [])) == len(record["reads"]) else None


def record(inputs: str, reads: list, path: str = STAMP) -> str:
    """Run the reads and keep their digests: the file is born 0600 under a temporary name, then renamed."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    if not _private_dir(directory):
        return f"not recorded: {directory} is not root's alone"
    text = json.dumps({"inputs": inputs, "reads": reads, "digests": digests(reads)})
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return f"recorded {len(reads)} reads"


def check(path: str = STAMP, inputs: str | None = None) -> dict:
    """{"inputs": the recorded inputs, "changed": labels of the reads that differ now} or {"why": no record}. With
    the run's INPUTS, a record of others is answered at once: no read can make that run plan nothing."""
    kept = load(path)
    if kept is None:
        return {"inputs": None, "changed": [], "why": "no record of a converged run"}
    if inputs is not None and kept["inputs"] != inputs:
        return {"inputs": kept["inputs"], "changed": [], "reads": 0}
    now = digests(kept["reads"])
    changed = [label for (label, _), was, is_ in zip(kept["reads"], kept["digests"], now) if was != is_]
    return {"inputs": kept["inputs"], "changed": changed, "reads": len(now)}


def forget(path: str = STAMP) -> str:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return "no record"
    return "forgotten"


def main(argv: list[str]) -> int:
    if argv[1:2] == ["check"] and len(argv) in (2, 3):
        print(json.dumps(check(inputs=argv[2] if len(argv) == 3 else None)))
        return 0
    if argv[1:2] == ["forget"] and len(argv) == 2:
        print(forget())
        return 0
    if argv[1:2] == ["record"] and len(argv) == 4:
        try:
            reads = json.loads(argv[3])
        except ValueError:
            reads = None
        if not valid_reads(reads):
            print("ironserve-converged: READS_JSON is not a list of reads", file=sys.stderr)
            return 2
        print(record(argv[2], reads))
        return 0
    print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
