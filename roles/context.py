"""The deployment context: recipe + inventory -> what this host must become, built once per host.

Roles read everything from here, never from the recipe files or host data directly, so the deploy, the
audit and `ironserve render` agree on every value. Host data (inventory or `--data KEY=VALUE`) is typed in
ironserve/hostdata.py (every key with its type, default, description and the role that reads it), validated for
the whole inventory when the first context is built, and read by the roles as ``ctx.host.KEY``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pyinfra import host, inventory

from ironserve import catalogue, imagelock
from ironserve.catalogue import Problem, SpecError
from ironserve.derived_image import DerivedImage, derived_image, pushed_digest
from ironserve.hostdata import HostData, validate_host_data, validate_inventory_data
from ironserve.inventory import InventoryHost
from ironserve.render import Process, Rendered, model_path_on, render, require_set
from ironserve.spec import DockerRuntime, HardwareProfile, HostTuning, Recipe, effective_tuning
from roles.common import ChangeRecords


@dataclass
class DeploymentContext:
    model: str
    recipe: Recipe
    profile: HardwareProfile
    tuning: HostTuning
    rendered: Rendered
    host_name: str
    processes: list[Process]
    launch: bool
    host: HostData = field(default_factory=HostData)  # this host's data, typed (ironserve/hostdata.py)
    # the deployment's derived image in the site's registry (docker_derived_registry), the same for every host;
    # None: no patches, or each host builds its own (ironserve/derived_image.py)
    derived: DerivedImage | None = None
    hosts: list[InventoryHost] = field(default_factory=list)  # the whole inventory, in order (NVLink domains)
    # what this run's operations on this host change (filled by the roles while planning, read by the launch)
    changes: ChangeRecords = field(default_factory=ChangeRecords)
    # {(host, unit): did its health gate pass}, filled while the run executes; one dict shared by the contexts of
    # every host of the run (a rank > 0 saves its last good configuration only when rank 0's gate passed)
    gate_results: dict[tuple[str, str], bool] = field(default_factory=dict)
    # {rank group key: {rank: its unit running?}}, shared like gate_results: filled while planning the launch
    # preflight, read by its rendezvous while executing (a running rank keeps its group from a rendezvous)
    ranks_running: dict[str, dict[int, bool]] = field(default_factory=dict)
    # the rolling change's record (roles/rolling.py), shared like gate_results: the groups planned to roll, then
    # each one's outcome while the run executes (a group waits for the ones before it, the canary first)
    rolls: dict = field(default_factory=dict)

    @property
    def is_router_only(self) -> bool:
        return bool(self.processes) and all(p.role == "router" for p in self.processes)

    @property
    def runs_router(self) -> bool:
        return any(p.role == "router" for p in self.processes)

    @property
    def vendor(self) -> str:
        return self.profile.accelerator.vendor

    @property
    def model_path(self) -> str:
        """Where this host's weights are: the same value the rendered --model-path carries."""
        return model_path_on(self.recipe, InventoryHost(self.host_name, host_data=self.host))


def _hardware_profile(data: HostData, host_name: str, where: str) -> HardwareProfile:
    """The hardware profile the host's data names (``hardware``), or a SpecError naming the known ones."""
    profiles = catalogue.hardware_profiles()
    if not data.hardware:
        raise SpecError(
            [
                Problem(
                    where,
                    f"{host_name}.hardware",
                    "host has no hardware profile",
                    f"set hardware= one of {', '.join(profiles)}",
                )
            ]
        )
    if data.hardware not in profiles:
        raise SpecError(
            [
                Problem(
                    where,
                    f"{host_name}.hardware",
                    f"unknown hardware '{data.hardware}'",
                    f"one of {', '.join(profiles)}",
                )
            ]
        )
    return profiles[data.hardware]


def _recipe_for(model: str, profile: HardwareProfile, data: HostData, host_name: str, where: str) -> Recipe:
    """The host's recipe (``recipe``, else the catalogue's default for the model on this hardware), with the site's
    image lock applied; a SpecError when it is not for this hardware."""
    recipe = catalogue.get_recipe(data.recipe) if data.recipe else catalogue.default_recipe(model, profile.id)
    # the site's registry may hold the recipe's image under another digest (ironserve/imagelock.py)
    recipe = imagelock.apply_site(recipe, data.docker_image_lock)
    if profile.id not in recipe.hardware:
        raise SpecError(
            [
                Problem(
                    where,
                    f"{host_name}.hardware",
                    f"recipe {recipe.id} is for {', '.join(recipe.hardware)}, not {profile.id}",
                    "pick another recipe with --data recipe=ID",
                )
            ]
        )
    return recipe


def _registry_image(recipe: Recipe, typed: dict[str, HostData], hosts: list[str], where: str) -> DerivedImage | None:
    """The deployment's derived image in the registry its hosts name (``docker_derived_registry``), one for all of
    them; None without patches or without a registry. A SpecError when the hosts disagree, or the base is a tag."""
    runtime = recipe.runtime
    named = {h: typed[h].docker_derived_registry for h in hosts}
    if not isinstance(runtime, DockerRuntime) or not runtime.patches or not any(named.values()):
        return None
    first = hosts[0]
    fix = "give every host of the deployment the same docker_derived_registry (group_data/all.py)"
    for h in hosts[1:]:
        if named[h] != named[first]:
            raise SpecError.one(where, f"{h}.docker_derived_registry", f"{named[h]} != {first}'s {named[first]}", fix)
    if not runtime.digest:
        raise SpecError.one(
            f"recipe {recipe.id}",
            "runtime.digest",
            f"{runtime.image} is a tag without a digest and no lock file pins it: the derived image built once for "
            "every host (docker_derived_registry) is built FROM a digest",
            f"run `ironserve lock {recipe.id} --inventory INVENTORY`, or set runtime.digest",
        )
    try:
        images = {
            h: derived_image(
                recipe,
                named[h],
                typed[h].pip_index_url,
                typed[h].docker_registry_ca,
                typed[h].docker_derived_registry_auth_file,
                typed[h].docker_registry_mirror,
            )
            for h in hosts
        }
    except ValueError as exc:
        raise SpecError.one(f"recipe {recipe.id}", "id", str(exc), "name the recipe with a lowercase id") from None
    for h in hosts[1:]:
        if images[h].dockerfile != images[first].dockerfile:
            raise SpecError.one(
                where,
                f"{h}.pip_index_url",
                f"gives the derived image another Dockerfile than {first}'s (one image is built for all hosts)",
                "give every host of the deployment the same pip_index_url",
            )
    return images[first]


def with_registry_image(
    recipe: Recipe, image: DerivedImage | None, lookup: Callable[[DerivedImage, str], str | None] | None, where: str
) -> tuple[Recipe, DerivedImage | None]:
    """The recipe naming the registry's image (by the digest ``lookup`` finds for its tag, else the placeholder of
    the image this run pushes), and that image; unchanged without one."""
    if image is None:
        return recipe, None
    digest = lookup(image, where) if lookup else None
    image = image.pushed(digest) if digest else image
    return recipe.model_copy(update={"runtime": recipe.runtime.with_derived(image.ref)}), image


def build_context(
    model: str,
    host_name: str,
    hosts: list[tuple[str, dict]],
    where: str = "inventory",
    gate_results: dict | None = None,
    lookup: Callable[[DerivedImage, str], str | None] | None = None,
) -> DeploymentContext:
    """Pure: from (name, data) pairs of the whole inventory, in order, to this host's context.

    Every host's data is validated first (types, grammars, unknown keys): a typo or a wrong type anywhere in the
    inventory or in --data stops the deploy before any operation. ``lookup`` (the deploy's and the audit's:
    ironserve.derived_image.pushed_digest) asks the registry for the digest of the deployment's derived image;
    without it an image in the registry is named by its placeholder."""
    typed = validate_inventory_data(hosts, where)
    profile = _hardware_profile(typed[host_name], host_name, where)
    recipe = _recipe_for(model, profile, typed[host_name], host_name, where)
    inventory_hosts = [InventoryHost(n, dict(d), host_data=typed[n]) for n, d in hosts]
    rendered = render(recipe, inventory_hosts, where)
    require_set(rendered)  # a value import left unset (<PORT>) stops the deploy before any host is touched
    deployment = [n for n, _ in hosts if any(p.host == n for p in rendered.processes)]
    recipe, image = with_registry_image(recipe, _registry_image(recipe, typed, deployment, where), lookup, where)
    rendered = replace(rendered, recipe=recipe)
    return DeploymentContext(
        model=model,
        recipe=recipe,
        profile=profile,
        tuning=effective_tuning(recipe, profile),
        rendered=rendered,
        host_name=host_name,
        processes=rendered.for_host(host_name),
        launch=typed[host_name].launch,
        host=typed[host_name],
        hosts=inventory_hosts,
        gate_results=gate_results if gate_results is not None else {},
        derived=image,
    )


def require_pinned_image(ctx: DeploymentContext) -> None:
    """A docker recipe's image is pinned (runtime.digest, or a lock file beside the recipe), or the inventory opts
    out with docker_allow_unpinned; else the deploy stops here, before any host is touched."""
    runtime = ctx.recipe.runtime
    if not isinstance(runtime, DockerRuntime) or runtime.digest or ctx.host.docker_allow_unpinned:
        return
    # ranks of one group must run one image: a tag alone lets each host resolve it on its own
    raise SpecError(
        [
            Problem(
                f"recipe {ctx.recipe.id}",
                "runtime.digest",
                f"{runtime.image} is a tag without a "
                "digest and no lock file pins it: hosts could resolve it to different images",
                f"run `ironserve lock {ctx.host.recipe or ctx.recipe.id} --inventory INVENTORY` (writes "
                "the lock beside the recipe), set runtime.digest, or set docker_allow_unpinned=true in "
                "the inventory",
            )
        ]
    )


def runtime_lock(ctx: DeploymentContext) -> tuple[dict | None, str]:
    """A uv recipe's lock, {machine: {"name==version": hashes}}, or (None, why there is none); (None, "") for a
    runtime that is not uv."""
    return imagelock.uv_lock(ctx.recipe, catalogue.recipe_file(ctx.host.recipe or ctx.recipe.id))


def unlocked_runtime(ctx: DeploymentContext, why: str) -> Problem:
    """What the deploy says of a uv recipe it cannot install hash-checked (a warning, or under require_locks an error)."""
    return _unlocked(ctx, "runtime", why, "its uv runtime", "", "the lock with every distribution's sha256 beside")


def _unlocked(ctx: DeploymentContext, field: str, why: str, what: str, option: str, writes: str) -> Problem:
    ref = ctx.host.recipe or ctx.recipe.id
    return Problem(
        f"recipe {ctx.recipe.id}",
        field,
        f"{why}: {what} would install without hash checks",
        f"run `ironserve lock {ref}{option} --inventory INVENTORY` (writes {writes} the recipe)"
        + ("" if ctx.host.require_locks else ", or set require_locks=true to refuse such a deploy"),
    )


def router_runtime_lock(ctx: DeploymentContext) -> tuple[dict | None, str]:
    """A docker recipe's router venv lock, {machine: {python: {"name==version": hashes}}}, or (None, why there is
    none); (None, "") where the router does not run beside a docker runtime."""
    return imagelock.router_lock(ctx.recipe, catalogue.recipe_file(ctx.host.recipe or ctx.recipe.id))


def unlocked_router(ctx: DeploymentContext, why: str) -> Problem:
    """What the deploy says of a docker recipe's router venv it cannot install hash-checked."""
    writes = "the router venv's resolution with every distribution's sha256 into the lock file beside"
    return _unlocked(ctx, "engine.router", why, "its router venv", " --router", writes)


def require_locked_runtime(ctx: DeploymentContext) -> None:
    """Under require_locks a uv recipe has a current lock file, and a docker recipe's router host one of its router
    venv, else the deploy stops before any host is touched."""
    if not ctx.host.require_locks:
        return
    platforms, why = runtime_lock(ctx)
    if platforms is None and why:
        raise SpecError([unlocked_runtime(ctx, why)])
    platforms, why = router_runtime_lock(ctx) if ctx.runs_router else (None, "")
    if platforms is None and why:
        raise SpecError([unlocked_router(ctx, why)])


_CACHE: dict[tuple[str, str], DeploymentContext] = {}


@contextmanager
def bad_input_stops_the_deploy():
    """A SpecError raised while pyinfra collects operations, before any runs, is said as `ironserve` says bad input
    (file: key: message. Fix: ...) and exits 2, which pyinfra passes on for SystemExit: no traceback."""
    try:
        yield
    except SpecError as err:
        print(
            "error: bad recipe or host data, nothing was changed:\n" + "\n".join(f"  {p.line()}" for p in err.problems),
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2) from None


def current(model: str) -> DeploymentContext:
    """The context of pyinfra's current host (inventory order = rank order)."""
    key = (model, host.name)
    if key not in _CACHE:
        hosts = [(h.name, _pyinfra_data(h)) for h in inventory]
        # the hosts of one run share its gate results and its record of running ranks
        peer = next((c for (m, _), c in _CACHE.items() if m == model), None)
        with bad_input_stops_the_deploy():
            ctx = build_context(
                model, host.name, hosts, gate_results=peer.gate_results if peer else None, lookup=pushed_digest
            )
            require_pinned_image(ctx)
            require_locked_runtime(ctx)
        if peer:
            ctx.ranks_running = peer.ranks_running
            ctx.rolls = peer.rolls
        _CACHE[key] = ctx
    return _CACHE[key]


def host_data(h) -> HostData:
    """A pyinfra host's data, typed (for code that runs with a pyinfra host rather than a context, e.g. callbacks
    during execution); already validated with the whole inventory by current()."""
    return validate_host_data(_pyinfra_data(h), "inventory", getattr(h, "name", "host"))


def _pyinfra_data(h) -> dict:
    """A pyinfra host's data as the inventory gives it (ironserve's keys and pyinfra's own), a plain dict."""
    return h.data.dict() if hasattr(h.data, "dict") else dict(h.data)
