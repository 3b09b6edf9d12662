import itertools

import numpy as np
import pytest
import torch

from utils.rl import mrp_value, policy_evaluation, policy_iteration, value_iteration
from utils.rl.mdp import greedy_policy, induced_mrp, q_from_v, random_mdp


def _iterative_evaluation(P, R, pi, gamma, sweeps=5000):
    V = np.zeros(len(R))
    for _ in range(sweeps):
        V = (pi * (R + gamma * P @ V)).sum(-1)
    return V


@pytest.mark.parametrize("seed, n_states, n_actions, gamma", [(0, 5, 3, 0.9), (1, 12, 2, 0.5), (2, 30, 4, 0.99)])
def test_policy_evaluation_solves_the_bellman_expectation_equation(seed, n_states, n_actions, gamma):
    P, R = random_mdp(n_states, n_actions, seed)
    pi = np.random.default_rng(seed).dirichlet(np.ones(n_actions), size=n_states)
    V = policy_evaluation(P, R, pi, gamma)
    np.testing.assert_allclose(V, (pi * (R + gamma * P @ V)).sum(-1), atol=1e-10)
    np.testing.assert_allclose(V, _iterative_evaluation(P, R, pi, gamma), atol=1e-6)


def test_closed_form_mrp_value_of_a_two_state_chain():
    """V = (I - gamma P)^-1 R by hand: P = [[0.5, 0.5], [0, 1]], R = [1, 0], gamma = 0.5 gives V = [4/3, 0]."""
    np.testing.assert_allclose(mrp_value([[0.5, 0.5], [0.0, 1.0]], [1.0, 0.0], 0.5), [4 / 3, 0.0])


@pytest.mark.parametrize("seed", range(4))
def test_value_iteration_finds_the_best_deterministic_policy(seed):
    P, R = random_mdp(4, 2, seed)
    gamma = 0.8
    V, policy = value_iteration(P, R, gamma, tol=1e-12)
    best = np.max([policy_evaluation(P, R, np.eye(2)[list(actions)], gamma)
                   for actions in itertools.product(range(2), repeat=4)], axis=0)
    np.testing.assert_allclose(V, best, atol=1e-9)
    np.testing.assert_allclose(policy_evaluation(P, R, policy, gamma), best, atol=1e-9)
    np.testing.assert_allclose(V, q_from_v(P, R, V, gamma).max(-1), atol=1e-9)  # Bellman optimality


def test_policy_iteration_agrees_with_value_iteration_and_torch_inputs_work():
    P, R = random_mdp(20, 3, seed=5)
    V_vi, pi_vi = value_iteration(torch.tensor(P), torch.tensor(R), 0.9, tol=1e-12)
    V_pi, pi_pi, iterations = policy_iteration(P, R, 0.9)
    np.testing.assert_allclose(V_vi, V_pi, atol=1e-8)
    np.testing.assert_array_equal(pi_vi, pi_pi)
    assert iterations < 20


def test_induced_mrp_and_greedy_policy():
    P, R = random_mdp(3, 2, seed=0)
    P_pi, R_pi = induced_mrp(P, R, np.eye(2)[[0, 1, 0]])
    np.testing.assert_allclose(P_pi, P[[0, 1, 2], [0, 1, 0]])
    np.testing.assert_allclose(R_pi, R[[0, 1, 2], [0, 1, 0]])
    np.testing.assert_array_equal(greedy_policy([[1.0, 2.0], [3.0, 3.0]]), [[0, 1], [1, 0]])


@pytest.mark.parametrize("call, match", [
    (lambda P, R: policy_evaluation(P, R, np.full((3, 2), 0.5), 1.0), "gamma"),
    (lambda P, R: policy_evaluation(P, R, np.full((3, 2), 0.6), 0.9), "policy"),
    (lambda P, R: policy_evaluation(P * 2, R, np.full((3, 2), 0.5), 0.9), "every row of P"),
    (lambda P, R: value_iteration(P, R[:2], 0.9), "shape"),
    (lambda P, R: value_iteration(P, R, -0.1), "gamma"),
    (lambda P, R: mrp_value(P[:, 0], R[:, 0] * np.nan, 0.5), "finite"),
])
def test_bad_input_raises(call, match):
    P, R = random_mdp(3, 2, seed=0)
    with pytest.raises(ValueError, match=match):
        call(P, R)
