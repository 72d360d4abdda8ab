"""Inert stand-ins for CUDA-only imports; see each package's docstring for where it is used."""
