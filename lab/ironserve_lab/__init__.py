"""ironserve lab: local multi-host test cluster (systemd-nspawn hosts with real systemd and sshd,
a private bridge with no way out, an air-gapped apt/pip supply and stand-in GPU/NPU hardware).

A package of its own (lab/ in the repository, not in ironserve's wheel): it depends on ironserve, never the other
way; `ironserve lab` reaches it where it is installed (a checkout's environment).

Modules: state (paths, network plan, state.json), system (helpers, preflight), rootfs (mmdebstrap
base), network (bridge, netns, veth), cgroups, hosts (overlay + nspawn boot), supply (apt repo,
wheelhouse, HTTP server), profiles (the catalogue's hardware profiles as the stand-ins answer them), standins
(stand-in hardware and Docker packages), runtime (the runtimes' interface) with cpu_runtime, cuda_runtime and
npu_runtime (their pins: pinfiles, requirements/*.txt), images (the docker stand-in's image registry, the SGLang
parser venvs behind it, stand-in model checkpoints), cluster (up/status/down), cli.
"""
