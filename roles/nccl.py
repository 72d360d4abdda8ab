"""NCCL topology graph: place the graph XML the recipe's ``NCCL_GRAPH_FILE`` points at.

Seed 000: an NCCL graph XML measured +11% throughput on AMD Genoa with 2 NUMA nodes. When the
effective tuning has ``nccl_graph`` the file goes to ``nccl_graph.path`` on the host:

- ``source`` a repository path (``files/nccl/nccl_graph_opt.xml``), or a path relative to the recipe's own
  directory or the recipe catalogue's: uploaded 0644; with a pinned ``sha256`` the local file is checked against
  it before anything is uploaded. Only files inside those directories, symlinks resolved
  (``graph_source_file``): a recipe never uploads another controller file to the hosts.
- ``source`` a URL (the cluster's mirror): ``files.download`` with the pinned ``sha256``
  (downloaded again whenever the host's copy does not match it).

The engine's env file is written by the sglang_service role from the rendered env; this role
only asserts the two agree: every engine process on the host must have ``NCCL_GRAPH_FILE`` equal
to the placed path, and no process may point ``NCCL_GRAPH_FILE`` at a file nobody places.

Host data: none (everything comes from the recipe and the hardware profile).
"""

from __future__ import annotations

import hashlib
import posixpath
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.operations import files

from ironserve.catalogue import recipes_dir
from ironserve.resources import files_dir, project_file
from roles.common import refuse
from roles.context import DeploymentContext
from roles.desired import DesiredFile

ENV_KEY = "NCCL_GRAPH_FILE"


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def graph_source_file(source: str, recipe_ref: str | None = None) -> Path:
    """The controller file a recipe's ``tuning.nccl_graph.source`` names: ``files/...`` of the checkout, else a
    path relative to the recipe's own directory (``recipe_ref``, when the recipe is a YAML file) or the recipe
    catalogue's. Resolved (symlinks followed) and kept only inside those directories; OperationError otherwise."""
    recipe_dir = Path(recipe_ref).parent if recipe_ref and recipe_ref.endswith((".yaml", ".yml")) else None
    roots = [files_dir(), recipes_dir()] + ([recipe_dir] if recipe_dir else [])
    relative = Path(source)
    if relative.is_absolute() or ".." in relative.parts:
        raise OperationError(
            f"NCCL graph {source}: not a path inside the recipe directories. Fix: write a path "
            "relative to files/ of the checkout or to the recipe's directory, without '..'"
        )
    candidates = (
        [project_file(source)] if relative.parts[:1] == ("files",) else [root / relative for root in roots[1:][::-1]]
    )
    for candidate in candidates:
        real = candidate.resolve()
        if real.is_file() and any(real.is_relative_to(root.resolve()) for root in roots):
            return real
    raise OperationError(
        f"NCCL graph {source}: no such file inside {', '.join(str(r) for r in roots)} (symlinks "
        "leading out of them are not followed). Fix: put the graph XML in the recipe's directory "
        "or in files/nccl/ and name it relative to it"
    )


def graph_env_problems(path: str | None, envs: dict[str, dict]) -> list[str]:
    """``envs``: unit -> rendered env of each engine process on this host."""
    problems = []
    for unit, env in sorted(envs.items()):
        value = env.get(ENV_KEY)
        if path and value != path:
            problems.append(
                f"{unit}: {ENV_KEY} is {value or 'unset'} but the graph is placed at {path}. Fix: set "
                f"env {ENV_KEY}: {path} in the recipe, or tuning.nccl_graph.path to the env's value"
            )
        elif not path and value:
            problems.append(
                f"{unit}: {ENV_KEY}={value} but the recipe places no graph (tuning.nccl_graph). Fix: add "
                f"tuning.nccl_graph with path {value}, or drop {ENV_KEY} from the env"
            )
    return problems


@operation()
def graph_file(source: str, path: str, sha256: str | None = None, content: str | None = None):
    """Place the NCCL graph XML at ``path``: downloaded from a URL ``source``, or ``content`` (the
    repository file ``source``, read by the role) uploaded; either way checked against ``sha256``."""
    if is_url(source):
        yield from files.directory._inner(posixpath.dirname(path))
        yield from files.download._inner(source, path, mode="644", sha256sum=sha256)
        return
    if content is None:
        raise OperationError(f"NCCL graph {source}: not a URL and no content read from the repository")
    actual = hashlib.sha256(content.encode()).hexdigest()
    if sha256 and actual != sha256:
        raise OperationError(
            f"NCCL graph {source}: sha256 {actual} is not the pinned {sha256}. Fix: restore the "
            "measured file, or pin the new file's sha256 in tuning.nccl_graph.sha256"
        )
    yield from files.put._inner(StringIO(content), path, mode="644")


@operation()
def check_graph_env(path: str | None, envs: dict):
    """Fail unless every engine process's NCCL_GRAPH_FILE is the placed graph (or unset without one)."""
    problems = [f"{host.name}: {p}" for p in graph_env_problems(path, envs)]
    refuse(problems, f"{ENV_KEY} consistent for {len(envs)} engine process(es)")
    return
    yield


@deploy("ironserve: NCCL graph")
def apply(ctx: DeploymentContext) -> None:
    graph = ctx.tuning.nccl_graph
    envs = {p.unit or p.role: dict(p.env) for p in ctx.processes if p.role != "router"}
    if graph:
        content = None
        if not is_url(graph.source):
            content = graph_source_file(graph.source, ctx.host.recipe).read_text()
        graph_file(
            name=f"NCCL graph {graph.path}", source=graph.source, path=graph.path, sha256=graph.sha256, content=content
        )
    if graph or any(ENV_KEY in env for env in envs.values()):
        check_graph_env(name=f"{ENV_KEY} matches the placed graph", path=graph.path if graph else None, envs=envs)


# --------------------------------------------------------------------------- audit


def desired_files(ctx: DeploymentContext) -> list[DesiredFile]:
    """The graph XML with its checksum (the pinned one, else the repository file's), for `ironserve audit`."""
    graph = ctx.tuning.nccl_graph
    if ctx.vendor != "nvidia" or not graph:
        return []
    sha = graph.sha256
    if not sha and not is_url(graph.source):
        try:
            sha = hashlib.sha256(graph_source_file(graph.source, ctx.host.recipe).read_text().encode()).hexdigest()
        except OperationError:
            sha = None
    return [DesiredFile(graph.path, sha, 0o644, "driver")] if sha else []
