"""Deploy MiniMax M2.5 NVFP4 (2x RTX PRO 6000, uv venv).

    pyinfra inventories/<cluster>.py deploys/minimax_m2.py [--data recipe=ID] [--data launch=false]

The recipe is the catalogue's default for (minimax-m2.5, the inventory's hardware); see recipes/defaults.yaml.
"""

from roles.entry import deploy_model

deploy_model("minimax-m2.5")
