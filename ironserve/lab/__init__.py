"""ironserve lab: local multi-host test cluster (systemd-nspawn hosts with real systemd and sshd,
a private bridge with no way out, an air-gapped apt/pip supply and stand-in GPU/NPU hardware).

Modules: state (paths, network plan, state.json), system (helpers, preflight), rootfs (debootstrap
base), network (bridge, netns, veth), cgroups, hosts (overlay + nspawn boot), supply (apt repo,
wheelhouse, HTTP server), standins (stand-in hardware and Docker packages), images (the docker stand-in's
image registry, the SGLang parser venvs behind it, stand-in model checkpoints), cluster (up/status/down), cli.
"""
