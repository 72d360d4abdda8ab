"""Node exporter: the distribution's prometheus-node-exporter on every host, and ironserve's metrics writer.

- ``/usr/local/lib/ironserve/ironserve-textfile`` (files/bin): the one writer of ``ironserve_*`` metrics on a host
  (the deploy's outcome and stage timings, roles/deploy_clock.py; the rank guard's group restarts; the restart
  backoff's waits): atomic, 0644, ``*.prom`` in the textfile collector's directory. Installed on every host.
- With host data ``node_exporter`` (default true): ``/etc/default/prometheus-node-exporter`` first (the exporter
  listens on the host's own address, never wider, and reads ironserve.metrics.TEXTFILE_DIR), then the package
  (keeping that file: dpkg's confold), the collector directory root:root 0755 (root writes there: no other user
  may), the service enabled and running, restarted when its configuration changed.

Host data: ``node_exporter``, ``node_exporter_port`` (ironserve/hostdata.py).
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files, systemd

from ironserve.metrics import TEXTFILE_DIR
from ironserve.resources import files_dir
from roles.common import run_if_changed
from roles.context import DeploymentContext
from roles.desired import DesiredFile, text_file
from roles.sglang_service import LIB_DIR

PACKAGE = "prometheus-node-exporter"
SERVICE = "prometheus-node-exporter.service"
DEFAULTS_FILE = "/etc/default/prometheus-node-exporter"
TEXTFILE = f"{LIB_DIR}/ironserve-textfile"


def exporter_args(address: str, port: int) -> str:
    """The Debian unit's $ARGS: the host's own address only, the textfile collector's directory."""
    listen = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    return f"--web.listen-address={listen} --collector.textfile.directory={TEXTFILE_DIR}"


def defaults_text(address: str, port: int) -> str:
    return (
        "# Managed by ironserve (roles/node_exporter.py); local edits are overwritten on the next deploy.\n"
        f'ARGS="{exporter_args(address, port)}"\n'
    )


def own_address(ctx: DeploymentContext) -> str:
    return next(h.address for h in ctx.hosts if h.name == ctx.host_name)


@operation()
def exporter_installed(package: str = PACKAGE):
    """The package is installed (apt lists refreshed first; the configuration written before it is kept)."""
    if package in (host.get_fact(DebPackages) or {}):
        host.noop(f"{package} is installed")
        return
    yield (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
        f"-o Dpkg::Options::=--force-confold {shlex.quote(package)}"
    )


@deploy("Node exporter and ironserve's metrics writer")
def apply(ctx: DeploymentContext) -> None:
    # (LIB_DIR exists: roles/sglang_service.py made it on every host)
    files.put(
        name="ironserve-textfile metrics writer",
        src=str(files_dir() / "bin" / "ironserve-textfile"),
        dest=TEXTFILE,
        mode="755",
        user="root",
        group="root",
    )
    if not ctx.host.node_exporter:
        return
    config = files.put(
        name=f"{DEFAULTS_FILE}: bound to the host's address",
        src=StringIO(defaults_text(own_address(ctx), ctx.host.node_exporter_port)),
        dest=DEFAULTS_FILE,
        mode="644",
        user="root",
        group="root",
    )
    installed = exporter_installed(name=f"Install {PACKAGE}")
    files.directory(
        name=f"{TEXTFILE_DIR}: textfile collector directory, root's only",
        path=TEXTFILE_DIR,
        mode="755",
        user="root",
        group="root",
    )
    run_if_changed(
        name=f"{SERVICE} picks up its configuration",
        triggers=[config, installed],
        command=f"systemctl restart {SERVICE}",
    )
    systemd.service(name=f"{SERVICE} running and enabled", service=SERVICE, running=True, enabled=True)


def desired_files(ctx: DeploymentContext) -> list[DesiredFile]:
    """For `ironserve audit`: the writer, and the exporter's configuration."""
    out = [text_file(TEXTFILE, (files_dir() / "bin" / "ironserve-textfile").read_text(), 0o755)]
    if ctx.host.node_exporter:
        out.append(text_file(DEFAULTS_FILE, defaults_text(own_address(ctx), ctx.host.node_exporter_port)))
    return out
