"""Learning from experience with tables: Q-learning, SARSA, and REINFORCE for a softmax policy.

Sutton & Barto, *Reinforcement Learning: An Introduction* (2nd ed., 2018):

- SARSA (section 6.4), on-policy TD control:
  ``Q(s, a) += alpha [r + gamma Q(s', a') - Q(s, a)]`` with ``a'`` the action
  the epsilon-greedy policy will actually take in ``s'``;
- Q-learning (Watkins 1989; section 6.5), off-policy TD control:
  ``Q(s, a) += alpha [r + gamma max_b Q(s', b) - Q(s, a)]``;
- REINFORCE (Williams 1992; section 13.3, with baseline 13.4) for the tabular
  softmax policy ``pi(a | s) = softmax(theta[s])_a``, whose score is
  ``grad_theta[s] log pi(a | s) = onehot(a) - pi(. | s)``. One episode gives
  the gradient estimate ``sum_t gamma^t (G_t - b(s_t)) grad log pi(a_t | s_t)``
  with ``G_t`` the discounted return from ``t``; any baseline ``b(s)`` leaves it
  unbiased and a good one (``b = V_pi``) lowers its variance.

Environments are those of :mod:`utils.rl.environments` (``reset``, ``step``,
``n_states``, ``n_actions``). Every function takes a ``seed`` and is deterministic.
"""

from __future__ import annotations

import bisect

import numpy as np

from utils.validate import check_nonnegative, check_positive, check_positive_int


def _check_unit(name: str, value: float) -> float:
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return float(value)


def epsilon_greedy(q_row: np.ndarray | list[float], epsilon: float, rng: np.random.Generator) -> int:
    """A uniformly random action with probability ``epsilon``, else a greedy one (ties broken at random).

    ``q_row`` holds the action values of one state (an array row or a list).
    """
    if rng.random() < epsilon:
        return int(rng.integers(len(q_row)))
    values = q_row.tolist() if isinstance(q_row, np.ndarray) else list(q_row)  # plain floats: cheaper than numpy
    top = max(values)
    best = [a for a, value in enumerate(values) if value == top]
    return int(best[rng.integers(len(best))]) if len(best) > 1 else best[0]


def _td_control(env, episodes: int, alpha: float, epsilon: float, gamma: float, seed: int,
                max_steps: int, greedy_target: bool) -> tuple[np.ndarray, np.ndarray]:
    check_positive_int("episodes", episodes)
    check_positive("alpha", alpha)
    _check_unit("epsilon", epsilon)
    _check_unit("gamma", gamma)
    check_positive_int("max_steps", max_steps)
    rng = np.random.default_rng(seed)
    Q = [[0.0] * env.n_actions for _ in range(env.n_states)]  # lists of floats: the same doubles, cheaper per step
    returns = np.zeros(episodes)
    for episode in range(episodes):
        s = env.reset()
        a = epsilon_greedy(Q[s], epsilon, rng)
        total = 0.0
        for _ in range(max_steps):
            s_next, r, done = env.step(a)
            total += r
            a_next = epsilon_greedy(Q[s_next], epsilon, rng)
            if done:
                target = r
            elif greedy_target:  # Q-learning: the greedy action, whatever we take
                target = r + gamma * max(Q[s_next])
            else:  # SARSA: the action we will take
                target = r + gamma * Q[s_next][a_next]
            Q[s][a] += alpha * (target - Q[s][a])
            s, a = s_next, a_next
            if done:
                break
        returns[episode] = total
    return np.array(Q, dtype=float), returns


def q_learning(env, episodes: int = 500, alpha: float = 0.5, epsilon: float = 0.1, gamma: float = 1.0,
               seed: int = 0, max_steps: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """``(Q, returns)``: Q-learning from ``Q = 0``, behaving epsilon-greedily; ``returns`` per episode (undiscounted)."""
    return _td_control(env, episodes, alpha, epsilon, gamma, seed, max_steps, greedy_target=True)


def sarsa(env, episodes: int = 500, alpha: float = 0.5, epsilon: float = 0.1, gamma: float = 1.0,
          seed: int = 0, max_steps: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """``(Q, returns)``: SARSA from ``Q = 0``, on-policy with epsilon-greedy; ``returns`` per episode (undiscounted)."""
    return _td_control(env, episodes, alpha, epsilon, gamma, seed, max_steps, greedy_target=False)


def greedy_rollout(env, Q: np.ndarray, max_steps: int = 1_000) -> tuple[list[int], float]:
    """``(states, return)`` of one episode following ``argmax_a Q`` (first maximum); stops after ``max_steps``."""
    s = env.reset()
    states, total = [s], 0.0
    for _ in range(check_positive_int("max_steps", max_steps)):
        s, r, done = env.step(int(np.argmax(Q[s])))
        states.append(s)
        total += r
        if done:
            break
    return states, total


def softmax_policy(theta: np.ndarray) -> np.ndarray:
    """``pi[s] = softmax(theta[s])``, shape ``(S, A)``."""
    z = np.exp(theta - theta.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def sample_episode(env, policy: np.ndarray, rng: np.random.Generator, max_steps: int = 200
                   ) -> list[tuple[int, int, float]]:
    """One episode ``[(s_t, a_t, r_{t+1}), ...]`` following the stochastic ``policy`` ``(S, A)``.

    The action is the first whose cumulative probability exceeds a uniform draw (inverse CDF).
    """
    cdf = np.cumsum(policy, axis=-1).tolist()  # each row as np.cumsum(policy[s]); bisect on plain floats is cheap
    s, steps = env.reset(), []
    for _ in range(max_steps):
        a = min(bisect.bisect_right(cdf[s], rng.random()), env.n_actions - 1)
        s_next, r, done = env.step(a)
        steps.append((s, a, r))
        s = s_next
        if done:
            break
    return steps


def returns_to_go(rewards: list[float] | np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = r_{t+1} + gamma G_{t+1}``, computed backwards."""
    G, running = np.zeros(len(rewards)), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        G[t] = running
    return G


def reinforce_gradient(theta: np.ndarray, episode: list[tuple[int, int, float]], gamma: float,
                       baseline: np.ndarray | None = None) -> np.ndarray:
    """The one-episode estimate ``sum_t gamma^t (G_t - b(s_t)) (onehot(a_t) - pi(s_t))`` of ``grad J``, ``(S, A)``."""
    pi = softmax_policy(theta)
    G = returns_to_go([r for _, _, r in episode], gamma)
    grad = np.zeros_like(theta)
    for t, (s, a, _) in enumerate(episode):
        weight = gamma ** t * (G[t] - (0.0 if baseline is None else baseline[s]))
        grad[s] -= weight * pi[s]
        grad[s, a] += weight
    return grad


def reinforce(env, episodes: int = 500, lr: float = 0.1, gamma: float = 0.95, baseline: bool = True,
              value_lr: float = 0.1, seed: int = 0, max_steps: int = 200
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(theta, returns, grad_sq_norms)``: REINFORCE by gradient ascent from ``theta = 0``.

    With ``baseline`` a tabular state value ``b(s)`` is learned alongside by
    ``b(s_t) += value_lr (G_t - b(s_t))`` (Sutton & Barto, section 13.4).
    ``returns`` holds each episode's discounted return from the start,
    ``grad_sq_norms`` the squared norm of each episode's gradient estimate.
    """
    check_positive_int("episodes", episodes)
    check_positive("lr", lr)
    check_nonnegative("value_lr", value_lr)
    _check_unit("gamma", gamma)
    rng = np.random.default_rng(seed)
    theta, b = np.zeros((env.n_states, env.n_actions)), np.zeros(env.n_states)
    returns, norms = np.zeros(episodes), np.zeros(episodes)
    for i in range(episodes):
        episode = sample_episode(env, softmax_policy(theta), rng, max_steps)
        grad = reinforce_gradient(theta, episode, gamma, b if baseline else None)
        G = returns_to_go([r for _, _, r in episode], gamma)
        if baseline:
            for (s, _, _), g in zip(episode, G):
                b[s] += value_lr * (g - b[s])
        theta += lr * grad
        returns[i], norms[i] = G[0], float((grad ** 2).sum())
    return theta, returns, norms


def gradient_variance(env, theta: np.ndarray, gamma: float, baseline: np.ndarray | None, n_episodes: int = 1000,
                      seed: int = 0, max_steps: int = 200) -> tuple[np.ndarray, float]:
    """``(mean gradient, total variance)`` of the REINFORCE estimate over ``n_episodes`` at fixed ``theta``.

    The total variance is the trace of the estimates' covariance, ``sum_ij Var[g_ij]``.
    """
    rng = np.random.default_rng(seed)
    pi = softmax_policy(theta)
    grads = np.stack([reinforce_gradient(theta, sample_episode(env, pi, rng, max_steps), gamma, baseline)
                      for _ in range(check_positive_int("n_episodes", n_episodes))])
    return grads.mean(0), float(grads.var(0, ddof=1).sum())
