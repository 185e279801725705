"""A private HOME per real CLI, pointed at the fake model server, with nothing reaching out.

`prepare(cli, home, ports)` writes the CLI's own settings into `home` and returns the environment
variables the CLI needs: the local endpoint and a key, telemetry, update checks and plugin syncs
off (each through the CLI's own settings or variables), and retries cut to one so a fault test
takes seconds, not minutes. Every CLI also gets HTTPS_PROXY/HTTP_PROXY naming the counting proxy
(anything that tries to leave loopback through it is refused and counted), NO_PROXY for loopback.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Ports", "prepare", "CLIS", "EXECUTABLES", "MODEL"]

CLIS = ("claude", "codex", "gemini", "opencode", "qwen")
EXECUTABLES = {"claude": "claude", "codex": "codex", "gemini": "gemini", "opencode": "opencode", "qwen": "qwen"}
MODEL = "fake-model"


@dataclass(frozen=True)
class Ports:
    model: int
    proxy: int
    seed: Path = Path("/nonexistent")  # what was installed beside the CLIs for their run time

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.model}"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _common(home: Path, ports: Ports) -> dict:
    proxy = f"http://127.0.0.1:{ports.proxy}"
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "https_proxy": proxy, "http_proxy": proxy,
            "ALL_PROXY": proxy, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            "NO_UPDATE_NOTIFIER": "1", "NPM_CONFIG_UPDATE_NOTIFIER": "false", "DO_NOT_TRACK": "1"}


def _claude(home: Path, ports: Ports) -> dict:
    # Onboarding done, so print mode asks nothing; the key is accepted without the approval prompt.
    _write(home / ".claude.json", json.dumps({"hasCompletedOnboarding": True, "autoUpdates": False,
                                              "customApiKeyResponses": {"approved": ["fake-key"]}}))
    _write(home / ".claude" / "settings.json", json.dumps({"autoUpdates": False}))
    return {"ANTHROPIC_BASE_URL": ports.base, "ANTHROPIC_API_KEY": "fake-key",
            "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
            "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": "1"}


def _codex(home: Path, ports: Ports) -> dict:
    _write(home / ".codex" / "config.toml", f"""\
model = "{MODEL}"
model_provider = "fake"
check_for_update_on_startup = false

[model_providers.fake]
name = "fake"
base_url = "{ports.base}/v1"
wire_api = "responses"
env_key = "FAKE_OPENAI_KEY"
request_max_retries = 1
stream_max_retries = 1
stream_idle_timeout_ms = 20000

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false
""")
    # codex refuses to put its sandbox helper under the temporary folder, and a test's HOME is
    # there: TMPDIR elsewhere (inside HOME) lets it.
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {"CODEX_HOME": str(home / ".codex"), "FAKE_OPENAI_KEY": "fake-key", "TMPDIR": str(home / "tmp")}


GEMINI_IGNORE = ".bmad-loop-session/gemini-ignore"


def _shipped_gemini_defaults() -> Path:
    from bmad_loop.agents import profiles

    return Path(profiles.__file__).parent / "gemini-system-defaults.json"


def gemini_trusts(path: Path) -> bool:
    """gemini's rule for a system settings file: it and every folder above it owned by root
    and not writable by group or others."""
    for each in [path, *path.parents]:
        info = each.stat()
        if info.st_uid != 0 or info.st_mode & 0o022:
            return False
    return True


def _gemini(home: Path, ports: Ports) -> dict:
    settings = {
        # Without a selected auth type, headless gemini exits 41 "Invalid auth method selected."
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True, "maxAttempts": 2},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "model": {"name": "gemini-2.5-flash"},
    }
    if not gemini_trusts(_shipped_gemini_defaults()):
        # gemini skips a system-defaults file it does not trust (docs/agents.md): where this
        # checkout lies, the user-level setting the docs give does the same job.
        settings["context"] = {"fileFiltering": {"customIgnoreFilePaths": [GEMINI_IGNORE]}}
    _write(home / ".gemini" / "settings.json", json.dumps(settings, indent=1))
    return {"GEMINI_API_KEY": "fake-key", "GOOGLE_GEMINI_BASE_URL": ports.base}


def _opencode(home: Path, ports: Ports) -> dict:
    config = {
        "autoupdate": False, "share": "disabled", "model": f"fake/{MODEL}",
        "provider": {"fake": {"npm": "@ai-sdk/openai-compatible", "name": "fake",
                              "options": {"baseURL": f"{ports.base}/v1", "apiKey": "fake-key"},
                              "models": {MODEL: {"name": MODEL}}}},
    }
    folder = home / ".config" / "opencode"
    _write(folder / "opencode.json", json.dumps(config, indent=1))
    # opencode installs its plugin package into its config folder at every start, from npm: the
    # copy installed with the CLIs (.ci/run) is linked in, so it finds it there.
    seed = ports.seed / "opencode-config"
    if seed.is_dir():
        for name in ("package.json", "package-lock.json"):  # what it compares before installing
            shutil.copy(seed / name, folder / name)
        (folder / "node_modules").symlink_to(seed / "node_modules", target_is_directory=True)
    return {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1"}


def _qwen(home: Path, ports: Ports) -> dict:
    settings = {
        "security": {"auth": {"selectedType": "openai"}},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        # Rate-limit retries: one, 100 ms apart (the default is 10, a minute apart).
        "model": {"name": MODEL, "generationConfig": {"maxRetries": 1, "retryInitialDelayMs": 100,
                                                      "retryMaxDelayMs": 500}},
    }
    _write(home / ".qwen" / "settings.json", json.dumps(settings, indent=1))
    return {"OPENAI_API_KEY": "fake-key", "OPENAI_BASE_URL": f"{ports.base}/v1", "OPENAI_MODEL": MODEL}


_SETUP = {"claude": _claude, "codex": _codex, "gemini": _gemini, "opencode": _opencode, "qwen": _qwen}


def prepare(cli: str, home: Path, ports: Ports) -> dict:
    """Write `cli`'s settings into the private `home`; the environment variables it needs."""
    home.mkdir(parents=True, exist_ok=True)
    return {**_common(home, ports), **_SETUP[cli](home, ports)}
