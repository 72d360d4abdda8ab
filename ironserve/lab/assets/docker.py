#!/usr/bin/python3
"""ironserve lab stand-in for the docker CLI (package docker-ce-cli). Lab only: never install elsewhere.

No engine runs and no registry exists in the lab. This script answers what ironserve's roles ask a
Docker host, with image and container records in /var/lib/docker-standin/state.json:

  pull REF (repo:tag or repo@sha256:...)  from the lab "registry": /etc/ironlab/docker-registry.json,
                                          written by `ironserve lab up` from the catalogue's docker
                                          recipes (anything else fails: "manifest unknown")
  tag SRC DST, rmi, images, image inspect / container inspect / inspect [--format GO-TEMPLATE]
  build [-t T] [--label K=V] [-f F] [--build-arg ...] DIR   records the image (labels, parent, the
                                          Dockerfile); RUN/COPY lines are recorded, NOT executed
  run / create, stop, rm, ps, info, version
`run` of an image: the image "is" the PyPI SGLang its recipes' engine.check_version names (plus, for an
engine era, the flags the real image has beyond it: image_extras, via /usr/lib/docker-standin). Python
(`--entrypoint python3 IMAGE /script ...`, `python3 -c ...`) runs in the lab machine's cached CPU parser
venv of that version (bind-mounted read-only into the host at its own path), with the container's -v
mounts mapped back to host paths: ironserve's parse probe runs SGLang's real parser. An engine launch
(python3 -m sglang.launch_server, sglang serve, the router) fails: "stand-in image cannot serve".
A hub download (hf / huggingface-cli) fails: there is no hub in the lab.

Overrides for tests: IRONLAB_DOCKER_REGISTRY, IRONLAB_DOCKER_STATE, IRONLAB_DOCKER_SOCK ("none": no
daemon check), IRONLAB_DOCKER_LIB.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

VERSION = "28.5.1"
API_VERSION = "1.51"
REGISTRY = os.environ.get("IRONLAB_DOCKER_REGISTRY", "/etc/ironlab/docker-registry.json")
STATE_DIR = os.environ.get("IRONLAB_DOCKER_STATE", "/var/lib/docker-standin")
SOCK = os.environ.get("IRONLAB_DOCKER_SOCK", "/var/run/docker.sock")
LIB = os.environ.get("IRONLAB_DOCKER_LIB", "/usr/lib/docker-standin")  # sitecustomize.py: the image extras
DAEMON_JSON = "/etc/docker/daemon.json"
IMAGE_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EPOCH = "2026-03-01T00:00:00Z"


class Fail(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- Go text/template (the subset docker users write)

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<lp>\()|(?P<rp>\))|(?P<pipe>\|)'
                    r'|(?P<num>-?\d+(?:\.\d+)?)|(?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)'
                    r'|(?P<var>\$[A-Za-z0-9_]*)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))')


class TemplateError(Exception):
    pass


def _parse_template(text: str) -> list:
    items: list = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(text):
        chunk = text[pos:m.start()]
        if trim_next:
            chunk = chunk.lstrip()
        if m.group(1):
            chunk = chunk.rstrip()
        items.append(("text", chunk))
        items.append(("action", m.group(2).strip()))
        trim_next = bool(m.group(3))
        pos = m.end()
    chunk = text[pos:]
    items.append(("text", chunk.lstrip() if trim_next else chunk))
    root: list = []
    stack = [(None, root)]
    for kind, value in items:
        body = stack[-1][1]
        if kind == "text":
            if value:
                body.append(("text", value))
            continue
        word = value.split(None, 1)[0] if value else ""
        if word in ("range", "if", "with"):
            node = [word, value[len(word):].strip(), [], None]
            body.append(node)
            stack.append((node, node[2]))
        elif word == "else":
            node = stack[-1][0]
            if node is None:
                raise TemplateError("unexpected {{else}}")
            node[3] = []
            stack[-1] = (node, node[3])
        elif word == "end":
            if len(stack) == 1:
                raise TemplateError("unexpected {{end}}")
            stack.pop()
        elif value.startswith("/*"):
            continue
        else:
            body.append(("action", value))
    if len(stack) != 1:
        raise TemplateError("unexpected EOF")
    return root


def _tokens(expr: str) -> list:
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"bad character in {expr!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _pipeline(tokens: list, i: int) -> tuple[list, int]:
    commands, current = [], []
    while i < len(tokens):
        kind, value = tokens[i]
        if kind == "rp":
            break
        if kind == "pipe":
            commands.append(current)
            current = []
            i += 1
            continue
        if kind == "lp":
            sub, i = _pipeline(tokens, i + 1)
            if i >= len(tokens) or tokens[i][0] != "rp":
                raise TemplateError("unclosed left paren")
            current.append(("sub", sub))
            i += 1
            continue
        current.append((kind, value))
        i += 1
    commands.append(current)
    return commands, i


def _field(data, path: str):
    value = data
    for part in [p for p in path.split(".") if p]:
        if isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def _fmt(value, top: bool = True) -> str:
    if value is None:
        return "<no value>" if top else "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    if isinstance(value, list):
        return "[" + " ".join(_fmt(v, False) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_fmt(value[k], False)}" for k in sorted(value)) + "]"
    return str(value)


def _index(value, *keys):
    for key in keys:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int):
            if not 0 <= key < len(value):
                raise TemplateError(f"error calling index: index out of range: {key}")
            value = value[key]
        elif value is None:
            return None
        else:
            raise TemplateError(f"error calling index: cannot index {type(value).__name__}")
    return value


def _print(*args) -> str:
    out = ""
    for n, a in enumerate(args):
        if n and not isinstance(a, str) and not isinstance(args[n - 1], str):
            out += " "
        out += _fmt(a, False) if a is not None else "<nil>"
    return out


def _printf(fmt: str, *args) -> str:
    values = iter(args)

    def repl(m):
        if m.group(0) == "%%":
            return "%"
        v = next(values, None)
        return json.dumps(v) if m.group(1) == "q" else _fmt(v, False)
    return re.sub(r"%%|%[-+# 0-9.]*([svdqt])", repl, fmt)


FUNCS = {
    "json": lambda v: json.dumps(v, separators=(",", ":"), sort_keys=True, ensure_ascii=False),
    "index": _index,
    "split": lambda s, sep: str(s).split(sep),
    "join": lambda items, sep: sep.join(_fmt(i, False) for i in (items or [])),
    "print": _print,
    "println": lambda *a: " ".join(_fmt(x, False) for x in a) + "\n",
    "printf": _printf,
    "len": lambda v: len(v or []),
    "upper": lambda s: str(s).upper(),
    "lower": lambda s: str(s).lower(),
    "title": lambda s: str(s).title(),
    "eq": lambda a, *b: any(a == x for x in b),
    "ne": lambda a, b: a != b,
    "not": lambda a: not a,
    "and": lambda *a: next((x for x in a if not x), a[-1]),
    "or": lambda *a: next((x for x in a if x), a[-1]),
}


def _operand(op, dot, root):
    kind, value = op
    if kind == "field":
        return dot if value == "." else _field(dot, value)
    if kind == "var":
        return root if value == "$" else None
    if kind == "str":
        return json.loads(value)
    if kind == "raw":
        return value[1:-1]
    if kind == "num":
        return float(value) if "." in value else int(value)
    if kind == "sub":
        return _eval(value, dot, root)
    if kind == "ident":
        if value in ("true", "false"):
            return value == "true"
        if value == "nil":
            return None
        if value in FUNCS:
            return FUNCS[value]()
        raise TemplateError(f'function "{value}" not defined')
    raise TemplateError(f"unexpected {value!r}")


def _eval(commands: list, dot, root):
    result, piped = None, False
    for command in commands:
        if not command:
            raise TemplateError("missing command")
        head = command[0]
        if head[0] == "ident" and head[1] in FUNCS:
            args = [_operand(op, dot, root) for op in command[1:]]
            if piped:
                args.append(result)
            try:
                result = FUNCS[head[1]](*args)
            except TypeError as exc:
                raise TemplateError(f"wrong number of args for {head[1]}: {exc}") from None
        else:
            if len(command) > 1 or piped:
                raise TemplateError(f"can't give argument to non-function {head[1]}")
            result = _operand(head, dot, root)
        piped = True
    return result


def _truth(value) -> bool:
    return bool(value) and value != 0


def _run_nodes(nodes: list, dot, root, out: list) -> None:
    for node in nodes:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "action":
            value = _eval(_pipeline(_tokens(node[1]), 0)[0], dot, root)
            out.append(value if isinstance(value, str) else _fmt(value))
        else:
            word, expr, body, other = node
            value = _eval(_pipeline(_tokens(expr), 0)[0], dot, root)
            if word == "range":
                items = [value[k] for k in sorted(value)] if isinstance(value, dict) else list(value or [])
                for item in items:
                    _run_nodes(body, item, root, out)
                if not items and other is not None:
                    _run_nodes(other, dot, root, out)
            elif _truth(value):
                _run_nodes(body, value if word == "with" else dot, root, out)
            elif other is not None:
                _run_nodes(other, dot, root, out)


def render(template: str, data) -> str:
    out: list = []
    _run_nodes(_parse_template(template), data, data, out)
    return "".join(out)


# ---------------------------------------------------------------- references

def familiar(ref: str) -> str:
    for prefix in ("docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/"):
        if ref.startswith(prefix):
            return ref[len(prefix):]
    return ref


def full_name(repo: str) -> str:
    first = repo.split("/")[0]
    if "/" in repo and ("." in first or ":" in first or first == "localhost"):
        return repo
    return f"docker.io/{repo}" if "/" in repo else f"docker.io/library/{repo}"


_REF = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+|__)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*)*"
                  r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


def parse_ref(ref: str) -> tuple[str, str | None, str | None]:
    """'repo:tag' / 'repo@sha256:..' / 'repo' -> (familiar repo, tag, digest); tag 'latest' when neither."""
    ref = familiar(ref)
    if not _REF.match(ref):
        raise Fail("invalid reference format")
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    tag = None
    if ":" in ref.split("/")[-1]:
        ref, tag = ref.rsplit(":", 1)
    if tag is None and digest is None:
        tag = "latest"
    return ref, tag, digest


def short_id(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:12]


# ---------------------------------------------------------------- state

class State:
    def __init__(self):
        os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
        self.path = os.path.join(STATE_DIR, "state.json")
        self._lock = open(os.path.join(STATE_DIR, ".lock"), "a+")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            with open(self.path) as fh:
                self.data = json.load(fh)
        except (OSError, ValueError):
            self.data = {}
        self.images: dict = self.data.setdefault("images", {})
        self.containers: dict = self.data.setdefault("containers", {})

    def close(self) -> None:
        self._lock.close()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self.data, fh, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def find_image(self, ref: str) -> dict | None:
        bare = ref.split(":", 1)[-1] if ref.startswith("sha256:") else ref
        if re.fullmatch(r"[0-9a-f]{12,64}", bare) or ref.startswith("sha256:"):
            hits = [i for i in self.images.values() if i["Id"].split(":", 1)[1].startswith(bare)]
            if len(hits) == 1:
                return hits[0]
            if ref.startswith("sha256:"):
                return None
        try:
            repo, tag, digest = parse_ref(ref)
        except Fail:
            return None
        for image in self.images.values():
            if digest and f"{repo}@{digest}" in image["RepoDigests"]:
                return image
            if not digest and f"{repo}:{tag}" in image["RepoTags"]:
                return image
        return None

    def find_container(self, ref: str) -> dict | None:
        name = ref.lstrip("/")
        for c in self.containers.values():
            if c["Name"] == "/" + name or c["Id"] == ref or (len(ref) >= 4 and c["Id"].startswith(ref)):
                return c
        return None

    def untag(self, tag: str) -> None:
        for image in self.images.values():
            if tag in image["RepoTags"]:
                image["RepoTags"].remove(tag)


def registry() -> dict:
    try:
        with open(REGISTRY) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {"images": [], "parsers": {}}


def registry_lookup(repo: str, tag: str | None, digest: str | None) -> dict | None:
    for entry in registry().get("images", []):
        if entry["repo"] != repo:
            continue
        if digest and entry["digest"] == digest:
            return entry
        if not digest and tag in entry.get("tags", []):
            return entry
    return None


def image_id_for(digest: str) -> str:
    return "sha256:" + hashlib.sha256(f"ironlab-image-config:{digest}".encode()).hexdigest()


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- daemon

def need_daemon() -> None:
    if SOCK == "none":
        return
    url = f"unix://{SOCK}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(SOCK)
    except PermissionError:
        raise Fail(f"permission denied while trying to connect to the Docker daemon socket at {url}: Get "
                   f"\"http://%2Fvar%2Frun%2Fdocker.sock/v{API_VERSION}/info\": dial unix {SOCK}: connect: "
                   "permission denied")
    except OSError:
        raise Fail(f"Cannot connect to the Docker daemon at {url}. Is the docker daemon running?")
    finally:
        s.close()
    if os.geteuid() != 0 and not os.access(STATE_DIR, os.W_OK):
        raise Fail(f"permission denied while trying to connect to the Docker daemon socket at {url}")


# ---------------------------------------------------------------- pull / tag / rmi / images

def pull_image(st: State, ref: str, quiet: bool = False, out=sys.stdout) -> dict:
    repo, tag, digest = parse_ref(ref)
    shown = f"{repo}@{digest}" if digest else f"{repo}:{tag}"
    entry = registry_lookup(repo, tag, digest)
    if entry is None:
        raise Fail(f"Error response from daemon: manifest for {shown} not found: manifest unknown: manifest unknown")
    image_id = image_id_for(entry["digest"])
    image = st.images.get(image_id)
    fresh = image is None
    if fresh:
        image = st.images[image_id] = {
            "Id": image_id, "RepoTags": [], "RepoDigests": [], "Parent": "", "Comment": "ironserve lab stand-in image",
            "Created": EPOCH, "Architecture": "amd64", "Os": "linux", "Size": 0,
            "Config": {"Env": [IMAGE_PATH], "Cmd": ["/bin/bash"], "Entrypoint": None, "Labels": {},
                       "WorkingDir": "/sgl-workspace"},
            "Metadata": {"LastTagTime": "0001-01-01T00:00:00Z"},
            "IronLab": {"sglang": entry.get("sglang"), "parser_version": entry.get("parser_version"),
                        "image_extras": entry.get("image_extras"), "recipes": entry.get("recipes", []),
                        "registry": [entry["repo"], entry["digest"]], "source": "lab registry"},
        }
    pinned = f"{entry['repo']}@{entry['digest']}"
    if pinned not in image["RepoDigests"]:
        image["RepoDigests"].append(pinned)
    tagged = f"{repo}:{tag}" if tag and not digest else None
    new_tag = bool(tagged) and tagged not in image["RepoTags"]
    if new_tag:
        st.untag(tagged)
        image["RepoTags"].append(tagged)
        image["Metadata"]["LastTagTime"] = now()
    if not quiet:
        print(f"{digest or tag}: Pulling from {repo}", file=out)
        if fresh:
            print(f"{short_id(image_id)}: Pull complete (ironserve lab stand-in: no layers)", file=out)
        print(f"Digest: {entry['digest']}", file=out)
        status = "Downloaded newer image for" if fresh or new_tag else "Image is up to date for"
        print(f"Status: {status} {shown}", file=out)
    print(f"{full_name(repo)}{'@' + digest if digest else ':' + tag}", file=out)
    return image


def cmd_pull(args: list[str]) -> int:
    quiet = False
    refs = []
    for a in args:
        if a in ("-q", "--quiet"):
            quiet = True
        elif a in ("-a", "--all-tags", "--disable-content-trust") or a.startswith("--platform"):
            continue
        else:
            refs.append(a)
    if len(refs) != 1:
        raise Fail('"docker pull" requires exactly 1 argument.\nUsage:  docker pull [OPTIONS] NAME[:TAG|@DIGEST]')
    need_daemon()
    st = State()
    pull_image(st, refs[0], quiet)
    st.save()
    return 0


def cmd_tag(args: list[str]) -> int:
    if len(args) != 2:
        raise Fail('"docker tag" requires exactly 2 arguments.\nUsage:  docker tag SOURCE_IMAGE[:TAG] TARGET_IMAGE[:TAG]')
    need_daemon()
    st = State()
    image = st.find_image(args[0])
    if image is None:
        raise Fail(f"Error response from daemon: No such image: {args[0]}")
    repo, tag, digest = parse_ref(args[1])
    if digest:
        raise Fail(f"Error parsing reference: \"{args[1]}\" is not a valid repository/tag: invalid reference format")
    st.untag(f"{repo}:{tag}")
    image["RepoTags"].append(f"{repo}:{tag}")
    image["Metadata"]["LastTagTime"] = now()
    st.save()
    return 0


def cmd_rmi(args: list[str]) -> int:
    refs = [a for a in args if not a.startswith("-")]
    need_daemon()
    st = State()
    rc = 0
    for ref in refs:
        image = st.find_image(ref)
        if image is None:
            err(f"Error response from daemon: No such image: {ref}")
            rc = 1
            continue
        try:
            repo, tag, digest = parse_ref(ref)
            name = f"{repo}:{tag}" if tag and not digest else None
        except Fail:
            name = None
        if name and name in image["RepoTags"] and len(image["RepoTags"]) > 1:
            image["RepoTags"].remove(name)
            print(f"Untagged: {name}")
            continue
        for t in image["RepoTags"] + image["RepoDigests"]:
            print(f"Untagged: {t}")
        del st.images[image["Id"]]
        print(f"Deleted: {image['Id']}")
    st.save()
    return rc


def _format_flag(args: list[str]) -> tuple[str | None, list[str]]:
    fmt, rest, i = None, [], 0
    while i < len(args):
        a = args[i]
        if a in ("-f", "--format"):
            fmt = args[i + 1] if i + 1 < len(args) else ""
            i += 2
            continue
        if a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return fmt, rest


def _table(rows: list[dict], columns: list[tuple[str, str]], fmt: str | None) -> None:
    if fmt and not fmt.startswith("table"):
        for row in rows:
            print(render(fmt, row))
        return
    if fmt:
        spec = fmt[len("table"):].strip()
        columns = [(re.sub(r"[{}.\s]", "", part).upper(), part.strip()) for part in spec.split("\\t")]
    lines = [[h for h, _ in columns]] + [[render(t, row) for _, t in columns] for row in rows]
    widths = [max(len(line[n]) for line in lines) for n in range(len(columns))]
    for line in lines:
        print("   ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())


def cmd_images(args: list[str]) -> int:
    fmt, rest = _format_flag(args)
    quiet = any(a in ("-q", "--quiet") for a in rest)
    want = next((a for a in rest if not a.startswith("-")), None)
    need_daemon()
    st = State()
    rows = []
    for image in sorted(st.images.values(), key=lambda i: i["Id"]):
        tags = image["RepoTags"] or ["<none>:<none>"]
        for t in tags:
            repo, _, tag = t.rpartition(":")
            if want and want not in (repo, t):
                continue
            rows.append({"Repository": repo, "Tag": tag, "ID": short_id(image["Id"]),
                         "CreatedSince": "stand-in", "Size": "0B", "Digest": (image["RepoDigests"] or ["<none>"])[0]})
    if quiet:
        for r in rows:
            print(r["ID"])
        return 0
    _table(rows, [("REPOSITORY", "{{.Repository}}"), ("TAG", "{{.Tag}}"), ("IMAGE ID", "{{.ID}}"),
                  ("CREATED", "{{.CreatedSince}}"), ("SIZE", "{{.Size}}")], fmt)
    return 0


# ---------------------------------------------------------------- inspect

def cmd_inspect(args: list[str], kind: str | None) -> int:
    fmt, rest = _format_flag(args)
    refs = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--type":
            kind = rest[i + 1]
            i += 2
            continue
        if a.startswith("--type="):
            kind = a.split("=", 1)[1]
        elif a in ("-s", "--size"):
            pass
        else:
            refs.append(a)
        i += 1
    if not refs:
        raise Fail(f'"docker {kind + " " if kind else ""}inspect" requires at least 1 argument.')
    need_daemon()
    st = State()
    found, rc = [], 0
    for ref in refs:
        obj = None
        if kind in (None, "container"):
            obj = st.find_container(ref)
        if obj is None and kind in (None, "image"):
            obj = st.find_image(ref)
        if obj is None:
            what = {"image": "image", "container": "container"}.get(kind or "", "object")
            err(f"Error: No such {what}: {ref}")
            rc = 1
            continue
        found.append(obj)
    if fmt is not None:
        for obj in found:
            try:
                print(render(fmt, obj))
            except TemplateError as exc:
                raise Fail(f"template parsing error: template: :1: {exc}")
    else:
        print(json.dumps(found, indent=4))
    return rc


# ---------------------------------------------------------------- build

def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    lines, buf = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        lines.append((word.upper(), rest.strip()))
        buf = ""
    if buf:
        word, _, rest = buf.partition(" ")
        lines.append((word.upper(), rest.strip()))
    return lines


def _subst(text: str, args: dict) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), ""), text)


def cmd_build(args: list[str]) -> int:
    tags, labels, build_args, file, context = [], {}, {}, None, None
    quiet = False
    value_opts = {"--network", "--platform", "--progress", "--target", "--cache-from", "--iidfile", "--secret",
                  "--ssh", "--add-host", "--shm-size", "--ulimit", "-o", "--output", "--builder",
                  "--metadata-file", "--cache-to", "--memory", "-m", "--cgroup-parent", "--isolation"}
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, val = a.partition("=") if a.startswith("--") else (a, "", "")
        takes = name in ("-t", "--tag", "--label", "--build-arg", "-f", "--file") or name in value_opts
        if takes and not eq:
            if i + 1 >= len(args):
                raise Fail(f"flag needs an argument: {name}")
            val = args[i + 1]
            i += 1
        if name in ("-t", "--tag"):
            tags.append(val)
        elif name == "--label":
            k, _, v = val.partition("=")
            labels[k] = v
        elif name == "--build-arg":
            k, has, v = val.partition("=")
            build_args[k] = v if has else os.environ.get(k, "")
        elif name in ("-f", "--file"):
            file = val
        elif name in ("-q", "--quiet"):
            quiet = True
        elif takes or name in ("--no-cache", "--pull", "--rm", "--force-rm", "--squash", "--load", "--push",
                               "--compress"):
            pass
        elif a.startswith("-") and a != "-":
            raise Fail(f"unknown flag: {a}\nSee 'docker build --help'.")
        else:
            context = a
        i += 1
    if context is None:
        raise Fail('ERROR: "docker buildx build" requires exactly 1 argument.')
    if not os.path.isdir(context):
        raise Fail(f"ERROR: unable to prepare context: path \"{context}\" not found")
    file = file or os.path.join(context, "Dockerfile")
    try:
        text = open(file).read()
    except OSError:
        raise Fail(f"ERROR: failed to solve: failed to read dockerfile: open {file}: no such file or directory")
    need_daemon()
    st = State()
    steps = parse_dockerfile(text)
    arg_values = dict(build_args)
    base, base_ref = None, None
    config: dict = {}
    recorded = []
    out = sys.stderr if quiet else sys.stdout
    for n, (word, rest) in enumerate(steps, 1):
        print(f"Step {n}/{len(steps)} : {word} {rest}", file=out)
        if word == "ARG":
            k, has, v = rest.partition("=")
            arg_values.setdefault(k.strip(), v.strip() if has else "")
            print(" ---> recorded", file=out)
        elif word == "FROM":
            base_ref = _subst(rest.split()[0], arg_values)
            base = st.find_image(base_ref)
            if base is None:
                print(f"Unable to find image '{base_ref}' locally (pulling from the lab registry)", file=out)
                try:
                    base = pull_image(st, base_ref, quiet=True, out=out)
                except Fail as exc:
                    raise Fail(f"ERROR: failed to solve: {base_ref}: failed to resolve source metadata for "
                               f"{full_name(parse_ref(base_ref)[0])}: {str(exc).replace('Error response from daemon: ', '')}")
            config = json.loads(json.dumps(base["Config"]))
            config["Labels"] = dict(config.get("Labels") or {})
            recorded = []
            print(f" ---> {short_id(base['Id'])}", file=out)
        elif base is None:
            raise Fail(f"ERROR: failed to solve: dockerfile parse error: {word} before FROM")
        elif word == "ENV":
            k, _, v = (rest.partition("=") if "=" in rest.split()[0] else rest.partition(" "))
            config["Env"] = [e for e in config.get("Env") or [] if not e.startswith(k + "=")] + [f"{k}={v.strip()}"]
            print(" ---> recorded", file=out)
        elif word == "LABEL":
            for k, v in re.findall(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|\S+)', rest):
                config["Labels"][k] = json.loads(v) if v.startswith('"') else v
            print(" ---> recorded", file=out)
        elif word in ("CMD", "ENTRYPOINT"):
            value = json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]
            config["Cmd" if word == "CMD" else "Entrypoint"] = value
            print(" ---> recorded", file=out)
        elif word == "WORKDIR":
            config["WorkingDir"] = rest
            print(" ---> recorded", file=out)
        else:
            recorded.append(f"{word} {rest}")
            print(f" ---> ironserve lab stand-in: {word} recorded, NOT executed (no engine in the lab; the image "
                  f"keeps the SGLang parser of its base, {base['IronLab'].get('parser_version')})", file=out)
    if base is None:
        raise Fail("ERROR: failed to solve: the Dockerfile (Dockerfile) cannot be empty")
    config["Labels"].update(labels)
    image_id = "sha256:" + hashlib.sha256(json.dumps([base["Id"], text, sorted(labels.items()),
                                                      sorted(build_args.items())]).encode()).hexdigest()
    image = st.images.setdefault(image_id, {
        "Id": image_id, "RepoTags": [], "RepoDigests": [], "Parent": base["Id"],
        "Comment": "ironserve lab stand-in image (built: RUN lines recorded, not executed)", "Created": now(),
        "Architecture": "amd64", "Os": "linux", "Size": 0, "Config": config,
        "Metadata": {"LastTagTime": now()},
        "IronLab": {**base["IronLab"], "base": base_ref, "dockerfile": text, "not_executed": recorded,
                    "source": "docker build"},
    })
    for t in tags:
        repo, tag, _ = parse_ref(t)
        st.untag(f"{repo}:{tag}")
        image["RepoTags"].append(f"{repo}:{tag}")
    st.save()
    if quiet:
        print(image_id)
    else:
        print(f"Successfully built {short_id(image_id)}")
        for t in image["RepoTags"]:
            print(f"Successfully tagged {t}")
    return 0


# ---------------------------------------------------------------- run / create / stop / rm / ps

BOOL_LONG = {"--rm", "--detach", "--interactive", "--tty", "--privileged", "--init", "--read-only", "--publish-all",
             "--no-healthcheck", "--oom-kill-disable", "--sig-proxy", "--disable-content-trust", "--quiet", "--help"}
SHORT = {"d": "--detach", "i": "--interactive", "t": "--tty", "P": "--publish-all", "q": "--quiet"}
SHORT_VALUE = {"e": "--env", "v": "--volume", "w": "--workdir", "u": "--user", "l": "--label", "p": "--publish",
               "m": "--memory", "h": "--hostname", "a": "--attach", "c": "--cpu-shares"}
ALIASES = {"--net": "--network", "--expose": "--expose"}


def parse_run(args: list[str]) -> tuple[dict, str, list[str]]:
    opts: dict = {}
    i = 0

    def add(name, value):
        opts.setdefault(name, []).append(value)
    while i < len(args):
        a = args[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            name = ALIASES.get(name, name)
            if name in BOOL_LONG:
                add(name, val.lower() != "false" if eq else True)
            else:
                if not eq:
                    if i + 1 >= len(args):
                        raise Fail(f"flag needs an argument: {name}", 125)
                    val = args[i + 1]
                    i += 1
                add(name, val)
        else:
            letters = a[1:]
            for j, ch in enumerate(letters):
                if ch in SHORT:
                    add(SHORT[ch], True)
                elif ch in SHORT_VALUE:
                    val = letters[j + 1:].lstrip("=")
                    if not val:
                        if i + 1 >= len(args):
                            raise Fail(f"flag needs an argument: '{ch}' in -{ch}", 125)
                        val = args[i + 1]
                        i += 1
                    add(SHORT_VALUE[ch], val)
                    break
                else:
                    raise Fail(f"unknown shorthand flag: '{ch}' in {a}\nSee 'docker run --help'.", 125)
        i += 1
    if i >= len(args):
        raise Fail('"docker run" requires at least 1 argument.\nUsage:  docker run [OPTIONS] IMAGE [COMMAND] [ARG...]',
                   125)
    return opts, args[i], args[i + 1:]


def _flag(opts: dict, name: str) -> bool:
    return bool(opts.get(name)) and bool(opts[name][-1])


def _last(opts: dict, name: str):
    return opts[name][-1] if opts.get(name) else None


def container_env(image: dict, opts: dict) -> list[str]:
    env = dict(e.split("=", 1) for e in image["Config"].get("Env") or [] if "=" in e)
    for path in opts.get("--env-file", []):
        try:
            lines = open(path).read().splitlines()
        except OSError:
            raise Fail(f"docker: open {path}: no such file or directory\n\nRun 'docker run --help' for more information",
                       125)
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            k, has, v = line.partition("=")
            if has:
                env[k] = v
            elif k in os.environ:
                env[k] = os.environ[k]
    for item in opts.get("--env", []):
        k, has, v = item.partition("=")
        if has:
            env[k] = v
        elif k in os.environ:
            env[k] = os.environ[k]
    return [f"{k}={v}" for k, v in env.items()]


def volumes(opts: dict) -> list[tuple[str, str]]:
    out = []
    for v in opts.get("--volume", []):
        parts = v.split(":")
        if len(parts) >= 2 and parts[0].startswith("/"):
            out.append((parts[0], parts[1]))
    for m in opts.get("--mount", []):
        fields = dict(p.split("=", 1) for p in m.split(",") if "=" in p)
        src = fields.get("source") or fields.get("src")
        dst = fields.get("target") or fields.get("destination") or fields.get("dst")
        if src and dst:
            out.append((src, dst))
    return sorted(out, key=lambda sd: -len(sd[1]))


def host_path(path: str, mounts: list[tuple[str, str]]) -> str | None:
    for src, dst in mounts:
        if path == dst or path.startswith(dst.rstrip("/") + "/"):
            return src + path[len(dst):]
    return None


SERVE_MODULES = ("sglang.launch_server", "sglang_router.launch_router", "sglang.launch_router")


class CannotServe(Fail):
    pass


def plan(argv: list[str], mounts: list[tuple[str, str]]) -> tuple[str, list]:
    """What a container command means in the lab: ('python', [interp args...]) or raises Fail."""
    if not argv:
        raise Fail("docker: Error response from daemon: no command specified", 125)
    prog = os.path.basename(argv[0])
    if prog in ("sh", "bash", "dash") and len(argv) >= 3 and argv[1] == "-c":
        script, rest = argv[2], argv[3:]
        if re.search(r"\bhf download\b|huggingface-cli", script):
            repo = rest[1] if len(rest) > 1 else "?"
            dest = rest[rest.index("--local-dir") + 1] if "--local-dir" in rest[:-1] else "?"
            raise Fail(f"ironserve lab: no Hugging Face hub in the lab (air-gapped, no registry, no hub): cannot "
                       f"download {repo} into {dest}. Use model_source=path: `ironserve lab up` publishes stand-in "
                       "checkpoints on every host (lab status: model_root, models).", 1)
        if re.search(r'exec "\$@"\s*$', script) and len(rest) > 1:
            # the source_env wrapper: scripts sourced in the real image do not exist here; run "$@"
            return plan(rest[1:], mounts)
        raise Fail(f"ironserve lab: stand-in image cannot run shell scripts ({shlex_join(argv[:3])} ...): it runs "
                   "only Python with the SGLang parser of its version", 126)
    if prog == "sglang" and argv[1:2] == ["serve"]:
        raise CannotServe("serve")
    if re.fullmatch(r"python(3(\.\d+)?)?", prog):
        rest = argv[1:]
        interp = []
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c", "-"):
            interp.append(rest.pop(0))
        if rest[:1] == ["-m"] and len(rest) > 1:
            if rest[1] in SERVE_MODULES:
                raise CannotServe(rest[1])
            return "python", interp + rest
        if rest[:1] == ["-c"]:
            return "python", interp + rest
        if not rest:
            return "python", interp
        script = rest[0]
        if os.path.basename(script) == "ironserve-exec":
            raise CannotServe("ironserve-exec")
        mapped = host_path(script, mounts)
        if mapped is None or not os.path.exists(mapped):
            raise Fail(f"python3: can't open file '{script}': [Errno 2] No such file or directory "
                       "(ironserve lab stand-in image: only files mounted with -v exist in it)", 2)
        return "python", interp + [mapped] + rest[1:]
    raise Fail(f"docker: Error response from daemon: failed to create task for container: exec: \"{argv[0]}\": "
               "ironserve lab stand-in image has only python3 (the SGLang parser of its version)", 127)


def shlex_join(parts: list[str]) -> str:
    import shlex
    return " ".join(shlex.quote(p) for p in parts)


def image_meta(image: dict) -> dict:
    """What the image stands for: its registry entry as the registry says it now, else as recorded at pull."""
    lab = dict(image.get("IronLab") or {})
    if lab.get("registry"):
        entry = registry_lookup(lab["registry"][0], None, lab["registry"][1])
        if entry:
            lab.update({k: entry.get(k) for k in ("sglang", "parser_version", "image_extras")})
    return lab


def parser_python(image: dict, ref: str) -> str:
    lab = image_meta(image)
    version = lab.get("parser_version")
    if not version:
        raise Fail(f"ironserve lab: image {ref} stands for SGLang {lab.get('sglang') or '?'}, which is not a PyPI "
                   "release, and its recipe names no engine.parser_version: no real parser can stand for it in the lab",
                   125)
    venv = (registry().get("parsers") or {}).get(version)
    if not venv or not os.path.isfile(os.path.join(venv, "ironserve-env.json")):
        raise Fail(f"ironserve lab: image {ref} stands for sglang=={version}, whose CPU parser venv "
                   f"({venv or 'unknown path'}) is not built on the lab machine or not mounted in this host: "
                   f"`ironserve lab up --hardware <a GPU profile>` builds it (engine_parser.parser_env('{version}'))",
                   125)
    return os.path.join(venv, "bin", "python")


def cannot_serve(ref: str, image: dict, what: str) -> Fail:
    version = image_meta(image).get("parser_version")
    return Fail(f"ironserve lab: stand-in image cannot serve: {ref} has no engine and the lab has no GPUs ({what} "
                "refused). Deploy with launch=false in the lab (inventories/lab.py does for GPU profiles); the parse "
                f"probe (--entrypoint python3 IMAGE /ironserve-parse-check ...) runs the real sglang {version} "
                "parser.", 1)


def execute(image: dict, ref: str, argv: list[str], opts: dict, env: list[str]) -> int:
    mounts = volumes(opts)
    try:
        kind, args = plan(argv, mounts)
    except CannotServe as exc:
        raise cannot_serve(ref, image, str(exc))
    python = parser_python(image, ref)
    run_env = {"PATH": IMAGE_PATH.split("=", 1)[1], "HOME": "/root", "PYTHONWARNINGS": "ignore"}
    run_env.update(e.split("=", 1) for e in env if "=" in e)
    # the stand-in has no GPUs and the lab no hub: keep the parser from looking for either
    run_env.update({"CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false"})
    extras = image_meta(image).get("image_extras")
    if extras:  # flags the real image's engine build has beyond its PyPI parser (images.py IMAGE_EXTRAS)
        run_env["IRONLAB_IMAGE_EXTRAS"] = json.dumps(extras)
        run_env["PYTHONPATH"] = os.pathsep.join(p for p in (LIB, run_env.get("PYTHONPATH")) if p)
    cmd = [python, *args]
    if _last(opts, "--network") == "none" and shutil.which("unshare"):
        if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0:
            cmd = ["unshare", "--net", *cmd]
    sys.stdout.flush()
    return subprocess.run(cmd, env=run_env, cwd="/").returncode


CDI_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*/[a-z0-9][a-z0-9._-]*=.+$")


def cdi_devices() -> set[str]:
    """kind=name of every device in the CDI spec directories (what the daemon's CDI cache would hold)."""
    found = set()
    for d in ("/etc/cdi", "/var/run/cdi"):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for f in names:
            if not f.endswith((".yaml", ".json")):
                continue
            kind = None
            for line in open(os.path.join(d, f)):
                text = line.strip()
                if text.startswith("kind:"):
                    kind = text.split(":", 1)[1].strip().strip('"')
                elif text.startswith("- name:") and kind:
                    found.add(f"{kind}={text.split(':', 1)[1].strip().strip(chr(34))}")
    return found


def check_devices(opts: dict) -> None:
    """--device as the real daemon resolves it: CDI names against the CDI specs, paths against the host."""
    unresolved = []
    for dev in opts.get("--device", []):
        if CDI_NAME.match(dev):
            if dev not in cdi_devices():
                unresolved.append(dev)
            continue
        path = dev.split(":", 1)[0]
        if not os.path.exists(path):
            raise Fail(f"docker: Error response from daemon: error gathering device information while adding custom "
                       f"device \"{path}\": no such file or directory.\n\nRun 'docker run --help' for more information",
                       125)
    if unresolved:
        raise Fail("docker: Error response from daemon: CDI device injection failed: unresolvable CDI devices "
                   f"{', '.join(unresolved)}.\n\nRun 'docker run --help' for more information", 125)


def cmd_run(args: list[str], create: bool = False) -> int:
    opts, ref, command = parse_run(args)
    need_daemon()
    check_devices(opts)
    st = State()
    image = st.find_image(ref)
    if image is None:
        if _last(opts, "--pull") == "never":
            raise Fail(f"docker: Error response from daemon: No such image: {ref}", 125)
        err(f"Unable to find image '{ref}' locally")
        try:
            image = pull_image(st, ref, out=sys.stderr)
        except Fail as exc:
            raise Fail(f"docker: {exc}\n\nRun 'docker run --help' for more information", 125)
    name = _last(opts, "--name")
    if name and st.find_container(name):
        other = st.find_container(name)["Id"]
        raise Fail(f"docker: Error response from daemon: Conflict. The container name \"/{name}\" is already in use by "
                   f"container \"{other}\". You have to remove (or rename) that container to be able to reuse that "
                   "name.\n\nRun 'docker run --help' for more information", 125)
    env = container_env(image, opts)
    entry = opts.get("--entrypoint")
    entrypoint = ([entry[-1]] if entry[-1] else []) if entry else (image["Config"].get("Entrypoint") or [])
    cmd = command or ([] if entry else (image["Config"].get("Cmd") or []))
    cid = hashlib.sha256(f"{time.time_ns()}:{os.getpid()}:{name}".encode()).hexdigest()
    record = {
        "Id": cid, "Name": "/" + (name or f"ironlab_{cid[:8]}"), "Created": now(), "Image": image["Id"],
        "Path": (entrypoint + cmd)[0] if entrypoint + cmd else "", "Args": (entrypoint + cmd)[1:],
        "Config": {"Image": ref, "Cmd": cmd or None, "Entrypoint": entrypoint or None, "Env": env,
                   "Labels": dict(lb.partition("=")[::2] for lb in opts.get("--label", []))},
        "HostConfig": {"NetworkMode": _last(opts, "--network") or "bridge", "Binds": opts.get("--volume", []),
                       "AutoRemove": _flag(opts, "--rm"), "IpcMode": _last(opts, "--ipc") or "private",
                       "Privileged": _flag(opts, "--privileged"), "ShmSize": _last(opts, "--shm-size")},
        "State": {"Status": "created", "Running": False, "Paused": False, "Restarting": False, "Dead": False,
                  "Pid": 0, "ExitCode": 0, "Error": "", "StartedAt": "0001-01-01T00:00:00Z",
                  "FinishedAt": "0001-01-01T00:00:00Z"},
    }
    if create:
        st.containers[cid] = record
        st.save()
        print(cid)
        return 0
    keep = not _flag(opts, "--rm")
    if keep:
        st.containers[cid] = record
    st.save()
    st.close()  # release the lock while the container "runs"
    if _flag(opts, "--detach"):
        print(cid)
    try:
        rc = execute(image, ref, entrypoint + cmd, opts, env)
        error = ""
    except Fail as exc:
        err(str(exc))
        rc, error = exc.code, str(exc)
    if keep:
        st = State()
        if cid in st.containers:
            st.containers[cid]["State"].update({"Status": "exited", "ExitCode": rc, "Error": error,
                                                "StartedAt": record["Created"], "FinishedAt": now()})
            st.save()
    return rc


def cmd_stop(args: list[str], remove: bool = False) -> int:
    names, force, i = [], False, 0
    while i < len(args):
        a = args[i]
        if a in ("-t", "--time", "--timeout", "-s", "--signal"):
            i += 2
            continue
        if a in ("-f", "--force", "-v", "--volumes"):
            force = force or a in ("-f", "--force")
        elif not a.startswith("-"):
            names.append(a)
        i += 1
    if not names:
        raise Fail(f'"docker {"rm" if remove else "stop"}" requires at least 1 argument.')
    need_daemon()
    st = State()
    rc = 0
    for name in names:
        c = st.find_container(name)
        if c is None:
            if not (remove and force):
                err(f"Error response from daemon: No such container: {name}")
                rc = 1
            continue
        if remove:
            del st.containers[c["Id"]]
        print(name)
    st.save()
    return rc


def cmd_ps(args: list[str]) -> int:
    fmt, rest = _format_flag(args)
    show_all = any(a in ("-a", "--all") for a in rest)
    quiet = any(a in ("-q", "--quiet") or a in ("-aq", "-qa") for a in rest)
    show_all = show_all or any(a in ("-aq", "-qa") for a in rest)
    need_daemon()
    st = State()
    rows = []
    for c in st.containers.values():
        if not show_all and not c["State"]["Running"]:
            continue
        status = f"Exited ({c['State']['ExitCode']})" if c["State"]["Status"] == "exited" else "Created"
        rows.append({"ID": c["Id"][:12], "Image": c["Config"]["Image"], "Names": c["Name"].lstrip("/"),
                     "Command": json.dumps(" ".join(([c["Path"]] if c["Path"] else []) + c["Args"])[:20] + "…"),
                     "Status": status, "State": c["State"]["Status"], "CreatedAt": c["Created"], "Ports": ""})
    if quiet:
        for r in rows:
            print(r["ID"])
        return 0
    _table(rows, [("CONTAINER ID", "{{.ID}}"), ("IMAGE", "{{.Image}}"), ("COMMAND", "{{.Command}}"),
                  ("CREATED", "{{.CreatedAt}}"), ("STATUS", "{{.Status}}"), ("PORTS", "{{.Ports}}"),
                  ("NAMES", "{{.Names}}")], fmt)
    return 0


# ---------------------------------------------------------------- info / version

def daemon_config() -> dict:
    try:
        with open(DAEMON_JSON) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def cmd_info(args: list[str]) -> int:
    fmt, _ = _format_flag(args)
    need_daemon()
    st = State()
    cfg = daemon_config()
    runtimes = {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}}
    runtimes.update(cfg.get("runtimes") or {})
    info = {"ID": "ironlab", "Containers": len(st.containers), "ContainersRunning": 0,
            "ContainersStopped": len(st.containers), "Images": len(st.images), "Driver": "overlay2",
            "ServerVersion": VERSION, "Runtimes": runtimes, "DefaultRuntime": cfg.get("default-runtime", "runc"),
            "OperatingSystem": "ironserve lab stand-in (no engine)", "OSType": "linux", "Architecture": "x86_64",
            "Name": socket.gethostname(), "DockerRootDir": "/var/lib/docker", "NCPU": os.cpu_count()}
    if fmt is not None:
        print(render(fmt, info))
        return 0
    print(f"Client: Docker Engine - Community (ironserve lab stand-in)\n Version:    {VERSION}\n\nServer:\n"
          f" Containers: {info['Containers']}\n Images: {info['Images']}\n Server Version: {VERSION}\n"
          f" Storage Driver: overlay2\n Runtimes: {' '.join(sorted(runtimes))}\n"
          f" Default Runtime: {info['DefaultRuntime']}\n Operating System: {info['OperatingSystem']}\n"
          f" Name: {info['Name']}\n Docker Root Dir: /var/lib/docker")
    return 0


def cmd_version(args: list[str]) -> int:
    fmt, _ = _format_flag(args)
    data = {"Client": {"Version": VERSION, "ApiVersion": API_VERSION, "Os": "linux", "Arch": "amd64"},
            "Server": {"Version": VERSION, "ApiVersion": API_VERSION, "Os": "linux", "Arch": "amd64"}}
    if fmt is not None:
        print(render(fmt, data))
        return 0
    print(f"Client: Docker Engine - Community\n Version:           {VERSION}\n API version:       {API_VERSION}\n"
          " Git commit:        ironlab\n OS/Arch:           linux/amd64\n")
    need_daemon()
    print(f"Server: Docker Engine - Community (ironserve lab stand-in)\n Engine:\n  Version:          {VERSION}\n"
          f"  API version:      {API_VERSION} (minimum version 1.24)")
    return 0


# ---------------------------------------------------------------- main

USAGE = """Usage:  docker [OPTIONS] COMMAND

ironserve lab stand-in for the Docker CLI (no engine, no registry: see /usr/bin/docker).

Commands: pull, tag, build, images, rmi, inspect, image {inspect,pull,tag,build,ls,rm},
          container {inspect,create,run,stop,rm,ls}, run, create, stop, rm, ps, info, version"""


def main(argv: list[str]) -> int:
    while argv and argv[0] in ("-D", "--debug", "-l", "--log-level", "-H", "--host", "--context", "-c", "--config"):
        argv = argv[2:] if argv[0] not in ("-D", "--debug") else argv[1:]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 1
    if argv[0] in ("-v", "--version"):
        print(f"Docker version {VERSION}, build ironlab")
        return 0
    cmd, rest = argv[0], argv[1:]
    groups = {"image": {"inspect": lambda a: cmd_inspect(a, "image"), "pull": cmd_pull, "tag": cmd_tag,
                        "build": cmd_build, "ls": cmd_images, "list": cmd_images, "rm": cmd_rmi},
              "container": {"inspect": lambda a: cmd_inspect(a, "container"), "run": cmd_run,
                            "create": lambda a: cmd_run(a, create=True), "stop": cmd_stop,
                            "rm": lambda a: cmd_stop(a, remove=True), "ls": cmd_ps, "list": cmd_ps},
              "buildx": {"build": cmd_build}}
    top = {"pull": cmd_pull, "tag": cmd_tag, "build": cmd_build, "images": cmd_images, "rmi": cmd_rmi,
           "inspect": lambda a: cmd_inspect(a, None), "run": cmd_run, "create": lambda a: cmd_run(a, create=True),
           "stop": cmd_stop, "kill": cmd_stop, "rm": lambda a: cmd_stop(a, remove=True), "ps": cmd_ps,
           "info": cmd_info, "version": cmd_version}
    if cmd in groups:
        if not rest or rest[0] not in groups[cmd]:
            raise Fail(f"docker {cmd}: '{rest[0] if rest else ''}' is not implemented by the ironserve lab stand-in "
                       f"(it answers: {', '.join(sorted(groups[cmd]))})")
        return groups[cmd][rest[0]](rest[1:])
    if cmd not in top:
        raise Fail(f"docker: '{cmd}' is not a docker command (of the ironserve lab stand-in: "
                   f"{', '.join(sorted(top))}).\nSee 'docker --help'")
    return top[cmd](rest)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as exc:
        err(str(exc))
        sys.exit(exc.code)
    except KeyboardInterrupt:
        sys.exit(130)
