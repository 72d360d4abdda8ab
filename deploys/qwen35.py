"""Deploy Qwen3.5-397B (NVFP4/FP8 on RTX PRO 6000).

    pyinfra inventories/<cluster>.py deploys/qwen35.py [--data recipe=ID] [--data launch=false]

The recipe is the catalogue's default for (qwen3.5, the inventory's hardware); see recipes/defaults.yaml.
"""

from roles.entry import deploy_model

deploy_model("qwen3.5")
