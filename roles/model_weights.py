"""Model weights: on shared storage already, or obtained from the hub; verified either way before any unit.

Host data (defaults in brackets):

- ``model_source`` [path]: ``path`` = the weights already sit at the model path (shared storage, the lab's
  generated model); ``hub`` = obtain ``recipe.model.hub_id`` (at ``recipe.model.revision``, else main) there
- ``model_path`` [recipe.model.path]: where the weights are on the host (also what --model-path says)
- ``hf_token_file`` [none]: a file ON THE CONTROLLER holding the Hugging Face token; uploaded to
  /etc/ironserve/hf_token (0600 root:root, roles/secret_file.py) and read only by the download step (the helper's
  hub requests, and HF_TOKEN_PATH for `hf download`): never on argv, never in an engine's environment
- ``hf_transfer`` [false]: HF_HUB_ENABLE_HF_TRANSFER (off: hf_transfer is often absent and does not resume)
- ``hf_endpoint`` [none]: HF_ENDPOINT, a hub mirror
- ``model_shared`` [false]: the model path is one shared filesystem: download from the first host only
- ``weights_peers`` [true], ``weights_peer_port`` [8790], ``weights_peer_fanout`` [4]: the hub is read once per
  run, the other hosts fetch from peers (roles/weights_peers.py)

With ``hub``, one host of the run downloads with ``hf download`` from the recipe's runtime (the venv's, or inside
the image) with ``--local-dir``, pinned to the commit the hub names for the revision, and checks every file against
the hub's hashes (sha256 of LFS files, git blob ids of the others), recording them in a manifest
(.cache/ironserve/hub-manifest.json in the model directory); the other hosts fetch from peers and verify against
that manifest (files/bin/ironserve_weights_peer.py). A host is done when the fact ``ModelCheckpoint`` finds the
manifest and its marker in /var/lib/ironserve/weights-ok/ (the manifest's and the directory's stamp, the repo and
the revision, written after every file was verified): a rerun hashes nothing and plans nothing.

Verification (fact ``ModelCheckpoint``): ``config.json`` exists and, when ``model.safetensors.index.json``
exists, every shard it names exists and is non-empty; an optional manifest ``ironserve-manifest.sha256``
(sha256sum format, paths relative to the model directory) is checked with ``sha256sum -c --quiet`` once per
content (a stamp of the manifest and the files' sizes and mtimes is kept in /var/lib/ironserve/manifest-ok/).
Failures name the host, the path and what is missing.
"""

from __future__ import annotations

import hashlib
import shlex

from pyinfra import context, host
from pyinfra.api import FactBase, FunctionCommand, OperationError, deploy, operation
from pyinfra.operations import files

from ironserve.resources import files_dir
from ironserve.spec import DockerRuntime
from ironserve.units import ETC_DIR, WEIGHTS_PEER, image_ref, venv_path
from roles import weights_peers
from roles.context import DeploymentContext
from roles.desired import DesiredFile, text_file
from roles.secret_file import generated_secret, read_secret, secret_file

HF_TOKEN_PATH = f"{ETC_DIR}/hf_token"
MANIFEST = "ironserve-manifest.sha256"
MANIFEST_OK_DIR = "/var/lib/ironserve/manifest-ok"
INDEX = "model.safetensors.index.json"
# the hub's hashes of every file, as the downloading host recorded them (files/bin/ironserve_weights_peer.py)
HUB_MANIFEST = ".cache/ironserve/hub-manifest.json"
WEIGHTS_OK_DIR = "/var/lib/ironserve/weights-ok"
PEER_SRC = files_dir() / "bin" / "ironserve_weights_peer.py"


# --------------------------------------------------------------------------- pure helpers


def marker_path(path: str, directory: str = MANIFEST_OK_DIR) -> str:
    return f"{directory}/{hashlib.sha256(path.encode()).hexdigest()[:16]}"


def checkpoint_problems(state: dict | None) -> list[str]:
    """What is wrong with a checkpoint as the ModelCheckpoint fact saw it ([] = complete)."""
    if not state or not state.get("exists"):
        return ["the directory does not exist"]
    problems = []
    if not state.get("config"):
        problems.append("config.json is missing")
    problems += [f"shard {name} is missing" for name in state.get("missing", [])]
    problems += [f"shard {name} is empty" for name in state.get("empty", [])]
    return problems


def hub_problems(state: dict | None, repo: str, revision: str) -> list[str]:
    """[] when the weights were verified against the hub's hashes of repo@revision, as they are now."""
    state = state or {}
    stamp = state.get("hub_stamp")
    if stamp and state.get("hub_verified") == f"{stamp} {repo} {revision}":
        return []
    if not stamp:
        return [f"no record of the hub's hashes of {repo}@{revision}"]
    return [f"not verified against the hub's hashes of {repo}@{revision} as the files are now"]


def hf_download(
    repo_id: str,
    path: str,
    *,
    venv: str | None = None,
    image: str | None = None,
    token: bool = False,
    hf_transfer: bool = False,
    endpoint: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the runtime's own resumable `hf download` into ``path`` (venv or image); the helper
    adds ``--revision COMMIT``."""
    env = {
        "HF_HUB_ENABLE_HF_TRANSFER": "1" if hf_transfer else "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    args = [repo_id, "--local-dir", path]
    if image:
        run = ["docker", "run", "--rm", "--network", "host"]
        if token:
            env["HF_TOKEN_PATH"] = "/run/ironserve/hf_token"
            run += ["-v", f"{HF_TOKEN_PATH}:/run/ironserve/hf_token:ro"]
        for key, value in sorted(env.items()):
            run += ["-e", f"{key}={value}"]
        script = 'if command -v hf >/dev/null; then exec hf download "$@"; else exec huggingface-cli download "$@"; fi'
        return [*run, "-v", f"{path}:{path}", "--entrypoint", "/bin/sh", image, "-c", script, "hf", *args], {}
    assert venv, "a download needs the runtime: venv or image"
    if token:
        env["HF_TOKEN_PATH"] = HF_TOKEN_PATH
    hf, legacy = (shlex.quote(f"{venv}/bin/{tool}") for tool in ("hf", "huggingface-cli"))
    script = f'if [ -x {hf} ]; then exec {hf} download "$@"; else exec {legacy} download "$@"; fi'
    return ["sh", "-c", script, "hf", *args], env


def manifest_check_command(path: str) -> str:
    """Check the checkpoint against its manifest, failing with the host and the path. The path is data: quoted,
    and printed through printf's %s, never inside an echo's double quotes (where $(...) would run as root)."""
    q = shlex.quote(path)
    return (
        f"if ! (cd {q} && sha256sum -c --quiet {MANIFEST}); then printf 'ironserve: %s: files in %s do not "
        f'match %s (listed above)\\n\' "$(hostname)" {q} {MANIFEST} >&2; exit 1; fi'
    )


# --------------------------------------------------------------------------- facts


class ModelCheckpoint(FactBase):
    """Completeness of a checkpoint directory: {exists, config, index, shards, missing, empty,
    manifest_stamp, verified_stamp, hub_stamp, hub_verified} (manifest stamps only when ironserve-manifest.sha256
    exists; hub_stamp when the hub's manifest exists, hub_verified: "STAMP REPO REVISION" of its last check)."""

    @staticmethod
    def default():
        return {
            "exists": False,
            "config": False,
            "index": False,
            "shards": 0,
            "missing": [],
            "empty": [],
            "manifest_stamp": None,
            "verified_stamp": None,
            "hub_stamp": None,
            "hub_verified": None,
        }

    def command(self, path):
        p = shlex.quote(path.rstrip("/") or "/")
        marker = shlex.quote(marker_path(path))
        hub_marker = shlex.quote(marker_path(path, WEIGHTS_OK_DIR))
        return (
            f"if [ ! -d {p} ]; then echo dir=no; else echo dir=yes; "
            f"if [ -f {p}/config.json ]; then echo config=yes; else echo config=no; fi; "
            f"if [ -f {p}/{INDEX} ]; then echo index=yes; "
            # shard names come from the checkpoint (data): read line by line and always quoted, never re-parsed
            f"grep -o '\"[^\"]*\\.safetensors\"' {p}/{INDEX} | tr -d '\"' | sort -u | while IFS= read -r f; do "
            f'echo "shard=$f"; if [ ! -e {p}/"$f" ]; then echo "missing=$f"; '
            f'elif [ ! -s {p}/"$f" ]; then echo "empty=$f"; fi; '
            f"done; else echo index=no; fi; "
            f"if [ -f {p}/{MANIFEST} ]; then "
            f"echo manifest=$( {{ cat {p}/{MANIFEST}; cd {p} && find . -type f ! -name {MANIFEST} "
            f"-printf '%P %s %T@\\n' | sort; }} | sha256sum | cut -c1-64); "
            f"echo verified=$(cat {marker} 2>/dev/null); fi; "
            # the hub's manifest: the same stamp as the helper's (files/bin/ironserve_weights_peer.py: stamp())
            f"if [ -f {p}/{HUB_MANIFEST} ]; then "
            f"echo hub=$( {{ cat {p}/{HUB_MANIFEST}; cd {p} && find . -type f ! -path './.cache/*' "
            f"-printf '%P %s %T@\\n' | LC_ALL=C sort; }} | sha256sum | cut -c1-64); "
            f"echo hubok=$(cat {hub_marker} 2>/dev/null); fi; fi"
        )

    def process(self, output):
        state = ModelCheckpoint.default()
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "dir":
                state["exists"] = value == "yes"
            elif key in ("config", "index"):
                state[key] = value == "yes"
            elif key == "shard":
                state["shards"] += 1
            elif key in ("missing", "empty"):
                state[key].append(value)
            elif key == "manifest":
                state["manifest_stamp"] = value or None
            elif key == "verified":
                state["verified_stamp"] = value or None
            elif key == "hub":
                state["hub_stamp"] = value or None
            elif key == "hubok":
                state["hub_verified"] = value or None
        return state


# --------------------------------------------------------------------------- operations


@operation()
def weights_obtained(path: str, repo: str, revision: str):
    """The weights at ``path`` are complete and verified against the hub's hashes of repo@revision; else, when the
    run executes, obtained from the hub or a peer, as the run's distribution says (roles/weights_peers.py)."""
    state = host.get_fact(ModelCheckpoint, path=path)
    problems = checkpoint_problems(state) + hub_problems(state, repo, revision)
    if not problems:
        if context.state.is_executing:  # a source for the hosts still waiting
            dist = weights_peers.distributions(host.state).get(f"{repo}@{revision}")
            if dist is not None:
                dist.mark_ready(host.name)
        host.noop(f"weights at {path} are complete and verified against the hub's hashes ({repo}@{revision})")
        return
    yield FunctionCommand(weights_peers.obtain, (f"{repo}@{revision}", path), {})


@operation()
def checkpoint_verified(path: str, strict: bool = True):
    """Fail, naming host, path and what is missing, unless the checkpoint is complete; check the manifest.

    strict=False (a download was planned before this) defers the verdict to execution, when the download ran.
    """
    state = host.get_fact(ModelCheckpoint, path=path)
    problems = checkpoint_problems(state)
    if problems:
        if strict or context.state.is_executing:
            raise OperationError(f"{host.name}: the model weights at {path} are not usable: {'; '.join(problems)}")
        host.noop(f"weights at {path} are checked after the download")
        return
    stamp = state.get("manifest_stamp")
    if not stamp or stamp == state.get("verified_stamp"):
        host.noop(
            f"weights at {path}: config.json and {state['shards']} shard(s) present"
            + ("; manifest verified" if stamp else "")
        )
        return
    yield manifest_check_command(path)
    yield f"mkdir -p {MANIFEST_OK_DIR} && echo {shlex.quote(stamp)} > {shlex.quote(marker_path(path))}"


# --------------------------------------------------------------------------- deploy


def model_path(ctx: DeploymentContext) -> str | None:
    """The rendered --model-path (host model_path, else <model_root>/<name>, else the recipe's path); a bare hub
    id is not a place on disk."""
    path = ctx.model_path
    return path if path.startswith("/") else None


def cluster_address(ctx: DeploymentContext) -> str:
    """This host's address on the cluster network (what the other hosts reach it at)."""
    return next((p.address for p in ctx.processes), ctx.host_name)


def engine_addresses(ctx: DeploymentContext) -> list[str]:
    """The cluster addresses of the deployment's engine hosts, in inventory order."""
    return list(dict.fromkeys(p.address for p in ctx.rendered.processes if p.role != "router"))


def desired_files(ctx: DeploymentContext) -> list[DesiredFile]:
    """The weights helper, on the hosts that obtain their weights from the hub (for `ironserve audit`)."""
    if ctx.host.model_source != "hub" or ctx.is_router_only:
        return []
    return [text_file(WEIGHTS_PEER, PEER_SRC.read_text(), 0o755, "service")]


def hub_token(ctx: DeploymentContext) -> bool:
    """The Hugging Face token's only place on the host (0600): the download step reads it, no engine sees it."""
    if not ctx.host.hf_token_file:
        return False
    secret_file(
        name="Hugging Face token (0600)",
        path=HF_TOKEN_PATH,
        secret=read_secret(ctx.host.hf_token_file, f"{ctx.host_name}: hf_token_file"),
    )
    return True


def peers_secret(ctx: DeploymentContext) -> str | None:
    """The deployment's secret for the peers' requests (0600 on each host), when its hosts may fetch from each
    other; its path on the host."""
    heads = engine_addresses(ctx)
    if not ctx.host.weights_peers or ctx.host.model_shared or len(heads) < 2:
        return None
    name = weights_peers.secret_name(ctx.recipe.model.hub_id, heads[0])
    path = weights_peers.secret_path(name)
    secret = generated_secret(name, ctx.host.secret_dir)
    secret_file(name="weights peers' secret (0600)", path=path, secret=secret)
    return path


def plan_member(ctx: DeploymentContext, path: str, revision: str, token: bool, secret: str | None):
    """This host in the run's distribution of the weights (roles/weights_peers.py), with its helper configs."""
    repo, runtime, address = ctx.recipe.model.hub_id, ctx.recipe.runtime, cluster_address(ctx)
    docker = isinstance(runtime, DockerRuntime)
    argv, env = hf_download(
        repo,
        path,
        venv=None if docker else venv_path(ctx.recipe),
        image=image_ref(ctx.recipe) if docker else None,
        token=token,
        hf_transfer=ctx.host.hf_transfer,
        endpoint=ctx.host.hf_endpoint,
    )
    common = {"repo": repo, "revision": revision, "root": path, "marker": marker_path(path, WEIGHTS_OK_DIR)}
    common["progress_s"] = weights_peers.PROGRESS_S
    download = {**common, "endpoint": ctx.host.hf_endpoint, "hf": argv, "env": env}
    download["token_file"] = HF_TOKEN_PATH if token else None
    fetch = {**common, "port": ctx.host.weights_peer_port, "source": address, "secret_file": secret}
    lend = {"path": path, "bind": address, "port": ctx.host.weights_peer_port, "secret": secret}
    lend["fanout"] = ctx.host.weights_peer_fanout
    runs = weights_peers.distributions(host.state)
    dist = runs.setdefault(
        f"{repo}@{revision}",
        weights_peers.Distribution(ctx.host.weights_peer_fanout, peers=bool(secret)),
    )
    state = host.get_fact(ModelCheckpoint, path=path)
    complete = not checkpoint_problems(state) and not hub_problems(state, repo, revision)
    heads = engine_addresses(ctx)
    rank = heads.index(address) if address in heads else len(heads)
    dist.add(weights_peers.Member(ctx.host_name, address, download, fetch, lend, rank), complete)


def from_hub(ctx: DeploymentContext, path: str) -> None:
    """The weights from the hub: the helper, the token and the peers' secret, this host's place in the run's
    distribution, and the operation that obtains them when they are not complete and verified."""
    repo = ctx.recipe.model.hub_id
    if not repo:
        raise OperationError(f"{ctx.host_name}: model_source=hub but recipe {ctx.recipe.id} has no model.hub_id")
    revision = ctx.recipe.model.revision or "main"
    files.directory(name="ironserve helper directory", path=WEIGHTS_PEER.rsplit("/", 1)[0], mode="755")
    files.put(
        name="ironserve-weights-peer helper",
        src=str(PEER_SRC),
        dest=WEIGHTS_PEER,
        mode="755",
        user="root",
        group="root",
    )
    files.directory(name="ironserve config directory", path=ETC_DIR, mode="755")
    token = hub_token(ctx)
    plan_member(ctx, path, revision, token, peers_secret(ctx))
    weights_obtained(
        name=f"Weights {repo}@{revision} -> {path}",
        path=path,
        repo=repo,
        revision=revision,
        _run_once=ctx.host.model_shared,
    )


@deploy("Model weights")
def apply(ctx: DeploymentContext) -> None:
    path = model_path(ctx)
    source = ctx.host.model_source
    if not path:
        raise OperationError(
            f"{ctx.host_name}: recipe {ctx.recipe.id} names no model path: set model_path in the inventory"
        )
    if source == "hub":
        from_hub(ctx, path)
    elif source != "path":
        raise OperationError(f"{ctx.host_name}: model_source must be 'hub' or 'path', not {source!r}")
    checkpoint_verified(name=f"Weights at {path} verified", path=path, strict=source != "hub")
