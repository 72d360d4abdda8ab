"""ironserve: recipes for serving large models with SGLang, rendered and provisioned on pyinfra."""

__version__ = "0.1.0"
