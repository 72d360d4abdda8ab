"""Deploy a tiny locally generated model on cpu-lab hosts (real SGLang on CPU).

    pyinfra inventories/<cluster>.py deploys/tiny.py [--data recipe=ID] [--data launch=false]

The recipe is the catalogue's default for (tiny, the inventory's hardware); see recipes/defaults.yaml.
"""

from roles.entry import deploy_model

deploy_model("tiny")
