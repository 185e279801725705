"""Port blocks: `[resources] ports = "LOW-HIGH"` split evenly into one block per worker slot
plus one for the lane's candidate verification, so parallel dev servers never collide.

Block i covers LOW + i*size … LOW + (i+1)*size - 1 with size = (HIGH - LOW + 1) // (N + 1);
the lane always has block N. A range too small to give every block a port is bad input.
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["block_size", "worker_block", "lane_block", "lane_slot_block", "port_env",
           "check_port_range"]


def _range(policy):
    return policy.resources.port_range if policy.resources.ports else None


def block_size(policy) -> int:
    bounds = _range(policy)
    if bounds is None:
        return 0
    low, high = bounds
    return (high - low + 1) // (policy.scm.max_parallel + 1)


def check_port_range(policy) -> None:
    if _range(policy) is not None and block_size(policy) < 1:
        raise ConfigError(
            f"{policy.source}: [resources] ports = \"{policy.resources.ports}\" is too small for "
            f"{policy.scm.max_parallel} worker(s) and the lane: each block would be empty")
    # The lane's block is shared out among the candidates it verifies at once (speculation.py).
    depth = policy.verify.depth(policy.scm.max_parallel)
    if _range(policy) is not None and block_size(policy) < depth:
        raise ConfigError(
            f"{policy.source}: [resources] ports = \"{policy.resources.ports}\" is too small for "
            f"{depth} candidates verified at once ([verify] parallel): the lane's block of "
            f"{block_size(policy)} port(s) cannot give each one")


def worker_block(policy, index: int | None) -> dict | None:
    if index is None or _range(policy) is None:
        return None
    size = block_size(policy)
    return {"base": _range(policy)[0] + index * size, "count": size, "index": index}


def lane_block(policy) -> dict | None:
    return worker_block(policy, policy.scm.max_parallel)


def lane_slot_block(policy, slot: int, depth: int) -> dict | None:
    """The lane's port block shared out among the `depth` verifications it runs at once
    (speculative candidates, a target check): slot `slot`'s share."""
    block = lane_block(policy)
    if not block:
        return None
    size = max(1, block["count"] // depth)
    slot %= depth  # a given-up verification may still be ending while its successor starts
    return {"base": block["base"] + slot * size, "count": size, "index": block["index"]}


def port_env(block: dict | None) -> dict:
    if not block:
        return {}
    return {"BMAD_LOOP_PORT_BASE": str(block["base"]), "BMAD_LOOP_PORT_COUNT": str(block["count"])}
