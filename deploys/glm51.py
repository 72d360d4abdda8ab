"""Deploy GLM-5.1 W4A8 (Atlas 800I A3, PD mixed or disaggregated).

    pyinfra inventories/<cluster>.py deploys/glm51.py [--data recipe=ID] [--data launch=false]

The recipe is the catalogue's default for (glm5.1, the inventory's hardware); see recipes/defaults.yaml.
"""

from roles.entry import deploy_model

deploy_model("glm5.1")
