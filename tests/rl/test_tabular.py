import numpy as np
import pytest

from utils.rl.environments import CliffWalking, RandomActionGridWorld
from utils.rl.mdp import policy_evaluation, q_from_v, value_iteration
from utils.rl.tabular import (epsilon_greedy, gradient_variance, greedy_rollout, q_learning, reinforce,
                              returns_to_go, sarsa, softmax_policy)


def test_q_learning_converges_to_q_star_on_a_tiny_mdp():
    """A 2 x 3 deterministic grid, gamma = 0.9: Q-learning's table approaches q* from value iteration."""
    env = RandomActionGridWorld(2, 3, step_reward=-1.0)
    gamma = 0.9
    P, R = env.transition_arrays()
    V, _ = value_iteration(P, R, gamma)
    q_star = q_from_v(P, R, V, gamma)
    Q, _ = q_learning(env, episodes=3000, alpha=0.2, epsilon=0.5, gamma=gamma, seed=0)
    live = [s for s in range(env.n_states) if s not in env.terminal]
    np.testing.assert_allclose(Q[live], q_star[live], atol=0.02)


def test_q_learning_takes_the_cliff_edge_and_sarsa_the_safe_path():
    """Sutton & Barto, Example 6.6: Q-learning's greedy path is optimal (-13) along the cliff;
    SARSA's keeps away from the edge; online, with epsilon = 0.1, SARSA earns more per episode."""
    env = CliffWalking()
    edge_row = {env.index((2, c)) for c in range(1, 11)}
    q_online, s_online = [], []
    for seed in range(3):
        Q, q_ret = q_learning(env, episodes=500, alpha=0.5, epsilon=0.1, seed=seed)
        S, s_ret = sarsa(env, episodes=500, alpha=0.5, epsilon=0.1, seed=seed)
        q_path, q_return = greedy_rollout(env, Q)
        s_path, s_return = greedy_rollout(env, S)
        assert q_return == -13.0 and edge_row <= set(q_path)
        assert -30 < s_return < -13 and len(edge_row & set(s_path)) <= 2  # at most a corner of the edge
        q_online.append(q_ret[-100:].mean())
        s_online.append(s_ret[-100:].mean())
    assert np.mean(s_online) > np.mean(q_online) + 10


def test_epsilon_greedy_breaks_ties_at_random_and_explores():
    rng = np.random.default_rng(0)
    q = np.array([1.0, 3.0, 3.0, 0.0])
    greedy = [epsilon_greedy(q, 0.0, rng) for _ in range(400)]
    assert set(greedy) == {1, 2}
    explored = np.bincount([epsilon_greedy(q, 1.0, rng) for _ in range(4000)], minlength=4) / 4000
    np.testing.assert_allclose(explored, 0.25, atol=0.03)


def test_returns_to_go():
    np.testing.assert_allclose(returns_to_go([1.0, 0.0, 2.0], 0.5), [1.5, 1.0, 2.0])


def test_reinforce_gradient_is_unbiased_and_the_baseline_cuts_its_variance():
    """The mean estimate matches the finite-difference gradient of V_pi(start) (policy_evaluation), with or
    without the baseline b = V_pi; the baseline lowers the variance (Sutton & Barto, section 13.4)."""
    env = RandomActionGridWorld(2, 3, slip=0.2, seed=0)
    gamma = 0.9
    P, R = env.transition_arrays()
    theta = np.random.default_rng(1).normal(size=(env.n_states, env.n_actions))
    h, exact = 1e-5, np.zeros_like(theta)
    for idx in np.ndindex(theta.shape):
        d = np.zeros_like(theta)
        d[idx] = h
        exact[idx] = (policy_evaluation(P, R, softmax_policy(theta + d), gamma)[env.start]
                      - policy_evaluation(P, R, softmax_policy(theta - d), gamma)[env.start]) / (2 * h)
    V = policy_evaluation(P, R, softmax_policy(theta), gamma)
    mean0, var0 = gradient_variance(env, theta, gamma, None, n_episodes=4000, seed=0)
    mean1, var1 = gradient_variance(env, theta, gamma, V, n_episodes=4000, seed=0)
    scale = np.abs(exact).max()
    assert np.abs(mean0 - exact).max() < 0.15 * scale * 2
    assert np.abs(mean1 - exact).max() < 0.15 * scale
    assert var1 < var0 / 3


def test_reinforce_improves_the_return():
    env = RandomActionGridWorld(4, 4)
    gamma = 0.95
    _, returns, _ = reinforce(env, episodes=300, lr=0.05, gamma=gamma, baseline=True, seed=0)
    optimal = -(1 - gamma ** 6) / (1 - gamma)
    assert returns[:20].mean() < optimal - 5
    assert returns[-20:].mean() == pytest.approx(optimal, abs=0.2)


@pytest.mark.parametrize("call, match", [
    (lambda: q_learning(RandomActionGridWorld(), episodes=0), "episodes"),
    (lambda: sarsa(RandomActionGridWorld(), epsilon=1.5), "epsilon"),
    (lambda: reinforce(RandomActionGridWorld(), lr=0), "lr"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
