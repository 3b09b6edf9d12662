"""Small grid environments with both faces of an MDP: ``reset``/``step`` to learn from, ``(P, R)`` to solve.

A learner (Q-learning, SARSA, REINFORCE) only sees samples from ``step``; the
dynamic-programming solvers of :mod:`utils.rl.mdp` need the arrays. Both are
derived from one deterministic move rule ``move(s, a) -> (s', r)``:

- ``step`` samples: with probability ``slip`` the action is replaced by one
  drawn uniformly from the four, then ``move`` is applied;
- ``P[s, a] = (1 - slip) onehot(move(s, a)) + slip / 4 sum_b onehot(move(s, b))``
  and ``R[s, a]`` is the matching expected reward.

Terminal states are absorbing with reward 0, so the episodic return equals the
value of the MDP with the terminal state made absorbing (Sutton & Barto 2018,
section 3.4, "unified notation for episodic and continuing tasks").

:class:`CliffWalking` is Sutton & Barto's Example 6.6: a 4 x 12 grid, start
bottom-left, goal bottom-right, the cells between them a cliff; every move
costs -1, stepping into the cliff costs -100 and sends the agent back to the
start. The optimal path runs along the cliff's edge in 13 moves (return -13).
"""

from __future__ import annotations

import numpy as np

from utils.published import Published
from utils.validate import check_positive_int

ACTIONS = ("up", "right", "down", "left")
"""Action indices 0..3; the moves below are (row, column) offsets."""
MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))

CLIFF_OPTIMAL_RETURN = Published(
    -13.0, "reward (undiscounted return of one episode)",
    "Sutton & Barto, Reinforcement Learning: An Introduction, 2nd ed. (2018), Example 6.6: the optimal path "
    "along the cliff edge, 13 moves at -1 each")
"""The cliff's optimal return, as the book states it (the example draws the path)."""


class RandomActionGridWorld:
    """A ``rows x cols`` grid: each move costs ``step_reward``; entering ``goal`` ends the episode.

    Moves into a wall (the grid's edge or a cell of ``walls``) leave the agent
    in place. States are ``row * cols + col``. ``slip`` is the probability
    that the action is replaced by a uniformly random one of the four (which
    may be the intended one). Not :class:`utils.rl.gridworld.GridWorld`, whose
    ``slip`` slides the agent to a perpendicular direction instead.
    """

    def __init__(self, rows: int = 4, cols: int = 4, start: tuple[int, int] = (0, 0),
                 goal: tuple[int, int] | None = None, walls: tuple[tuple[int, int], ...] = (),
                 step_reward: float = -1.0, slip: float = 0.0, seed: int = 0) -> None:
        self.rows, self.cols = check_positive_int("rows", rows), check_positive_int("cols", cols)
        if self.rows * self.cols < 2:
            raise ValueError(f"the grid needs at least 2 cells, got {rows} x {cols}")
        goal = (rows - 1, cols - 1) if goal is None else goal
        for name, cell in (("start", start), ("goal", goal), *(("walls", w) for w in walls)):
            if not (len(cell) == 2 and 0 <= cell[0] < rows and 0 <= cell[1] < cols):
                raise ValueError(f"{name} must be (row, col) cells inside the {rows} x {cols} grid, got {cell!r}")
        if start == goal or start in walls or goal in walls:
            raise ValueError("start, goal and walls must be different cells")
        if not 0 <= slip <= 1:
            raise ValueError(f"slip must be a probability in [0, 1], got {slip!r}")
        self.start, self.goal, self.walls = self.index(start), self.index(goal), {self.index(w) for w in walls}
        self.step_reward, self.slip = float(step_reward), float(slip)
        self.terminal = {self.goal}
        self.rng = np.random.default_rng(seed)
        self.state = self.start

    @property
    def n_states(self) -> int:
        return self.rows * self.cols

    n_actions = len(ACTIONS)

    def index(self, cell: tuple[int, int]) -> int:
        return cell[0] * self.cols + cell[1]

    def cell(self, state: int) -> tuple[int, int]:
        return divmod(int(state), self.cols)

    def _neighbour(self, state: int, action: int) -> int:
        row, col = divmod(int(state), self.cols)  # self.cell, self.index inlined: learners call this every step
        dr, dc = MOVES[action]
        r, c = row + dr, col + dc
        if not (0 <= r < self.rows and 0 <= c < self.cols) or r * self.cols + c in self.walls:
            return state
        return r * self.cols + c

    def move(self, state: int, action: int) -> tuple[int, float]:
        """The deterministic outcome ``(next_state, reward)`` of ``action`` in a non-terminal ``state``."""
        return self._neighbour(state, action), self.step_reward

    def reset(self) -> int:
        self.state = self.start
        return self.state

    def step(self, action: int) -> tuple[int, float, bool]:
        """``(next_state, reward, done)`` of one move from the current state (sampled if ``slip > 0``)."""
        if action not in range(self.n_actions):
            raise ValueError(f"action must be one of 0..3 {ACTIONS}, got {action!r}")
        if self.state in self.terminal:
            raise ValueError("the episode has ended; call reset()")
        if self.slip and self.rng.random() < self.slip:
            action = int(self.rng.integers(self.n_actions))
        self.state, reward = self.move(self.state, action)
        return self.state, reward, self.state in self.terminal

    def transition_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(P, R)`` of shapes ``(S, A, S)`` and ``(S, A)``; terminal and wall states are absorbing, reward 0."""
        S, A = self.n_states, self.n_actions
        P, R = np.zeros((S, A, S)), np.zeros((S, A))
        for s in range(S):
            if s in self.terminal or s in self.walls:
                P[s, :, s] = 1.0
                continue
            outcomes = [self.move(s, a) for a in range(A)]
            for a in range(A):
                for b, (s_next, r) in enumerate(outcomes):
                    p = (1 - self.slip) * (a == b) + self.slip / A
                    P[s, a, s_next] += p
                    R[s, a] += p * r
        return P, R


class CliffWalking(RandomActionGridWorld):
    """Sutton & Barto (2018), Example 6.6: 4 x 12, -1 per move, -100 and back to the start for the cliff."""

    CLIFF_REWARD = -100.0

    def __init__(self, rows: int = 4, cols: int = 12, slip: float = 0.0, seed: int = 0) -> None:
        if rows < 2 or cols < 3:
            raise ValueError(f"a cliff needs at least 2 rows and 3 columns, got {rows} x {cols}")
        super().__init__(rows, cols, start=(rows - 1, 0), goal=(rows - 1, cols - 1), slip=slip, seed=seed)
        self.cliff = {self.index((rows - 1, c)) for c in range(1, cols - 1)}

    def move(self, state: int, action: int) -> tuple[int, float]:
        s_next = self._neighbour(state, action)
        if s_next in self.cliff:
            return self.start, self.CLIFF_REWARD
        return s_next, self.step_reward

    def transition_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        P, R = super().transition_arrays()
        for s in self.cliff:  # never occupied: the agent is sent back to the start
            P[s], R[s] = 0.0, 0.0
            P[s, :, s] = 1.0
        return P, R


def render_path(env: RandomActionGridWorld, states: list[int]) -> str:
    """The grid as text: ``S`` start, ``G`` goal, ``C`` cliff, ``#`` wall, ``o`` a visited cell, ``.`` the rest."""
    visited = set(states)
    rows = []
    for r in range(env.rows):
        line = ""
        for c in range(env.cols):
            s = env.index((r, c))
            line += ("S" if s == env.start else "G" if s == env.goal else "C" if s in getattr(env, "cliff", ())
                     else "#" if s in env.walls else "o" if s in visited else ".")
        rows.append(line)
    return "\n".join(rows)
