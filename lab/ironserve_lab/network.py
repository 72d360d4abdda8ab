"""Lab network: one Linux bridge, one network namespace + veth pair per host.

Design goals (host safety):
- The subnet lives only on the lab bridge. Hosts get an address and the connected route,
  no default route, so they can reach each other and the supply server on the gateway
  address, and nothing else. No NAT, no forwarding, no network sysctl changed on this machine:
  host-to-host traffic is bridged (L2), host-to-gateway traffic is local delivery.
- Every object carries an "ironlab" name so `down` (and the tests) can find leftovers.
"""

from __future__ import annotations

import os

from .state import BRIDGE, GATEWAY, PREFIX_LEN, SUBNET_PREFIX
from .system import LabError, run

NETNS_DIR = "/run/netns"


def netns_name(host: str) -> str:
    return f"ironlab-{host}"


def veth_name(host: str) -> str:
    name = f"ilab-{host}"
    if len(name) > 15:  # IFNAMSIZ
        raise LabError(f"interface name {name!r} too long")
    return name


def _link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def ensure_bridge() -> None:
    # Refuse to shadow a subnet this machine already uses elsewhere.
    for line in run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
        parts = line.split()
        if f" {SUBNET_PREFIX}." in f" {parts[3]}" and parts[1] != BRIDGE:
            raise LabError(
                f"subnet {SUBNET_PREFIX}.0/{PREFIX_LEN} already in use on {parts[1]}; the lab will not touch it"
            )
    if not _link_exists(BRIDGE):
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    addrs = run(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE]).stdout
    if f"{GATEWAY}/" not in addrs:
        run(["ip", "addr", "add", f"{GATEWAY}/{PREFIX_LEN}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def remove_bridge() -> None:
    if _link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE])


def netns_path(host: str) -> str:
    return os.path.join(NETNS_DIR, netns_name(host))


def ensure_netns(host: str, address: str) -> None:
    ns, veth = netns_name(host), veth_name(host)
    if not os.path.exists(netns_path(host)):
        run(["ip", "netns", "add", ns])
    if not _link_exists(veth):
        # The peer is created directly inside the namespace, named host0 like nspawn's own veth.
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "host0", "netns", ns])
    run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
    addrs = run(["ip", "-n", ns, "-o", "-4", "addr", "show", "dev", "host0"]).stdout
    if f"{address}/" not in addrs:
        run(["ip", "-n", ns, "addr", "add", f"{address}/{PREFIX_LEN}", "dev", "host0"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "link", "set", "host0", "up"])


def remove_netns(host: str) -> None:
    # Deleting the namespace destroys host0, which destroys its veth peer on the bridge.
    if os.path.exists(netns_path(host)):
        run(["ip", "netns", "del", netns_name(host)])
    if _link_exists(veth_name(host)):
        run(["ip", "link", "del", veth_name(host)], check=False)


def lab_netns() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("ironlab-")]


def lab_links() -> list[str]:
    out = run(["ip", "-o", "link", "show"], check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n == BRIDGE or n.startswith("ilab-")]
