"""ironserve lab stand-in GPU image: what the real image's engine build accepts beyond its PyPI parser.

sitecustomize.py of a stand-in image (lab/ironserve_lab/gpu_images.py) of an engine era whose real images accept
flags no PyPI release ever had (lab/ironserve_lab/images.py IMAGE_EXTRAS: a patched nightly image). Before an SGLang
server parser parses, exactly those flags are registered and those choices added; nothing else changes, so the
PyPI release's own parser parses everything else with its own messages.
"""

import argparse
import json

_EXTRAS = json.loads('__EXTRAS__')
_HELP = "(ironserve lab: accepted by this image's engine build, absent from its PyPI release)"

if _EXTRAS.get("flags") or _EXTRAS.get("choices"):
    _parse_known_args = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        if "--model-path" in self._option_string_actions and not getattr(self, "_ironlab_extras", False):
            self._ironlab_extras = True
            for flag, action in (_EXTRAS.get("flags") or {}).items():
                if flag not in self._option_string_actions:
                    self.add_argument(flag, action=action, help=_HELP)
            for flag, extra in (_EXTRAS.get("choices") or {}).items():
                act = self._option_string_actions.get(flag)
                if act is not None and act.choices is not None:
                    act.choices = list(act.choices) + [c for c in extra if c not in act.choices]
        return _parse_known_args(self, args, namespace)

    argparse.ArgumentParser.parse_known_args = parse_known_args
