"""Warnings `validate` gives about a policy that works but will disappoint in the morning.

Each function takes the loaded policy and returns `validate` check rows (`name`, `status`,
`detail`); an empty list means nothing to say. They never fail a validation: the policy is
valid, it only does less than a person probably expects.
"""

from __future__ import annotations

__all__ = ["verify_advice"]


def verify_advice(policy) -> list[dict]:
    """With no `[verify] commands`, nothing checks a story's work or the combined candidate:
    every story an agent finishes is integrated as it stands."""
    if policy.verify.commands:
        return []
    return [{"name": "verify", "status": "warn",
             "detail": f"{policy.source}: [verify] commands is empty: stories and candidates are "
                       "integrated without any check (add your test command)"}]
