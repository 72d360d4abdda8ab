"""Docker Registry HTTP API v2, the calls ``docker pull``/``push`` make: resolve a tag to its manifest digest
(``ironserve lock``), check and upload blobs and manifests (the lab's image publishing).

A registry is ``host[:port]`` over https, trusting the system's CAs plus an optional CA file (an internal
registry's own CA). Anonymous, or with a user and password (``credentials``): sent as HTTP Basic auth only to a
registry (or its token service, over https) that asks for it, never logged.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join([MANIFEST_V2, OCI_MANIFEST, MANIFEST_LIST, OCI_INDEX])
DOCKER_HUB = "registry-1.docker.io"


class RegistryError(RuntimeError):
    """A registry answered something other than what the API promises (message names the call)."""


def repository_path(repo: str) -> str:
    """The API path of a Docker Hub style name: official images live under library/ (``ubuntu`` -> library/ubuntu)."""
    return repo if "/" in repo else f"library/{repo}"


class Registry:
    """A Docker Registry HTTP API v2 client for one registry (``host:port``, https, a CA file to trust)."""

    def __init__(
        self,
        address: str,
        ca_file: str | os.PathLike | None = None,
        scheme: str = "https",
        timeout: float = 600,
        credentials: tuple[str, str] | None = None,
    ):
        self.base = f"{scheme}://{address}"
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        self.token: str | None = None
        self.basic = "Basic " + base64.b64encode(":".join(credentials).encode()).decode() if credentials else None
        self.use_basic = False  # set once the registry asked for Basic auth

    def _request(self, method: str, url: str, *, data=None, headers: dict | None = None, length: int | None = None):
        req = urllib.request.Request(
            url if url.startswith("http") else self.base + url, data=data, method=method, headers=dict(headers or {})
        )
        if length is not None:
            req.add_header("Content-Length", str(length))
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        elif self.use_basic:
            req.add_header("Authorization", self.basic)
        try:
            return urllib.request.urlopen(req, context=self.context, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "")
            if exc.status == 401 and self._answer(challenge):
                return self._request(method, url, data=data, headers=headers, length=length)
            return exc

    def _answer(self, challenge: str) -> bool:
        """Meet a registry's 401 once: a Bearer token (anonymous, or for the credentials), or Basic auth with them."""
        if challenge.startswith("Bearer ") and not self.token:
            return self._login(challenge)
        if challenge.startswith("Basic ") and self.basic and not self.use_basic:
            self.use_basic = self.base.startswith("https://")  # never a password in clear text
            return self.use_basic
        return False

    def _login(self, challenge: str) -> bool:
        """A token for a registry that asks for one (Docker Hub: auth.docker.io): anonymous, or for the credentials."""
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if not params.get("realm", "").startswith("https://"):
            return False
        query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
        req = urllib.request.Request(
            f"{params['realm']}?{query}", headers={"Authorization": self.basic} if self.basic else {}
        )
        with urllib.request.urlopen(req, context=self.context, timeout=min(60, self.timeout)) as resp:
            body = json.loads(resp.read())
        self.token = body.get("token") or body.get("access_token")
        return bool(self.token)

    def digest(self, repo: str, reference: str) -> str | None:
        """The manifest digest a tag (or digest) names in this registry; None when the registry does not know it."""
        resp = self._request("HEAD", f"/v2/{repo}/manifests/{reference}", headers={"Accept": ACCEPT})
        if resp.status == 404:
            return None
        if resp.status != 200 or not resp.headers.get("Docker-Content-Digest"):
            raise RegistryError(f"HEAD {self.base}/v2/{repo}/manifests/{reference}: HTTP {resp.status}")
        return resp.headers["Docker-Content-Digest"]

    def put_manifest(self, repo: str, tag: str, blob: bytes, media_type: str) -> None:
        resp = self._request(
            "PUT", f"/v2/{repo}/manifests/{tag}", data=blob, length=len(blob), headers={"Content-Type": media_type}
        )
        if resp.status != 201:
            raise RegistryError(f"PUT {self.base}/v2/{repo}/manifests/{tag}: HTTP {resp.status}")

    def manifest(self, repo: str, reference: str) -> dict:
        resp = self._request("GET", f"/v2/{repo}/manifests/{reference}", headers={"Accept": ACCEPT})
        if resp.status != 200:
            raise RegistryError(f"GET {self.base}/v2/{repo}/manifests/{reference}: HTTP {resp.status}")
        try:
            return json.loads(resp.read())
        except ValueError:
            raise RegistryError(f"GET {self.base}/v2/{repo}/manifests/{reference}: not a JSON manifest") from None

    def layers(self, repo: str, reference: str, max_images: int = 16) -> list[str]:
        """The layer blobs of an image's manifest, or of each image a multi-platform index names (its first
        ``max_images``), in order, each once."""
        manifest = self.manifest(repo, reference)
        images = [self.manifest(repo, m["digest"]) for m in manifest.get("manifests", [])[:max_images]]
        found = [layer["digest"] for image in images or [manifest] for layer in image.get("layers", [])]
        return list(dict.fromkeys(found))

    def has_blob(self, repo: str, digest: str) -> bool:
        return self._request("HEAD", f"/v2/{repo}/blobs/{digest}").status == 200

    def mount_blob(self, repo: str, digest: str, source: str) -> bool:
        """Link a blob the registry holds in ``source`` into ``repo`` without uploading it (cross-repository
        mount, as ``docker push`` does for shared base layers); False when the registry did not."""
        query = urllib.parse.urlencode({"mount": digest, "from": source})
        return self._request("POST", f"/v2/{repo}/blobs/uploads/?{query}", data=b"", length=0).status == 201

    def push_blob(self, repo: str, digest: str, path: Path) -> None:
        start = self._request("POST", f"/v2/{repo}/blobs/uploads/", data=b"", length=0)
        if start.status != 202:
            raise RegistryError(f"POST {self.base}/v2/{repo}/blobs/uploads/: HTTP {start.status}")
        location = urllib.parse.urljoin(self.base + "/", start.headers["Location"])
        sep = "&" if "?" in location else "?"
        with open(path, "rb") as fh:
            done = self._request(
                "PUT",
                f"{location}{sep}digest={digest}",
                data=fh,
                length=path.stat().st_size,
                headers={"Content-Type": "application/octet-stream"},
            )
        if done.status != 201:
            raise RegistryError(f"PUT blob {digest} to {self.base}/v2/{repo}: HTTP {done.status}")
