"""Markov reward processes and Markov decision processes, solved exactly and by dynamic programming.

Notation of Sutton & Barto, *Reinforcement Learning: An Introduction* (2nd ed.,
2018), chapters 3 and 4, for finite problems held as arrays:

- an MRP ``<S, P, R, gamma>``: ``P`` of shape ``(S, S)``, ``R`` of shape ``(S,)``
  (expected reward on leaving each state); its value solves the Bellman
  equation ``V = R + gamma P V``, so ``V = (I - gamma P)^-1 R``;
- an MDP ``<S, A, P, R, gamma>``: ``P`` of shape ``(S, A, S)`` with
  ``P[s, a, s']`` the probability of moving to ``s'``, ``R`` of shape ``(S, A)``
  the expected reward, and a stochastic policy ``pi`` of shape ``(S, A)``. A
  policy induces the MRP ``P_pi[s, s'] = sum_a pi[s, a] P[s, a, s']``,
  ``R_pi[s] = sum_a pi[s, a] R[s, a]``;
- ``q_pi(s, a) = R[s, a] + gamma sum_s' P[s, a, s'] V_pi(s')``, and the Bellman
  optimality equation ``V*(s) = max_a q*(s, a)``, solved by value iteration
  (a contraction with modulus ``gamma``, so it converges from any start).

Every function accepts NumPy arrays or torch tensors and computes in float64
NumPy; rows of ``P`` and of policies must sum to 1 and ``gamma`` must lie in
``[0, 1)``, or ``ValueError`` says which.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ROW_SUM_TOLERANCE = 1e-6


def as_array(x: Any, name: str) -> np.ndarray:
    """``x`` (NumPy array, torch tensor or nested lists) as a float64 NumPy array with no NaN or inf."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    array = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got NaN or inf")
    return array


def check_gamma(gamma: float) -> float:
    """``gamma`` as a float if ``0 <= gamma < 1``, else ``ValueError``."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0 <= gamma < 1:
        raise ValueError(f"gamma must be a number in [0, 1), got {gamma!r}")
    return float(gamma)


def _check_stochastic(matrix: np.ndarray, name: str) -> None:
    if np.any(matrix < 0) or not np.allclose(matrix.sum(-1), 1.0, atol=ROW_SUM_TOLERANCE):
        raise ValueError(f"every row of {name} must be non-negative and sum to 1")


def check_mdp(P: Any, R: Any, gamma: float) -> tuple[np.ndarray, np.ndarray, float]:
    """``P`` ``(S, A, S)``, ``R`` ``(S, A)`` and ``gamma`` checked and as float64 arrays."""
    P, R = as_array(P, "P"), as_array(R, "R")
    if P.ndim != 3 or P.shape[0] != P.shape[2] or R.shape != P.shape[:2]:
        raise ValueError(f"P must have shape (S, A, S) and R shape (S, A); got P {P.shape} and R {R.shape}")
    _check_stochastic(P, "P (over next states)")
    return P, R, check_gamma(gamma)


def check_policy(policy: Any, n_states: int, n_actions: int) -> np.ndarray:
    """A stochastic policy ``(S, A)`` checked and as a float64 array."""
    pi = as_array(policy, "policy")
    if pi.shape != (n_states, n_actions):
        raise ValueError(f"policy must have shape (S, A) = ({n_states}, {n_actions}), got {pi.shape}")
    _check_stochastic(pi, "policy")
    return pi


def mrp_value(P: Any, R: Any, gamma: float) -> np.ndarray:
    """The value of an MRP in closed form: ``V = (I - gamma P)^-1 R`` (Bellman equation solved as a linear system)."""
    P, R, gamma = as_array(P, "P"), as_array(R, "R"), check_gamma(gamma)
    if P.ndim != 2 or P.shape[0] != P.shape[1] or R.shape != P.shape[:1]:
        raise ValueError(f"P must have shape (S, S) and R shape (S,); got P {P.shape} and R {R.shape}")
    _check_stochastic(P, "P")
    return np.linalg.solve(np.eye(len(R)) - gamma * P, R)


def induced_mrp(P: Any, R: Any, policy: Any) -> tuple[np.ndarray, np.ndarray]:
    """The MRP ``(P_pi, R_pi)`` a policy induces on an MDP."""
    P, R = as_array(P, "P"), as_array(R, "R")
    pi = check_policy(policy, *R.shape)
    return np.einsum("sa,sat->st", pi, P), (pi * R).sum(-1)


def policy_evaluation(P: Any, R: Any, policy: Any, gamma: float) -> np.ndarray:
    """Exact ``V_pi`` of a stochastic ``policy`` ``(S, A)``: the value of the MRP it induces."""
    P, R, gamma = check_mdp(P, R, gamma)
    P_pi, R_pi = induced_mrp(P, R, policy)
    return mrp_value(P_pi, R_pi, gamma)


def q_from_v(P: Any, R: Any, V: Any, gamma: float) -> np.ndarray:
    """``q(s, a) = R[s, a] + gamma sum_s' P[s, a, s'] V(s')``, shape ``(S, A)``."""
    P, R, gamma = check_mdp(P, R, gamma)
    return R + gamma * P @ as_array(V, "V")


def greedy_policy(q: Any) -> np.ndarray:
    """The deterministic policy ``(S, A)`` (one-hot rows) taking ``argmax_a q(s, a)``, first maximum on ties."""
    q = as_array(q, "q")
    policy = np.zeros_like(q)
    policy[np.arange(len(q)), q.argmax(-1)] = 1.0
    return policy


def value_iteration(P: Any, R: Any, gamma: float, tol: float = 1e-8, max_sweeps: int = 100_000
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(V*, policy)``: iterate ``V <- max_a (R + gamma P V)`` until a sweep changes V by less than ``tol``.

    Stopping when ``max |V_{k+1} - V_k| < tol`` leaves ``|V_{k+1} - V*| < tol gamma / (1 - gamma)``
    (the contraction bound); the policy is greedy on the final ``q``.
    """
    P, R, gamma = check_mdp(P, R, gamma)
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    V = np.zeros(P.shape[0])
    for _ in range(max_sweeps):
        V_new = (R + gamma * P @ V).max(-1)
        converged = np.max(np.abs(V_new - V)) < tol
        V = V_new
        if converged:
            break
    else:
        raise RuntimeError(f"value iteration did not converge to tol={tol} in {max_sweeps} sweeps")
    return V, greedy_policy(R + gamma * P @ V)


def policy_iteration(P: Any, R: Any, gamma: float, max_iterations: int = 10_000
                     ) -> tuple[np.ndarray, np.ndarray, int]:
    """``(V*, policy, iterations)``: exact evaluation, then greedy improvement, until the policy is stable."""
    P, R, gamma = check_mdp(P, R, gamma)
    policy = np.full(R.shape, 1.0 / R.shape[1])
    for iteration in range(1, max_iterations + 1):
        V = policy_evaluation(P, R, policy, gamma)
        new = greedy_policy(q_from_v(P, R, V, gamma))
        if np.array_equal(new, policy):
            return V, policy, iteration
        policy = new
    raise RuntimeError(f"policy iteration did not stabilise in {max_iterations} iterations")


def random_mdp(n_states: int, n_actions: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random dense MDP ``(P, R)`` for tests and labs: Dirichlet rows of P, standard normal rewards."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(n_states), size=(n_states, n_actions))
    return P, rng.standard_normal((n_states, n_actions))
