"""Model weights: on shared storage already, or downloaded from the hub; verified either way before any unit.

Host data (defaults in brackets):

- ``model_source`` [path]: ``path`` = the weights already sit at the model path (shared storage, the lab's
  generated model); ``hub`` = download ``recipe.model.hub_id`` (at ``recipe.model.revision``) into the model path
- ``model_path`` [recipe.model.path]: where the weights are on the host (also what --model-path says)
- ``hf_token_file`` [none]: a file ON THE CONTROLLER holding the Hugging Face token; uploaded to
  /etc/ironserve/hf_token (0600 root:root, roles/secret_file.py) and handed to the download step alone as
  HF_TOKEN_PATH: never on argv, never in an engine's environment
- ``hf_transfer`` [false]: HF_HUB_ENABLE_HF_TRANSFER (off: hf_transfer is often absent and does not resume)
- ``hf_endpoint`` [none]: HF_ENDPOINT, a hub mirror
- ``model_shared`` [false]: the model path is one shared filesystem: download from the first host only

The download runs ``hf download`` (or ``huggingface-cli download`` on older hubs) from the recipe's runtime (the
venv's, or inside the image) with ``--local-dir``, which resumes a partial download; it runs only when the
checkpoint is incomplete. Verification (fact ``ModelCheckpoint``): ``config.json`` exists and, when
``model.safetensors.index.json`` exists, every shard it names exists and is non-empty; an optional manifest
``ironserve-manifest.sha256`` (sha256sum format, paths relative to the model directory) is checked with
``sha256sum -c --quiet`` once per content (a stamp of the manifest and the files' sizes and mtimes is kept in
/var/lib/ironserve/manifest-ok/). Failures name the host, the path and what is missing.
"""

from __future__ import annotations

import hashlib
import shlex

from pyinfra import context, host
from pyinfra.api import FactBase, OperationError, deploy, operation
from pyinfra.operations import files

from ironserve.spec import DockerRuntime
from ironserve.units import ETC_DIR, image_ref, venv_path
from roles.common import LongCommand, with_pushed_images
from roles.context import DeploymentContext
from roles.secret_file import read_secret, secret_file

HF_TOKEN_PATH = f"{ETC_DIR}/hf_token"
MANIFEST = "ironserve-manifest.sha256"
MANIFEST_OK_DIR = "/var/lib/ironserve/manifest-ok"
INDEX = "model.safetensors.index.json"


# --------------------------------------------------------------------------- pure helpers


def marker_path(path: str) -> str:
    return f"{MANIFEST_OK_DIR}/{hashlib.sha256(path.encode()).hexdigest()[:16]}"


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


def download_command(
    repo_id: str,
    path: str,
    *,
    revision: str | None = None,
    venv: str | None = None,
    image: str | None = None,
    token: bool = False,
    hf_transfer: bool = False,
    endpoint: str | None = None,
) -> str:
    """The resumable download into ``path`` with the runtime's own hub client (venv or image)."""
    env = {"HF_HUB_ENABLE_HF_TRANSFER": "1" if hf_transfer else "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    args = [repo_id, "--local-dir", path] + (["--revision", revision] if revision else [])
    q = " ".join(shlex.quote(a) for a in args)
    mkdir = f"mkdir -p {shlex.quote(path)} && "
    if image:
        run = ["docker", "run", "--rm", "--network", "host"]
        if token:
            env["HF_TOKEN_PATH"] = "/run/ironserve/hf_token"
            run += ["-v", f"{HF_TOKEN_PATH}:/run/ironserve/hf_token:ro"]
        for key, value in sorted(env.items()):
            run += ["-e", f"{key}={value}"]
        run += [
            "-v",
            f"{path}:{path}",
            "--entrypoint",
            "/bin/sh",
            image,
            "-c",
            'if command -v hf >/dev/null; then exec hf download "$@"; else exec huggingface-cli download "$@"; fi',
            "hf",
        ]
        return mkdir + " ".join(shlex.quote(a) for a in run) + " " + q
    assert venv, "a download needs the runtime: venv or image"
    if token:
        env["HF_TOKEN_PATH"] = HF_TOKEN_PATH
    hf, legacy = (shlex.quote(f"{venv}/bin/{tool}") for tool in ("hf", "huggingface-cli"))
    script = f'if [ -x {hf} ]; then exec {hf} download "$@"; else exec {legacy} download "$@"; fi'
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return f"{mkdir}env {envs} sh -c {shlex.quote(script)} hf {q}"


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
    manifest_stamp, verified_stamp} (stamps only when ironserve-manifest.sha256 exists)."""

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
        }

    def command(self, path):
        p = shlex.quote(path.rstrip("/") or "/")
        marker = shlex.quote(marker_path(path))
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
            f"echo verified=$(cat {marker} 2>/dev/null); fi; fi"
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
        return state


# --------------------------------------------------------------------------- operations


@operation()
@with_pushed_images
def weights_downloaded(path: str, command: str):
    """Run the (resumable) download when the checkpoint at ``path`` is not complete."""
    problems = checkpoint_problems(host.get_fact(ModelCheckpoint, path=path))
    if not problems:
        host.noop(f"weights at {path} are complete")
        return
    yield LongCommand(command, f"downloading the weights to {path}")


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


@deploy("Model weights")
def apply(ctx: DeploymentContext) -> None:
    path = model_path(ctx)
    source = ctx.host.model_source
    if not path:
        raise OperationError(
            f"{ctx.host_name}: recipe {ctx.recipe.id} names no model path: set model_path in the inventory"
        )
    download = source == "hub"
    if download:
        if not ctx.recipe.model.hub_id:
            raise OperationError(f"{ctx.host_name}: model_source=hub but recipe {ctx.recipe.id} has no model.hub_id")
        token = bool(ctx.host.hf_token_file)
        if token:
            files.directory(name="ironserve config directory", path=ETC_DIR, mode="755")
            # the token's only place on the host: the download step reads it (HF_TOKEN_PATH), no engine sees it
            secret_file(
                name="Hugging Face token (0600)",
                path=HF_TOKEN_PATH,
                secret=read_secret(ctx.host.hf_token_file, f"{ctx.host_name}: hf_token_file"),
            )
        runtime = ctx.recipe.runtime
        command = download_command(
            ctx.recipe.model.hub_id,
            path,
            revision=ctx.recipe.model.revision,
            venv=None if isinstance(runtime, DockerRuntime) else venv_path(ctx.recipe),
            image=image_ref(ctx.recipe) if isinstance(runtime, DockerRuntime) else None,
            token=token,
            hf_transfer=ctx.host.hf_transfer,
            endpoint=ctx.host.hf_endpoint,
        )
        weights_downloaded(
            name=f"Weights {ctx.recipe.model.hub_id} -> {path}",
            path=path,
            command=command,
            _run_once=ctx.host.model_shared,
        )
    elif source != "path":
        raise OperationError(f"{ctx.host_name}: model_source must be 'hub' or 'path', not {source!r}")
    checkpoint_verified(name=f"Weights at {path} verified", path=path, strict=not download)
