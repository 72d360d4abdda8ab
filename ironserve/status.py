"""`ironserve status INVENTORY DEPLOY`: where the deployment answers and how each host's units are doing.

JSON: {"endpoint": url, "served_model_name": str, "recipe": id, "launch": bool,
       "hosts": [{"name", "address", "units": [{"unit", "role", "node_rank", "active", "health"}]}]}
`--format prometheus`: Prometheus file_sd JSON of the deployment's scrape targets (prometheus_targets).
Exit 0 when every unit is in its intended state (active and healthy when launched), 1 otherwise, 2 for an
unreachable host or bad input.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

from ironserve.audit import connection
from ironserve.audit.runner import deploy_model
from ironserve.fleet import limit_hosts, read_fleet
from ironserve.hostdata import parse_data_args
from ironserve.metrics import file_sd


def _probe(spec: str, units: list[dict]) -> tuple[list[dict], str | None]:
    from testinfra.host import Host

    try:
        host = Host(connection.backend(spec))
        out = []
        for unit in units:
            active = host.run(f"systemctl is-active {unit['unit']}.service").stdout.strip() or "unknown"
            health = None
            if unit["health_url"]:
                code = host.run(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 {unit['health_url']}")
                health = code.stdout.strip() or "no answer"
            out.append({**{k: v for k, v in unit.items() if k != "health_url"}, "active": active, "health": health})
        return out, None
    except Exception as exc:  # unreachable: said per host, exit 2
        return [], f"{type(exc).__name__}: {exc}"[:160]


def status(
    inventory: str,
    deploy: str,
    data: dict | None = None,
    out=sys.stdout,
    fmt: str = "json",
    limit: list[str] | None = None,
) -> int:
    from roles.context import build_context

    model = deploy_model(deploy)
    fleet = read_fleet(inventory, data)  # pyinfra's loader: group_data/ and --data as the deploy sees them
    pairs = [(h.name, h.data) for h in fleet.hosts]
    hosts = limit_hosts(fleet.hosts, limit, inventory)
    contexts = {h.name: build_context(model, h.name, pairs, inventory) for h in hosts}
    first = next(iter(contexts.values()))
    plans = {name: _unit_plan(ctx) for name, ctx in contexts.items()}
    specs = connection.open_hosts(fleet, [h.name for h in hosts])  # pyinfra's connector, strict host keys
    try:
        with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
            results = dict(zip(plans, pool.map(lambda n: _probe(specs[n], plans[n]), plans)))
    finally:
        connection.close(specs)
    report_hosts = [_host_report(h, *results[h.name]) for h in hosts]
    server = first.recipe.group_server(first.recipe.topology.groups[0])
    report = {
        "recipe": first.recipe.id,
        "endpoint": first.rendered.endpoint,
        "launch": first.launch,
        "served_model_name": server.served_model_name or first.model_path,
        "hosts": report_hosts,
    }
    if fmt == "json":
        print(json.dumps(report, indent=2), file=out)
    else:
        _print_text(report, out)
    return max((_host_verdict(entry, contexts[entry["name"]].launch) for entry in report_hosts), default=0)


def _unit_plan(ctx) -> list[dict]:
    """The units a host's context renders, each with the health URL to ask when the deploy launched them."""
    return [
        {"unit": p.unit, "role": p.role, "node_rank": p.node_rank, "health_url": p.health_url if ctx.launch else None}
        for p in ctx.processes
    ]


def _host_report(host, units: list[dict], error: str | None) -> dict:
    entry = {"name": host.name, "address": host.address, "units": units}
    if error:
        entry["error"] = error
    return entry


def _host_verdict(entry: dict, launched: bool) -> int:
    """2: unreachable; 1: a unit not in the state the deploy intends (active and healthy when launched); else 0."""
    if "error" in entry:
        return 2
    intended = "active" if launched else "inactive"
    return int(any(u["active"] != intended or u["health"] not in (None, "200") for u in entry["units"]))


def _print_text(report: dict, out) -> None:
    print(f"{report['recipe']}: endpoint {report['endpoint']} model {report['served_model_name']}", file=out)
    for entry in report["hosts"]:
        if "error" in entry:
            print(f"  {entry['name']}: unreachable ({entry['error']})", file=out)
        for u in entry["units"]:
            print(
                f"  {entry['name']} {u['unit']} [{u['role']} rank {u['node_rank']}]: {u['active']}"
                f"{'' if u['health'] is None else ', health ' + u['health']}",
                file=out,
            )


def prometheus_targets(inventory: str, deploy: str, data: dict | None = None, out=sys.stdout) -> int:
    """`--format prometheus`: Prometheus file_sd JSON of every engine and router with its metrics on and every
    host's node exporter, labelled recipe, role, group, rank, host (ironserve.metrics.file_sd). Offline: the
    targets come from the recipe and the inventory, no host is asked. Names and addresses only, never a secret."""
    from roles.context import build_context

    model = deploy_model(deploy)
    hosts = read_fleet(inventory, data).hosts  # pyinfra's loader: group_data/ and --data as the deploy sees them
    pairs = [(h.name, h.data) for h in hosts]
    contexts = [build_context(model, h.name, pairs, inventory) for h in hosts]
    exporters = [
        (h.name, h.address, ctx.host.node_exporter_port) for h, ctx in zip(hosts, contexts) if ctx.host.node_exporter
    ]
    first = contexts[0]
    print(json.dumps(file_sd(first.recipe.id, first.rendered.processes, exporters), indent=2), file=out)
    return 0


def add_status_parser(sub) -> None:
    p = sub.add_parser("status", help="endpoint, served model and unit state per host", allow_abbrev=False)
    p.add_argument("inventory")
    p.add_argument("deploy")
    p.add_argument(
        "--format",
        choices=["json", "text", "prometheus"],
        default="text",
        help="prometheus: the scrape targets as Prometheus file_sd JSON (offline)",
    )
    p.add_argument("--data", action="append", default=[], help="KEY=VALUE, as pyinfra's --data")
    p.add_argument(
        "--limit",
        action="append",
        help="only these hosts: a host name, a glob of names or a group, as pyinfra's --limit (repeatable)",
    )
    p.set_defaults(func=_run)


def _run(args) -> int:
    data = parse_data_args(args.data)
    if args.format == "prometheus":
        return prometheus_targets(args.inventory, args.deploy, data)
    return status(args.inventory, args.deploy, data, fmt=args.format, limit=args.limit)
