"""Deploy Kimi K2.5 (INT4/NVFP4 on RTX PRO 6000).

    pyinfra inventories/<cluster>.py deploys/kimi_k25.py [--data recipe=ID] [--data launch=false]

The recipe is the catalogue's default for (kimi-k2.5, the inventory's hardware); see recipes/defaults.yaml.
"""

from roles.entry import deploy_model

deploy_model("kimi-k2.5")
