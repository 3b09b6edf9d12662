"""GridWorlds as MDP arrays, and dynamic programming that keeps its history, for chapter ``04-dynamic-programming``.

A :class:`GridWorld` is a rectangle of cells; walls are not states, terminal
cells are absorbing. :func:`gridworld_mdp` turns it into the ``(P, R)`` arrays of
:mod:`utils.rl.mdp` (``P`` ``(S, A, S)``, ``R`` ``(S, A)``):

- actions 0..3 are up, right, down, left; a move off the grid or into a wall
  leaves the agent where it is (Sutton & Barto 2018, Example 4.1);
- with probability ``1 - slip`` the agent moves as intended and with
  ``slip / 2`` to each side (perpendicular), the "noisy" gridworld of Russell &
  Norvig, *AIMA*, section 17.1 (there ``slip = 0.2``); the learners' grid,
  :class:`utils.rl.environments.RandomActionGridWorld`, slips differently
  (its ``slip`` replaces the action by a uniformly random one);
- ``R[s, a] = step_reward + sum_s' P[s, a, s'] bonus(s')``: every move from a
  non-terminal state costs ``step_reward`` and entering a cell pays its bonus;
- a terminal state moves to itself with reward 0 whatever the action, so its
  value is 0 and an undiscounted (``gamma = 1``) episodic task has finite values.

:func:`iterative_policy_evaluation` and :func:`value_iteration_history` sweep
``V <- backup(V)`` (Sutton & Barto, section 4.1 and 4.4) and accept ``gamma = 1``,
which the closed-form solvers of :mod:`utils.rl.mdp` refuse: there
``(I - P_pi)`` is singular because of the absorbing states. With ``gamma = 1``
they converge only if every episode ends (a *proper* policy); otherwise they
raise after ``max_sweeps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from utils.rl.mdp import as_array, check_mdp, check_policy, greedy_policy
from utils.validate import check_positive, check_positive_int

ACTIONS = ((-1, 0), (0, 1), (1, 0), (0, -1))
"""(row, column) moves of actions 0..3: up, right, down, left."""
ACTION_NAMES = ("up", "right", "down", "left")

EXAMPLE_4_1_SOURCE = ("Sutton & Barto 2018, Reinforcement Learning: An Introduction, 2nd ed., "
                      "Example 4.1 and Figure 4.1 (k = infinity)")
EXAMPLE_4_1_VALUES = np.array([[0, -14, -20, -22], [-14, -18, -20, -20], [-20, -20, -18, -14], [-22, -20, -14, 0]],
                              dtype=float)
"""v_pi of the equiprobable random policy on Example 4.1's 4x4 grid (gamma = 1), as printed in
:data:`EXAMPLE_4_1_SOURCE`: minus the expected number of steps to a terminal corner."""


@dataclass(frozen=True)
class GridWorld:
    """A ``rows x cols`` grid; cells are ``(row, col)`` with row 0 at the top.

    ``terminals``: absorbing cells; ``walls``: cells that are not states;
    ``bonus``: reward for *entering* a cell (``{(r, c): reward}``);
    ``step_reward``: reward of every move from a non-terminal state;
    ``slip``: probability of sliding to one of the two perpendicular directions.
    """

    rows: int
    cols: int
    terminals: tuple[tuple[int, int], ...] = ()
    walls: tuple[tuple[int, int], ...] = ()
    bonus: dict[tuple[int, int], float] = field(default_factory=dict)
    step_reward: float = -1.0
    slip: float = 0.0

    def __post_init__(self) -> None:
        check_positive_int("rows", self.rows)
        check_positive_int("cols", self.cols)
        cells = list(self.terminals) + list(self.walls) + list(self.bonus)
        for cell in cells:
            if (not isinstance(cell, tuple) or len(cell) != 2
                    or not (0 <= cell[0] < self.rows and 0 <= cell[1] < self.cols)):
                raise ValueError(f"cells must be (row, col) inside the {self.rows}x{self.cols} grid, got {cell!r}")
        if set(self.walls) & (set(self.terminals) | set(self.bonus)):
            raise ValueError("a wall cannot also be a terminal or carry a bonus")
        if len(set(self.walls)) == self.rows * self.cols:
            raise ValueError("every cell is a wall: the grid has no states")
        if not (isinstance(self.slip, (int, float)) and 0 <= self.slip <= 1):
            raise ValueError(f"slip must be a probability in [0, 1], got {self.slip!r}")
        if not np.isfinite(self.step_reward) or not all(np.isfinite(v) for v in self.bonus.values()):
            raise ValueError("step_reward and the bonuses must be finite numbers")

    @property
    def states(self) -> list[tuple[int, int]]:
        """The non-wall cells in row-major order; state ``i`` is ``states[i]``."""
        walls = set(self.walls)
        return [(r, c) for r in range(self.rows) for c in range(self.cols) if (r, c) not in walls]

    def index(self) -> dict[tuple[int, int], int]:
        """``{cell: state index}``."""
        return {cell: i for i, cell in enumerate(self.states)}

    def to_grid(self, values: Any) -> np.ndarray:
        """Per-state ``values`` (length S) as a ``(rows, cols)`` array, NaN on walls."""
        values = as_array(values, "values")
        if values.shape != (len(self.states),):
            raise ValueError(f"values must have shape ({len(self.states)},), got {values.shape}")
        grid = np.full((self.rows, self.cols), np.nan)
        for (r, c), v in zip(self.states, values):
            grid[r, c] = v
        return grid


def example_4_1() -> GridWorld:
    """Sutton & Barto's Example 4.1: 4x4, terminal corners (0, 0) and (3, 3), reward -1 per move, no slip."""
    return GridWorld(4, 4, terminals=((0, 0), (3, 3)), step_reward=-1.0)


def _move(world: GridWorld, cell: tuple[int, int], action: int, walls: set) -> tuple[int, int]:
    r, c = cell[0] + ACTIONS[action][0], cell[1] + ACTIONS[action][1]
    if not (0 <= r < world.rows and 0 <= c < world.cols) or (r, c) in walls:
        return cell
    return r, c


def gridworld_mdp(world: GridWorld) -> tuple[np.ndarray, np.ndarray]:
    """``(P, R)`` of ``world``: ``P`` ``(S, 4, S)`` with rows summing to 1, ``R`` ``(S, 4)`` (module docstring)."""
    if not isinstance(world, GridWorld):
        raise ValueError(f"world must be a GridWorld, got {type(world).__name__}")
    states, index, walls = world.states, world.index(), set(world.walls)
    terminals = set(world.terminals)
    S = len(states)
    P, R = np.zeros((S, 4, S)), np.zeros((S, 4))
    for s, cell in enumerate(states):
        for a in range(4):
            if cell in terminals:
                P[s, a, s] = 1.0  # absorbing, reward 0
                continue
            outcomes = [(a, 1.0 - world.slip), ((a + 1) % 4, world.slip / 2), ((a + 3) % 4, world.slip / 2)]
            for direction, p in outcomes:
                nxt = _move(world, cell, direction, walls)
                P[s, a, index[nxt]] += p
                R[s, a] += p * world.bonus.get(nxt, 0.0)
            R[s, a] += world.step_reward
    return P, R


def check_discount(gamma: float) -> float:
    """``gamma`` as a float if ``0 <= gamma <= 1`` (1 allowed: episodic tasks), else ``ValueError``."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
    return float(gamma)


def _check(P: Any, R: Any, gamma: float, tol: float, max_sweeps: int) -> tuple[np.ndarray, np.ndarray, float]:
    P, R, _ = check_mdp(P, R, 0.0)
    check_positive("tol", tol)
    check_positive_int("max_sweeps", max_sweeps)
    return P, R, check_discount(gamma)


def iterative_policy_evaluation(P: Any, R: Any, policy: Any, gamma: float, tol: float = 1e-10,
                                in_place: bool = False, max_sweeps: int = 100_000
                                ) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(V_pi, history)``: sweep the Bellman expectation backup from ``V = 0`` until a sweep moves V by < ``tol``.

    ``V(s) <- sum_a pi(a|s) [R(s, a) + gamma sum_s' P(s'|s, a) V(s')]`` (Sutton & Barto
    2018, eq. 4.5). Two arrays (``in_place=False``): each sweep reads only the previous
    sweep's values, the iteration ``v_{k+1} = R_pi + gamma P_pi v_k``. In place: states are
    updated in index order and later states see their predecessors' new values (Gauss-Seidel;
    S&B section 4.1 says it usually converges faster). ``history[k]`` is V after ``k`` sweeps
    (``history[0]`` = 0). Accepts ``gamma = 1`` for episodic tasks (module docstring).
    """
    P, R, gamma = _check(P, R, gamma, tol, max_sweeps)
    pi = check_policy(policy, *R.shape)
    P_pi, R_pi = np.einsum("sa,sat->st", pi, P), (pi * R).sum(-1)
    V = np.zeros(len(R))
    history = [V.copy()]
    for _ in range(max_sweeps):
        if in_place:
            new = V.copy()
            for s in range(len(R)):
                new[s] = R_pi[s] + gamma * P_pi[s] @ new
        else:
            new = R_pi + gamma * P_pi @ V
        change = np.max(np.abs(new - V))
        V = new
        history.append(V.copy())
        if change < tol:
            return V, history
    raise RuntimeError(f"policy evaluation did not converge to tol={tol} in {max_sweeps} sweeps; "
                       "with gamma = 1 the policy must reach a terminal state from every state")


def value_iteration_history(P: Any, R: Any, gamma: float, tol: float = 1e-10, max_sweeps: int = 100_000
                            ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """``(V*, policy, history)``: value iteration from ``V = 0``, keeping V after every sweep.

    ``V(s) <- max_a [R(s, a) + gamma sum_s' P(s'|s, a) V(s')]`` (S&B eq. 4.10), stopped when a
    sweep moves V by less than ``tol``; ``policy`` is greedy on the final ``q`` (first maximum on
    ties). For ``gamma < 1``, ``|V_k - V*|_inf <= gamma^k |V_0 - V*|_inf`` (contraction).
    """
    P, R, gamma = _check(P, R, gamma, tol, max_sweeps)
    V = np.zeros(len(R))
    history = [V.copy()]
    for _ in range(max_sweeps):
        new = (R + gamma * P @ V).max(-1)
        change = np.max(np.abs(new - V))
        V = new
        history.append(V.copy())
        if change < tol:
            return V, greedy_policy(R + gamma * P @ V), history
    raise RuntimeError(f"value iteration did not converge to tol={tol} in {max_sweeps} sweeps")


def policy_iteration_history(P: Any, R: Any, gamma: float, tol: float = 1e-10, max_iterations: int = 1_000
                             ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]], int]:
    """``(V*, policy, history, sweeps)``: policy iteration from the uniform random policy.

    Each iteration evaluates the policy with :func:`iterative_policy_evaluation` (so ``gamma = 1``
    works on episodic tasks) and improves it greedily (S&B section 4.3), until the greedy policy
    no longer changes. ``history`` holds ``(V_pi, pi)`` per iteration; ``sweeps`` counts the
    evaluation sweeps spent in all.
    """
    P, R, gamma = _check(P, R, gamma, tol, 100_000)
    check_positive_int("max_iterations", max_iterations)
    policy = np.full(R.shape, 1.0 / R.shape[1])
    history, sweeps = [], 0
    for _ in range(max_iterations):
        V, evaluation = iterative_policy_evaluation(P, R, policy, gamma, tol)
        sweeps += len(evaluation) - 1
        history.append((V, policy))
        q = R + gamma * P @ V
        new = greedy_policy(q)
        # keep the old action where it is still (numerically) greedy, so ties cannot make PI cycle
        old_action = policy.argmax(-1)
        still_best = q[np.arange(len(q)), old_action] >= q.max(-1) - 1e-9 * (1 + np.abs(q).max())
        if policy.max() == 1.0:
            new[still_best] = policy[still_best]
        if np.array_equal(new, policy):
            return V, policy, history, sweeps
        policy = new
    raise RuntimeError(f"policy iteration did not stabilise in {max_iterations} iterations")
