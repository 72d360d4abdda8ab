"""Your cluster, as a pyinfra inventory (written by `ironserve init`; edit the hosts and their data).

    ironserve render --list                                       # the catalogue's recipes and their hardware
    ironserve render glm5-nvfp4-rtx6000-tp8 --inventory inventory.py --format shell   # what runs on each host
    ironserve lint --inventory inventory.py glm5-nvfp4-rtx6000-tp8 --offline
    pyinfra inventory.py deploys/glm5.py --dry                     # what the deploy would change (connects)
    pyinfra inventory.py deploys/glm5.py                           # provision, start, health-gate
    ironserve audit inventory.py deploys/glm5.py                   # drift
    ironserve status inventory.py deploys/glm5.py                  # endpoint, served model, units

Each top-level list is a group of hosts: `"name"` or `("name", {host data})`. Data every host shares lives in
group_data/all.py, data of one group in group_data/<group>.py (pyinfra's convention; ironserve reads the
inventory with pyinfra's own loader, so render, lint, audit and status see what the deploy sees).
`ironserve schema --host-data` lists every key ironserve reads; an unknown or malformed key stops every
command before any host is touched.

Single-node recipes run one independent copy per host; multi-node recipes take the hosts in the order listed
(the first is rank 0). `--limit gpu_nodes` or `--limit 'gpu-*'` picks hosts by group or name, as in pyinfra.
"""

gpu_nodes = [
    # ssh_hostname: the address ironserve and the other nodes reach this host at (pyinfra connects there too)
    ("gpu-1", {"ssh_hostname": "192.0.2.11"}),
    ("gpu-2", {"ssh_hostname": "192.0.2.12"}),
]
