"""Deploy GLM-5 (NVFP4 on RTX PRO 6000 / GB200).

    pyinfra inventories/<cluster>.py deploys/glm5.py [--data recipe=ID] [--data launch=false]

The recipe is the catalogue's default for (glm5, the inventory's hardware); see recipes/defaults.yaml.
"""

from roles.entry import deploy_model

deploy_model("glm5")
