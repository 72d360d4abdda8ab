"""The deployment context: recipe + inventory -> what this host must become, built once per host.

Roles read everything from here, never from the recipe files or host data directly, so the deploy, the
audit and `ironserve render` agree on every value. Host data keys (inventory or `--data KEY=VALUE`):

- ``hardware``: hardware profile id (required)
- ``recipe``: recipe id, overriding the catalogue default for (model, hardware)
- ``launch``: ``false`` prepares and validates everything and starts nothing (default ``true``)
- ``nic``, ``model_path``, ``ironserve_role``: see ironserve.inventory
- ``model_source``: ``hub`` (download with the token file) or ``path`` (already on shared storage)
- ``hf_token_file``: path *on the controller* of a file holding the Hugging Face token
- ``api_key_file``: path on the controller of a file holding the API key for the servers
- mirrors (air-gapped clusters): ``nvidia_apt_mirror``, ``docker_apt_mirror``, ``pip_index_url``,
  ``ascend_package_store``, ``apt_signed_by`` (keyring path for the mirrors)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra import host, inventory

from ironserve import catalogue
from ironserve.catalogue import Problem, SpecError
from ironserve.inventory import InventoryHost
from ironserve.render import Process, Rendered, model_path_on, render
from ironserve.spec import HardwareProfile, HostTuning, Recipe, effective_tuning
from roles.common import ChangeRecords, truthy


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
    data: dict = field(default_factory=dict)
    hosts: list[InventoryHost] = field(default_factory=list)  # the whole inventory, in order (NVLink domains)
    # what this run's operations on this host change (filled by the roles while planning, read by the launch)
    changes: ChangeRecords = field(default_factory=ChangeRecords)
    # {(host, unit): did its health gate pass}, filled while the run executes; one dict shared by the contexts of
    # every host of the run (a rank > 0 saves its last good configuration only when rank 0's gate passed)
    gate_results: dict[tuple[str, str], bool] = field(default_factory=dict)
    # {rank group key: {rank: its unit running?}}, shared like gate_results: filled while planning the launch
    # preflight, read by its rendezvous while executing (a running rank keeps its group from a rendezvous)
    ranks_running: dict[str, dict[int, bool]] = field(default_factory=dict)

    @property
    def is_router_only(self) -> bool:
        return bool(self.processes) and all(p.role == "router" for p in self.processes)

    @property
    def vendor(self) -> str:
        return self.profile.accelerator.vendor

    def get(self, key: str, default=None):
        value = self.data.get(key)
        return default if value is None else value

    @property
    def model_path(self) -> str:
        """Where this host's weights are: the same value the rendered --model-path carries."""
        return model_path_on(self.recipe, InventoryHost(self.host_name, self.data))


def build_context(model: str, host_name: str, hosts: list[tuple[str, dict]], where: str = "inventory",
                  gate_results: dict | None = None) -> DeploymentContext:
    """Pure: from (name, data) pairs of the whole inventory, in order, to this host's context."""
    data = dict(next(d for n, d in hosts if n == host_name))
    hw_id = data.get("hardware")
    if not hw_id:
        raise SpecError([Problem(where, f"{host_name}.hardware", "host has no hardware profile",
                                 f"set hardware= one of {', '.join(catalogue.hardware_profiles())}")])
    profiles = catalogue.hardware_profiles()
    if hw_id not in profiles:
        raise SpecError([Problem(where, f"{host_name}.hardware", f"unknown hardware '{hw_id}'",
                                 f"one of {', '.join(profiles)}")])
    recipe = catalogue.get_recipe(data["recipe"]) if data.get("recipe") else catalogue.default_recipe(model, hw_id)
    if hw_id not in recipe.hardware:
        raise SpecError([Problem(where, f"{host_name}.hardware", f"recipe {recipe.id} is for "
                                 f"{', '.join(recipe.hardware)}, not {hw_id}", "pick another recipe with --data recipe=ID")])
    inventory_hosts = [InventoryHost(n, dict(d)) for n, d in hosts]
    rendered = render(recipe, inventory_hosts, where)
    return DeploymentContext(
        model=model,
        recipe=recipe,
        profile=profiles[hw_id],
        tuning=effective_tuning(recipe, profiles[hw_id]),
        rendered=rendered,
        host_name=host_name,
        processes=rendered.for_host(host_name),
        launch=truthy(data.get("launch"), True),
        data=data,
        hosts=inventory_hosts,
        gate_results=gate_results if gate_results is not None else {},
    )


_CACHE: dict[tuple[str, str], DeploymentContext] = {}


def current(model: str) -> DeploymentContext:
    """The context of pyinfra's current host (inventory order = rank order)."""
    key = (model, host.name)
    if key not in _CACHE:
        hosts = [(h.name, _host_data(h)) for h in inventory]
        # the hosts of one run share its gate results and its record of running ranks
        peer = next((c for (m, _), c in _CACHE.items() if m == model), None)
        ctx = build_context(model, host.name, hosts, gate_results=peer.gate_results if peer else None)
        if peer:
            ctx.ranks_running = peer.ranks_running
        _CACHE[key] = ctx
    return _CACHE[key]


def _host_data(h) -> dict:
    data = h.data.dict() if hasattr(h.data, "dict") else dict(h.data)
    data.setdefault("ssh_hostname", h.data.get("ssh_hostname") or h.name)
    return data
