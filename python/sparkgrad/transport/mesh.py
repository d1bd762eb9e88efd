"""The MESH topology: which node relays the controller's updates to which.

:class:`MeshOrganizer` is DL4J's ``MeshOrganizer`` (MESH mode) with a bounded fan-out. The controller is
the root (:data:`ROOT`, id 0). A FIFO fill queue starts with the root ``fan_out`` times; a joining node
takes its parent from the queue and is pushed ``fan_out`` times itself, so nodes fill a complete
``fan_out``-ary tree breadth first (node ``i`` in join order, 0-based, hangs under the root when
``i < fan_out`` and under node ``(i - fan_out) // fan_out`` otherwise). Everything is deterministic:
the same joins and leaves in the same order give the same tree.

When a node leaves, its children move up: each goes to the nearest live ancestor of the node that left
that has a free slot (the leaver's parent always has the slot the leaver used), else to the shallowest
node with a free slot outside the child's own subtree (breadth first, children in join order), so no
node, the root included, ever has more than ``fan_out`` children. Queue entries of nodes that left or
are full are skipped; when the queue runs dry a joining node takes the shallowest free slot as well.

Relaying over the tree (the policy of :mod:`sparkgrad.transport.controller`, :mod:`.worker` and
:mod:`.relay` in MESH mode):

- Upward nothing changes: every worker keeps its DEALER connection to the controller for HELLO, its own
  UPDATEs, SYNC, EPOCH_END, PARAMS_REQUEST, UPDATER_STATE and BYE, so the controller applies every
  update exactly once and the SYNC and epoch semantics are those of PLAIN.
- Downward the controller numbers the updates it applies (its *broadcast number*, 1, 2, ...; stamped in
  the frame header, see :mod:`sparkgrad.transport.frame`) and sends each only to its own children:
  at most ``fan_out`` frames per update. Each worker binds a ROUTER socket, reports it in HELLO and is
  told its parent (MESH_PARENT); it connects a DEALER to the parent, registers (MESH_JOIN) and relays
  every new frame it receives from the parent to its children, re-signed with itself as the relay and
  the original sender, sequence and broadcast number kept. It applies every other worker's update once
  (its own was applied when it was sent).
- Broadcast numbers arrive in order along any path. A frame whose number a node has already relayed
  is a duplicate (after a re-parenting) and is dropped; a number past the next one is a gap: the node
  asks the controller for the current parameters (PARAMS_REQUEST, answered with PARAMS stamped with
  the number of updates they include) and replaces its own, so it never diverges silently. A node that
  is re-parented does the same at once (it may have missed updates in between). SYNC_ACK and EPOCH_GO
  carry the controller's broadcast number too: the worker waits until it has applied that many before
  it goes on, and if its parent delivers nothing for ``mesh_catchup_ms`` it names the parent as silent
  in a PARAMS_REQUEST (the controller drops it from the tree like a slow peer and re-parents its
  children) and takes the parameters instead.
- Slow peers: the controller drops a child of the root whose queue is full (it re-joins, as in PLAIN);
  a relay node does the same to a child of its own and tells it to re-join.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from sparkgrad._config import check_int

ROOT = 0


class MeshOrganizer:
    """The relay tree of one fit, rooted at the controller.

    Args:
        fan_out: the most children any node (the root included) has, at least 1.
    """

    def __init__(self, fan_out: int = 8) -> None:
        self.fan_out = check_int("fan_out", fan_out, minimum=1)
        self._parent: dict[int, int] = {}
        self._children: dict[int, list[int]] = {ROOT: []}
        self._fill: deque[int] = deque([ROOT] * self.fan_out)
        self.version = 0

    def __contains__(self, node: int) -> bool:
        return node in self._parent

    def __len__(self) -> int:
        return len(self._parent)

    def parent(self, node: int) -> int:
        """The parent of a node in the tree (:data:`ROOT` for the controller's children)."""
        return self._parent[node]

    def children(self, node: int = ROOT) -> list[int]:
        """The children of a node (or of the root), in the order they were attached."""
        return list(self._children[node])

    def depth(self, node: int) -> int:
        """Hops from the root to ``node`` (1 for the root's children)."""
        hops = 0
        while node != ROOT:
            node, hops = self._parent[node], hops + 1
        return hops

    def max_depth(self) -> int:
        """The depth of the deepest node (0 for an empty tree)."""
        return max((self.depth(n) for n in self._parent), default=0)

    def add(self, node: int) -> int:
        """Attach a new node and return its parent.

        Args:
            node: the node's id (nonzero, not in the tree).

        Returns:
            The parent's id (:data:`ROOT` for the controller).
        """
        if node == ROOT or node in self._parent:
            raise ValueError(f"node: {node} is the root or already in the mesh")
        while self._fill and not self._has_room(self._fill[0]):
            self._fill.popleft()
        parent = self._fill.popleft() if self._fill else self._shallowest_free(node)
        self._attach(node, parent)
        self._fill.extend([node] * self.fan_out)
        return parent

    def remove(self, node: int) -> dict[int, int]:
        """Detach a node that left or was dropped and move its children up (module docstring).

        Args:
            node: the node's id (in the tree).

        Returns:
            {child: new parent} for every child of ``node``, in attachment order.
        """
        parent = self._parent.pop(node)
        self._children[parent].remove(node)
        orphans = self._children.pop(node)
        moved: dict[int, int] = {}
        for child in orphans:
            new = self._free_ancestor(parent)
            if new is None:
                new = self._shallowest_free(child)
            self._attach(child, new)
            moved[child] = new
        self.version += 1
        return moved

    def _attach(self, node: int, parent: int) -> None:
        self._parent[node] = parent
        self._children[parent].append(node)
        self._children.setdefault(node, [])
        self.version += 1

    def _has_room(self, node: int) -> bool:
        return node in self._children and len(self._children[node]) < self.fan_out

    def _free_ancestor(self, node: int) -> int | None:
        while True:
            if self._has_room(node):
                return node
            if node == ROOT:
                return None
            node = self._parent[node]

    def _subtree(self, node: int) -> Iterator[int]:
        stack = [node]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(self._children.get(current, ()))

    def _shallowest_free(self, node: int) -> int:
        """The first node with a free slot in breadth-first order, outside ``node``'s own subtree."""
        excluded = set(self._subtree(node)) if node in self._children else set()
        queue = deque([ROOT])
        while queue:
            current = queue.popleft()
            if current in excluded:
                continue
            if self._has_room(current):
                return current
            queue.extend(self._children[current])
        raise RuntimeError("mesh: no node has a free slot")  # unreachable: every subtree has a leaf


__all__ = ["ROOT", "MeshOrganizer"]
