"""Write ``operator/verl_operator/data/verl-config-keys.json``: the keys of each release's ``ppo_trainer`` config.

The planner rejects an override whose key the target release's config does not have (Hydra's struct mode
refuses it before verl starts: ``Could not override 'x'. To append to your config use +x=...``). The key list
is generated from verl's own config with verl's own Hydra compose, in the fidelity environments:

    python tests/fidelity/verl_keys.py          # rewrite the file
    python tests/fidelity/verl_keys.py --check  # exit 1 when the file differs (the fidelity tier tests this)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from plan_sample import RELEASE
from verl_client import config_key_table
from verl_envs import ensure_env

TARGET = Path(__file__).parents[2] / "operator" / "verl_operator" / "data" / "verl-config-keys.json"


def generate() -> dict[str, Any]:
    """The file's content: per VerlJob version line, the release it was read from and its keys."""
    out: dict[str, Any] = {
        "about": (
            "Key paths of verl's composed ppo_trainer (and ppo_megatron_trainer: <line>/megatron) config per "
            "release line; tests/fidelity/verl_keys.py"
        ),
        "lines": {},
    }
    for line, release in sorted(RELEASE.items()):
        # ppo_trainer, and the Megatron engine's config (planner/megatron.py keys_line); ``null``: the keys
        # whose value is null, which ``+key=value`` may add to (planner/verl_keys.py).
        for suffix, name in (("", "ppo_trainer"), ("/megatron", "ppo_megatron_trainer")):
            version, keys, nulls = config_key_table(ensure_env(release), config_name=name)
            out["lines"][line + suffix] = {"release": version, "keys": keys, "null": nulls}
    return out


def render(content: dict[str, Any]) -> str:
    return json.dumps(content, indent=0, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render(generate())
    if "--check" in argv:
        return 0 if TARGET.read_text() == text else 1
    TARGET.write_text(text)
    print(f"wrote {TARGET}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
