"""Download and verify the pinned CUDA-L1 release files.

Pure standard library (``urllib``); no Snakemake. Every failure raises
:class:`FetchError` with a one-line message naming the URL or file.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

#: Upstream repository and the commit whose release data we reproduce.
UPSTREAM_REPO = "deepreinforce-ai/CUDA-L1"
PINNED_COMMIT = "51e8356bf844101cab2aeeca4bdff47ebb1953b8"
RAW_URL_TEMPLATE = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"

#: sha256 of each release file at :data:`PINNED_COMMIT`, by release-relative path.
PINNED_SHA256 = {
    "optimized_cuda_code/h100.json": "bb3c6f83ca3502d4ff53512163e14171f09b1124c35d2134dfd43576baefe57e",
    "optimized_cuda_code/a100.json": "2a0c871afc82584611a62a67b8ba85d16c72d2b0a58de7183badc34f9ed1719d",
    "optimized_cuda_code/h20.json": "012a072f734be60cad4c5635ac28ae799b2fe3a3783410f4fe2159f7af79502a",
    "optimized_cuda_code/l40.json": "c73e686cc762857ded8f71e145e6fa0dc3eef7a302e54e01b96c04d706485c65",
    "optimized_cuda_code/3090.json": "a63c64d848114c13a4f0f13cabc83886fc6447842fe61a8de2bd033d9047e9b1",
    "more_baselines/cuda_graph.json": "27c22e4efa7190ac6070ec1dea9032f275f4229f51bc552fd79caa9a34065441",
    "more_baselines/cudnn.json": "84036b8001e1c335cf8163d1028dce616d33a77fc1817c8b6e14cdc73075338e",
}

_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A download or checksum failure; the message is a single line."""


def release_url(path: str, repo: str = UPSTREAM_REPO, commit: str = PINNED_COMMIT, base_url: str | None = None) -> str:
    """URL of release-relative ``path``; ``base_url`` replaces the GitHub raw prefix."""
    path = path.lstrip("/")
    if base_url:
        return base_url.rstrip("/") + "/" + path
    return RAW_URL_TEMPLATE.format(repo=repo, commit=commit, path=path)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch_to(url: str, fileobj, timeout: float) -> str:
    """Stream ``url`` into ``fileobj``; return the sha256 of what was written."""
    h = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        for chunk in iter(lambda: resp.read(_CHUNK), b""):
            h.update(chunk)
            fileobj.write(chunk)
    return h.hexdigest()


def download(
    url: str,
    dest: str | os.PathLike,
    sha256: str | None = None,
    timeout: float = 60,
    retries: int = 2,
) -> Path:
    """Download ``url`` to ``dest`` atomically, verifying ``sha256`` if given.

    The body goes to a temporary file next to ``dest`` and is moved into place
    with :func:`os.replace` only once complete and verified, so ``dest`` never
    holds a partial or wrong file. Network errors (connection, timeout, HTTP
    5xx) are retried ``retries`` times; HTTP 4xx, checksum mismatches and a host name
    that does not resolve (no network, no DNS) are not. On failure an already existing
    ``dest`` is left untouched.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    last: Exception | None = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(2**attempt, 10))
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        try:
            try:
                with os.fdopen(fd, "wb") as f:
                    got = _fetch_to(url, f, timeout)
            except urllib.error.HTTPError as e:
                last = FetchError(f"download failed for {url}: HTTP {e.code} {e.reason}")
                if e.code < 500:
                    raise last from None
                continue
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, socket.gaierror):  # waiting does not bring a network
                    raise FetchError(f"download failed for {url}: {reason} (no network?)") from None
                last = FetchError(f"download failed for {url}: {reason}")
                continue
            if sha256 and got != sha256.lower():
                raise FetchError(f"checksum mismatch for {url}: expected {sha256}, got {got}")
            os.replace(tmp, dest)
            return dest
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise FetchError(f"{last} (after {retries + 1} attempts)")


def verify_local(path: str | os.PathLike, sha256: str) -> Path:
    """Check a user-supplied release file against its expected ``sha256``."""
    path = Path(path)
    if not path.is_file():
        raise FetchError(f"{path}: release file not found")
    got = sha256_file(path)
    if got != sha256.lower():
        raise FetchError(
            f"{path}: sha256 {got} does not match the pinned {sha256} "
            "(set release_sha256 in the config to accept another release)"
        )
    return path
