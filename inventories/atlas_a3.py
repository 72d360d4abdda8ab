"""Example inventory: GLM-5.1 W4A8 on Huawei Atlas 800I A3 nodes (16 NPU dies each).

    pyinfra inventories/atlas_a3.py deploys/glm51.py                                   # PD-mixed, 2 nodes
    pyinfra inventories/atlas_a3.py deploys/glm51.py --data recipe=glm5.1-w4a8-a3-1p1d-32-128k   # 4 nodes

Hosts are placed in order: prefill instances first (rank 0 first in each), then decode. List exactly the
number of nodes the recipe needs (`ironserve render RECIPE --inventory inventories/atlas_a3.py` checks it).
`nic` fills GLOO_SOCKET_IFNAME and HCCL_SOCKET_IFNAME: the wrong NIC is the classic multi-node hang.
"""

_common = {
    "ssh_user": "root",
    "hardware": "atlas-800i-a3",
    "nic": "enp189s0f0",
    "model_source": "path",
    "model_path": "/mnt/models/GLM-5.1-w4a8",
    # driver, firmware, CANN toolkit and NNAL .run packages, from the cluster's package store
    "ascend_package_store": "/srv/ascend-packages",
}

a3_nodes = [(f"a3-{i}", {**_common, "ssh_hostname": f"192.0.2.{30 + i}"}) for i in range(2)]
