"""Remote mode's set-up: which URL `[scm] remote` names, and the clone a consumer works in.

How the target and story branches move on the remote is `targets.remote.RemoteTarget`.
A `remote` is either the name of a remote of the checkout (`origin`) or a URL / path. Every
host must reach the same repository by the same URL: the URL is the project's identity in the
rows, the lane lease and the queue names (see Project.key).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigError
from .runner import Git

__all__ = ["resolve_remote_url", "ensure_clone"]

_URL_LIKE = re.compile(r"^[a-z][a-z0-9+.-]*://|^[^/\s]+@[^:\s]+:|^/|^\.|.*\.git/?$", re.I)


def resolve_remote_url(remote: str, checkout: Path | None) -> str:
    """The URL `remote` stands for: itself when it looks like a URL or path, else the URL of
    the checkout's remote of that name."""
    remote = remote.strip()
    if _URL_LIKE.match(remote):
        if remote.startswith((".", "/")) and "://" not in remote:
            return str(Path(remote).expanduser().resolve())
        return remote
    if checkout is None:
        raise ConfigError(f"[scm] remote = \"{remote}\": a remote name needs a checkout "
                          "(--project); give the URL instead")
    proc = Git(checkout).run("remote", "get-url", remote, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"[scm] remote = \"{remote}\": {checkout} has no remote of that name")
    url = proc.stdout.strip()
    if url.startswith((".", "/")) and "://" not in url:
        base = Path(url) if url.startswith("/") else (checkout / url)
        return str(base.resolve())
    return url


def ensure_clone(url: str, directory: Path) -> Path:
    """Create a clone of `url` at `directory`, or check that the one there is a clone of it.

    The clone's own checkout is detached: bmad-loop never needs a branch checked out there, and
    a checked-out branch would be one that a fetch may not update.
    """
    directory = Path(directory).expanduser().resolve()
    if (directory / ".git").exists():
        git = Git(directory)
        urls = git.run("remote", "-v", check=False).stdout.split()
        if url not in urls:
            raise ConfigError(f"--clone {directory}: a git repository that is not a clone of {url}")
        return directory
    if directory.exists() and any(directory.iterdir()):
        raise ConfigError(f"--clone {directory}: exists, is not empty and is not a git clone")
    directory.parent.mkdir(parents=True, exist_ok=True)
    proc = Git(directory.parent).run("clone", "--quiet", "--no-checkout", url, directory, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"--clone {directory}: cannot clone {url}: {proc.stderr.strip()}")
    git = Git(directory)
    head = git.rev("HEAD")
    if head is not None:
        git.run("checkout", "--quiet", "--detach", head)
    return directory
