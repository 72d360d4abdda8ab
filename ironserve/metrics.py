"""ironserve's own Prometheus metrics: the text format of node_exporter's textfile collector, and the scrape targets.

Pure and offline (no pyinfra, no roles). What each host publishes goes through one writer on the host
(files/bin/ironserve-textfile: temp file in the collector's directory, 0644, rename), so node_exporter never reads
half a file. Every label value is checked here before it is formatted: names of units, recipes, stages, hosts and
checks only, never a value of a secret.

    ironserve_deploy_last_timestamp_seconds{recipe}      when the last deploy of this host ended
    ironserve_deploy_last_success{recipe}                1 it converged (every gate passed), 0 it failed
    ironserve_deploy_stage_seconds{recipe,stage}         wall time of each stage of the last deploy
    ironserve_deploy_seconds{recipe}                     the whole last deploy (time to serving)
    ironserve_unit_live_info{recipe,unit,role,generation} 1 per unit: the configuration generation it runs
    ironserve_gate_passed{recipe,unit}                   1/0 the unit's health gate in the last deploy
    ironserve_audit_drift{host,check}                    1 the audit check failed (drift), 0 clean
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

# Debian's prometheus-node-exporter reads this directory (its textfile collector default)
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
NODE_EXPORTER_PORT = 9100

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# label values: names ironserve itself makes (units, recipes, hosts, stages, checks, addresses, digests)
_VALUE = re.compile(r"[A-Za-z0-9_.:@/\[\]+=-]{0,200}")

HELP = {
    "ironserve_deploy_last_timestamp_seconds": "Unix time the last deploy of this host ended",
    "ironserve_deploy_last_success": "1 when the last deploy converged (every health gate passed), else 0",
    "ironserve_deploy_stage_seconds": "Wall time of each stage of the last deploy",
    "ironserve_deploy_seconds": "Wall time of the whole last deploy (time to serving)",
    "ironserve_unit_live_info": "The live configuration of a unit: recipe and generation (its unit file's digest)",
    "ironserve_gate_passed": "1 when the unit passed its health gate in the last deploy, else 0",
    "ironserve_audit_drift": "1 when the audit check found drift on the host, 0 when clean",
    "ironserve_audit_last_timestamp_seconds": "Unix time of the last audit",
}


@dataclass(frozen=True)
class Sample:
    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


def _label_value(value: str) -> str:
    text = str(value)
    if not _VALUE.fullmatch(text):
        raise ValueError(f"metric label value {text!r} is not a name ironserve writes (letters, digits, ._:@/-)")
    return text


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"metric value {value!r} is not finite")
    return repr(round(float(value), 3))


def exposition(samples: list[Sample]) -> str:
    """The Prometheus text format of ``samples``: one HELP and TYPE (gauge) per name, in first-seen order."""
    by_name: dict[str, list[Sample]] = {}
    for sample in samples:
        if not _NAME.fullmatch(sample.name) or not sample.name.startswith("ironserve_"):
            raise ValueError(f"metric name {sample.name!r}: ironserve writes ironserve_* names only")
        by_name.setdefault(sample.name, []).append(sample)
    lines = []
    for name, group in by_name.items():
        lines += [f"# HELP {name} {HELP.get(name, name)}", f"# TYPE {name} gauge"]
        for sample in group:
            labels = []
            for key, value in sample.labels.items():
                if not _LABEL.fullmatch(key):
                    raise ValueError(f"metric label name {key!r} is not a label name")
                labels.append(f'{key}="{_label_value(value)}"')
            body = "{" + ",".join(labels) + "}" if labels else ""
            lines.append(f"{name}{body} {_number(sample.value)}")
    return "\n".join(lines) + "\n"


@dataclass
class DeployOutcome:
    """What the controller knows of one host at the end of a deploy."""

    recipe: str
    success: bool
    finished_at: float
    stages: dict[str, float]  # stage -> seconds, in order
    gates: dict[str, bool]  # unit -> its health gate passed (units this run gated)
    units: list[tuple[str, str]]  # (unit, role) of the host


def deploy_samples(outcome: DeployOutcome) -> list[Sample]:
    recipe = {"recipe": outcome.recipe}
    samples = [
        Sample("ironserve_deploy_last_timestamp_seconds", round(outcome.finished_at, 3), recipe),
        Sample("ironserve_deploy_last_success", outcome.success, recipe),
        Sample("ironserve_deploy_seconds", round(sum(outcome.stages.values()), 3), recipe),
    ]
    samples += [
        Sample("ironserve_deploy_stage_seconds", seconds, {**recipe, "stage": stage})
        for stage, seconds in outcome.stages.items()
    ]
    samples += [Sample("ironserve_gate_passed", ok, {**recipe, "unit": unit}) for unit, ok in outcome.gates.items()]
    return samples


def unit_info_lines(recipe: str, unit: str, role: str, generation: str) -> str:
    """The ironserve_unit_live_info sample of one unit (its generation is read on the host, so one line apiece)."""
    return exposition(
        [
            Sample(
                "ironserve_unit_live_info", 1, {"recipe": recipe, "unit": unit, "role": role, "generation": generation}
            )
        ]
    ).splitlines()[-1]


def timing_table(stages: dict[str, float]) -> str:
    """The per-stage timing table the deploy ends with: stage, seconds, share, running total."""
    total = sum(stages.values()) or 1.0
    rows, running = [f"{'stage':<16} {'seconds':>9} {'share':>6} {'elapsed':>9}"], 0.0
    for stage, seconds in stages.items():
        running += seconds
        rows.append(f"{stage:<16} {seconds:>9.1f} {seconds / total:>6.0%} {running:>9.1f}")
    rows.append(f"{'time to serving':<16} {running:>9.1f}")
    return "\n".join(rows)


def timing_json(recipe: str, success: bool, stages: dict[str, float]) -> str:
    return json.dumps(
        {
            "recipe": recipe,
            "success": success,
            "time_to_serving_s": round(sum(stages.values()), 3),
            "stages": [{"stage": s, "seconds": round(v, 3)} for s, v in stages.items()],
        },
        indent=2,
    )


def audit_samples(results: dict[tuple[str, str], bool], when: float) -> list[Sample]:
    """``results``: (host, check id) -> drift found; a check id's other characters become _ in its label."""
    samples = [Sample("ironserve_audit_last_timestamp_seconds", round(when, 3))]
    return samples + [
        Sample(
            "ironserve_audit_drift",
            drift,
            {"host": host, "check": re.sub(r"[^A-Za-z0-9_.:@/\[\]+=-]", "_", check)[:200]},
        )
        for (host, check), drift in sorted(results.items())
    ]


def write_textfile(path: str, text: str) -> str | None:
    """Write a .prom file atomically on this machine (the controller: `ironserve audit --prometheus-textfile`),
    with the hosts' own writer (files/bin/ironserve-textfile): one writer, one set of rules."""
    import importlib.machinery
    import importlib.util
    from pathlib import Path

    from .resources import files_dir

    target = Path(path).expanduser()
    if target.suffix != ".prom":
        raise ValueError(f"{path}: a textfile collector reads *.prom files only; name it {target.stem}.prom")
    loader = importlib.machinery.SourceFileLoader("ironserve_textfile", str(files_dir() / "bin" / "ironserve-textfile"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module.write(target.stem, text, str(target.parent))


def scrape_address(proc) -> str:
    """Where Prometheus reaches a process's metrics: the address it binds, or its host's address when it binds all
    of them (a process bound to the loopback is scraped there: only a Prometheus on its host reaches it)."""
    bind = proc.bind if proc.bind not in (None, "", "0.0.0.0", "::") else proc.address
    host = f"[{bind}]" if ":" in bind else bind
    return f"{host}:{proc.metrics_port}"


def file_sd(recipe: str, processes: list, exporters: list[tuple[str, str, int]]) -> list[dict]:
    """Prometheus file_sd target groups: every engine (rank 0: the ranks of a group share its HTTP server) and
    router with its metrics on, and the node exporter of each host (``exporters``: (host, address, port))."""
    groups = []
    for proc in processes:
        if proc.metrics_port is None:
            continue
        groups.append(
            {
                "targets": [scrape_address(proc)],
                "labels": {
                    "recipe": recipe,
                    "role": proc.role,
                    "group": str(proc.group),
                    "rank": str(proc.node_rank),
                    "host": proc.host,
                    "unit": proc.unit,
                },
            }
        )
    for host, address, port in exporters:
        target = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        groups.append({"targets": [target], "labels": {"recipe": recipe, "role": "node", "host": host}})
    for group in groups:
        for value in group["labels"].values():
            _label_value(value)
    return groups
