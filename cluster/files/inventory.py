"""What this host holds of a Hugging Face repo, for the launcher to share it across the cluster.

`python -m cluster.files.inventory` reads one JSON line on stdin, {"repo", "revision"} (revision
None: the cache's main), and prints one: {"revision", "files": {name: [size, sha256]}} for the
files of that commit in this host's Hugging Face cache. The cache names weight blobs by their
sha256, so no weight is read. A rank serving its host's files to its peers finds them here too.
No MLX here.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from cluster.files.manifest import Manifest, folder_manifest

REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
COMMIT = re.compile(r"[0-9a-f]{40}")


def repo_folder(repo: str) -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"


def holdings(repo: str, revision: str | None) -> tuple[str | None, Manifest, dict[str, Path]]:
    """The commit, and the manifest and paths of the files this host's cache has of it."""
    if not REPO_ID.fullmatch(repo) or (revision is not None and not COMMIT.fullmatch(revision)):
        raise ValueError(f"not a repo id and commit: {repo!r} {revision!r}")
    root = repo_folder(repo)
    if revision is None:
        try:
            revision = (root / "refs" / "main").read_text().strip()
        except OSError:
            revision = None
        if revision is not None and not COMMIT.fullmatch(revision):
            revision = None
    snapshot = root / "snapshots" / revision if revision is not None else None
    if snapshot is None or not snapshot.is_dir():
        return revision, Manifest(repo.replace("/", "--"), {}), {}
    manifest, where = folder_manifest(snapshot, name=repo.replace("/", "--"))
    return revision, manifest, where


def main() -> int:
    try:
        asked = json.loads(sys.stdin.readline(1 << 16))
        revision, manifest, _ = holdings(str(asked["repo"]), asked.get("revision"))
    except (ValueError, KeyError, TypeError) as e:
        print(json.dumps({"error": str(e)}))
        return 2
    print(json.dumps({"revision": revision, "files": manifest.to_json()["files"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
