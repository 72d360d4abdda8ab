"""Deploy Llama 3 8B (multi-node TP example).

    pyinfra inventories/<cluster>.py deploys/llama3.py [--data recipe=ID] [--data launch=false]

The recipe is the catalogue's default for (llama3, the inventory's hardware); see recipes/defaults.yaml.
"""

from roles.entry import deploy_model

deploy_model("llama3")
