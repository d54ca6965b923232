"""The meta-action vocabulary and how an action index names a move.

| index      | move                                                                               |
|------------|------------------------------------------------------------------------------------|
| 0          | PERSIST: keep the answer                                                           |
| 1          | REFINE: revise the solution, seeing the peers' answers                             |
| 2          | CONCEDE: adopt the answer of the peer that the ``concede_target`` rule picks       |
| 3 + k      | CONCEDE to peer k (``concede_to_peer=True`` only), in the observation's peer order |

With ``concede_to_peer`` the first three indices keep their meaning, so every fixed protocol and trained
policy of the 3-action game plays unchanged; the extra indices let a policy name whom it adopts instead
of leaving it to the rule (which follows the critic's confidence).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum


class Action(IntEnum):
    """The meta-actions."""

    PERSIST = 0
    REFINE = 1
    CONCEDE = 2


FIRST_PEER_ACTION = len(Action)
"""The index of CONCEDE-to-peer-0; peer k's is ``FIRST_PEER_ACTION + k``."""


def num_actions(num_agents: int, concede_to_peer: bool) -> int:
    """How many action indices an agent has: 3, plus one CONCEDE per peer with ``concede_to_peer``."""
    return len(Action) + (num_agents - 1 if concede_to_peer else 0)


def decode(index: int, peers: Sequence[int]) -> tuple[Action, int | None]:
    """The move an action index names: its meta-action and, for a CONCEDE to a named peer, that peer's agent
    index (``peers``: the acting agent's peers in observation order); None lets the rule pick the peer."""
    if index < FIRST_PEER_ACTION:
        return Action(index), None
    return Action.CONCEDE, peers[index - FIRST_PEER_ACTION]


def action_name(index: int) -> str:
    """``PERSIST``, ``REFINE``, ``CONCEDE`` or ``CONCEDE_PEER_k``."""
    if index < FIRST_PEER_ACTION:
        return Action(index).name
    return f"CONCEDE_PEER_{index - FIRST_PEER_ACTION}"
