"""Markov chains and Markov reward processes from data: estimating ``P``, sampling returns, iterating Bellman.

Notation of Sutton & Barto, *Reinforcement Learning: An Introduction* (2nd ed.,
2018), chapter 3, and of David Silver's UCL course, lecture 2 ("Markov Decision
Processes"): an MRP ``<S, P, R, gamma>`` with ``P[s, s']`` the probability of
moving from ``s`` to ``s'`` and ``R[s]`` the reward received on leaving ``s``,
so the return from time ``t`` is ``G_t = sum_k gamma^k R[S_{t+k}]`` and the value
``V(s) = E[G_t | S_t = s]`` solves ``V = R + gamma P V``
(:func:`utils.rl.mdp.mrp_value` solves it in closed form).

- :func:`transition_counts`, :func:`estimate_transition_matrix`: the maximum-
  likelihood estimate of ``P`` from one observed path, ``P_hat[s, s'] =
  N(s -> s') / N(s -> .)``;
- :func:`sample_path`, :func:`sample_returns`: Monte Carlo, whose mean return
  converges to ``V`` (law of large numbers);
- :func:`evaluation_history`: the iterates ``V_{k+1} = R + gamma P V_k``, a
  contraction with modulus ``gamma`` in the max norm, so
  ``|V_k - V|_inf <= gamma^k |V_0 - V|_inf``;
- :func:`episodic_value`: the undiscounted (``gamma = 1``) value of a chain that
  ends in absorbing terminal states, solved on the non-terminal states.

Every function accepts NumPy arrays or torch tensors; bad input raises ``ValueError``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from utils.rl.mdp import ROW_SUM_TOLERANCE, as_array, check_gamma
from utils.validate import check_nonnegative_int, check_positive_int


def check_mrp(P: Any, R: Any) -> tuple[np.ndarray, np.ndarray]:
    """``P`` ``(S, S)`` row-stochastic and ``R`` ``(S,)`` as float64 arrays, else ``ValueError``."""
    P, R = as_array(P, "P"), as_array(R, "R")
    if P.ndim != 2 or P.shape[0] != P.shape[1] or R.shape != P.shape[:1]:
        raise ValueError(f"P must have shape (S, S) and R shape (S,); got P {P.shape} and R {R.shape}")
    if np.any(P < 0) or not np.allclose(P.sum(-1), 1.0, atol=ROW_SUM_TOLERANCE):
        raise ValueError("every row of P must be non-negative and sum to 1")
    return P, R


def _check_states(states: Any, n_states: int) -> np.ndarray:
    n_states = check_positive_int("n_states", n_states)
    if hasattr(states, "detach"):
        states = states.detach().cpu().numpy()
    path = np.asarray(states)
    if path.ndim != 1 or path.size == 0 or not np.issubdtype(path.dtype, np.integer):
        raise ValueError(f"states must be a non-empty 1-D sequence of ints, got shape {path.shape}, "
                         f"dtype {path.dtype}")
    if path.min() < 0 or path.max() >= n_states:
        raise ValueError(f"states must lie in [0, {n_states}), got values from {path.min()} to {path.max()}")
    return path


def transition_counts(states: Sequence[int], n_states: int) -> np.ndarray:
    """``N[s, s']``: how many times the path ``states`` steps from ``s`` to ``s'``, shape ``(S, S)``."""
    path = _check_states(states, n_states)
    counts = np.zeros((n_states, n_states))
    np.add.at(counts, (path[:-1], path[1:]), 1.0)
    return counts


def estimate_transition_matrix(states: Sequence[int] | Sequence[Sequence[int]], n_states: int) -> np.ndarray:
    """The maximum-likelihood ``P_hat[s, s'] = N(s -> s') / sum_s'' N(s -> s'')`` from observed paths.

    ``states`` is one path, or a list of paths (separate episodes): their
    counts add, and no transition is counted across the end of one path and
    the start of the next.

    Maximising the log-likelihood ``sum N(s -> s') log P[s, s']`` under the
    constraint that each row sums to 1 (a Lagrange multiplier per row) gives
    exactly the normalised counts. A state the path never leaves has no data: its
    row is left uniform, ``1 / S``, so ``P_hat`` is always row-stochastic.
    """
    if len(states) and isinstance(states[0], (Sequence, np.ndarray)) and not isinstance(states[0], str):
        counts = sum(transition_counts(path, n_states) for path in states)
    else:
        counts = transition_counts(states, n_states)
    totals = counts.sum(-1, keepdims=True)
    return np.where(totals > 0, counts / np.maximum(totals, 1.0), 1.0 / n_states)


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def sample_path(P: Any, start: int, n_steps: int, seed: int | np.random.Generator = 0) -> np.ndarray:
    """A path ``S_0 = start, S_1, ..., S_n`` of ``n_steps`` transitions drawn from ``P``, shape ``(n_steps + 1,)``."""
    P = as_array(P, "P")
    P, _ = check_mrp(P, np.zeros(len(P)))
    n_steps = check_nonnegative_int("n_steps", n_steps)
    if not isinstance(start, (int, np.integer)) or not 0 <= start < len(P):
        raise ValueError(f"start must be a state index in [0, {len(P)}), got {start!r}")
    rng = _rng(seed)
    cumulative = np.cumsum(P, axis=-1)
    path = np.empty(n_steps + 1, dtype=np.int64)
    path[0] = start
    uniforms = rng.random(n_steps)
    for t in range(n_steps):
        row = cumulative[path[t]]
        path[t + 1] = min(int(np.searchsorted(row, uniforms[t] * row[-1], side="right")), len(P) - 1)
    return path


def sample_returns(P: Any, R: Any, gamma: float, start: int, n_episodes: int, horizon: int,
                   seed: int | np.random.Generator = 0, terminal: Sequence[int] = ()) -> np.ndarray:
    """``n_episodes`` sampled returns ``G_0 = sum_{k < horizon} gamma^k R[S_k]`` from ``S_0 = start``.

    An episode stops early on reaching a state in ``terminal`` (whose reward is
    still counted, once). All episodes advance together, one vectorised step at a
    time. Cutting an infinite return at ``horizon`` steps changes its mean by at
    most ``gamma^horizon max|R| / (1 - gamma)``; pick ``horizon`` so that is
    negligible. With ``gamma = 1`` every episode must be able to reach ``terminal``.
    """
    P, R = check_mrp(P, R)
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
    n_episodes, horizon = check_positive_int("n_episodes", n_episodes), check_positive_int("horizon", horizon)
    if not isinstance(start, (int, np.integer)) or not 0 <= start < len(P):
        raise ValueError(f"start must be a state index in [0, {len(P)}), got {start!r}")
    is_terminal = np.zeros(len(P), dtype=bool)
    for s in terminal:
        if not isinstance(s, (int, np.integer)) or not 0 <= s < len(P):
            raise ValueError(f"terminal states must be indices in [0, {len(P)}), got {s!r}")
        is_terminal[s] = True
    rng = _rng(seed)
    cumulative = np.cumsum(P, axis=-1)
    state = np.full(n_episodes, start, dtype=np.int64)
    alive = np.ones(n_episodes, dtype=bool)
    returns = np.zeros(n_episodes)
    discount = 1.0
    for _ in range(horizon):
        returns += np.where(alive, discount * R[state], 0.0)
        alive &= ~is_terminal[state]
        if not alive.any():
            break
        rows = cumulative[state]
        u = rng.random(n_episodes)[:, None] * rows[:, -1:]
        state = np.minimum((u >= rows).sum(-1), len(P) - 1)
        discount *= gamma
    return returns


def evaluation_history(P: Any, R: Any, gamma: float, n_sweeps: int, V0: Any = None) -> np.ndarray:
    """The iterates ``V_0, V_1, ..., V_n`` of ``V_{k+1} = R + gamma P V_k``, shape ``(n_sweeps + 1, S)``.

    The Bellman operator ``T V = R + gamma P V`` is a ``gamma``-contraction in the
    max norm (``|T U - T V|_inf <= gamma |U - V|_inf``, because each row of ``P``
    is a probability distribution), so ``|V_k - V|_inf <= gamma^k |V_0 - V|_inf``
    (Banach's fixed-point theorem; Sutton & Barto 2018, section 4.1). ``V0``
    defaults to zeros.
    """
    P, R = check_mrp(P, R)
    gamma = check_gamma(gamma)
    n_sweeps = check_nonnegative_int("n_sweeps", n_sweeps)
    V = np.zeros(len(R)) if V0 is None else as_array(V0, "V0")
    if V.shape != R.shape:
        raise ValueError(f"V0 must have shape {R.shape}, got {V.shape}")
    history = [V]
    for _ in range(n_sweeps):
        V = R + gamma * P @ V
        history.append(V)
    return np.stack(history)


def episodic_value(P: Any, R: Any, terminal: Sequence[int], gamma: float = 1.0) -> np.ndarray:
    """The value of an MRP that ends in absorbing ``terminal`` states, for ``0 <= gamma <= 1``.

    Terminal states have value 0 (and must be absorbing with reward 0); on the
    others, ``V_N = R_N + gamma P_NN V_N`` gives ``V_N = (I - gamma P_NN)^-1 R_N``.
    With ``gamma = 1`` the matrix is invertible exactly when every state reaches a
    terminal state with probability 1; otherwise ``ValueError``.
    """
    P, R = check_mrp(P, R)
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
    term = sorted({int(s) for s in terminal})
    if not term or term[0] < 0 or term[-1] >= len(P):
        raise ValueError(f"terminal must name at least one state index in [0, {len(P)}), got {list(terminal)!r}")
    for s in term:
        if P[s, s] != 1.0 or R[s] != 0.0:
            raise ValueError(f"terminal state {s} must be absorbing (P[s, s] = 1) with reward 0")
    rest = np.array([s for s in range(len(P)) if s not in term], dtype=np.int64)
    V = np.zeros(len(P))
    if rest.size:
        A = np.eye(rest.size) - gamma * P[np.ix_(rest, rest)]
        if np.linalg.cond(A) > 1e12:
            raise ValueError("some states never reach a terminal state, so their undiscounted return is unbounded")
        V[rest] = np.linalg.solve(A, R[rest])
    return V
