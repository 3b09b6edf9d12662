import numpy as np
import pytest
import torch

from utils.rl import mrp_value
from utils.rl.markov import (episodic_value, estimate_transition_matrix, evaluation_history, sample_path,
                             sample_returns, transition_counts)
from utils.rl.mdp import induced_mrp, random_mdp
from utils.rl.student import (STUDENT_MDP_RANDOM_POLICY_VALUES, STUDENT_MRP_VALUES_GAMMA_0_9, student_mdp,
                              student_mrp)


def _random_chain(n_states, seed):
    return np.random.default_rng(seed).dirichlet(np.ones(n_states), size=n_states)


def test_counts_of_a_short_path_by_hand():
    # S1 S1 S1 S2 S1 S2 S1 S2 S2 S3: from S1 -> S1 twice, S1 -> S2 three times; S2 -> S1 twice, S2 -> S2, S2 -> S3
    path = [0, 0, 0, 1, 0, 1, 0, 1, 1, 2]
    np.testing.assert_array_equal(transition_counts(path, 3), [[2, 3, 0], [2, 1, 1], [0, 0, 0]])
    np.testing.assert_allclose(estimate_transition_matrix(path, 3),
                               [[2 / 5, 3 / 5, 0], [2 / 4, 1 / 4, 1 / 4], [1 / 3, 1 / 3, 1 / 3]])


@pytest.mark.parametrize("seed, n_states", [(0, 3), (1, 6)])
def test_estimator_recovers_P_from_a_long_path(seed, n_states):
    P = _random_chain(n_states, seed)
    path = sample_path(P, 0, 200_000, seed=seed)
    np.testing.assert_allclose(estimate_transition_matrix(path, n_states), P, atol=0.02)


def test_sampled_paths_follow_P_for_torch_input_too():
    P = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_array_equal(sample_path(P, 0, 5), [0, 1, 0, 1, 0, 1])


@pytest.mark.parametrize("gamma", [0.5, 0.9])
def test_mean_sampled_return_converges_to_the_closed_form(gamma):
    P, R = random_mdp(5, 1, seed=3)
    P, R = P[:, 0], R[:, 0]
    returns = sample_returns(P, R, gamma, start=2, n_episodes=40_000, horizon=200, seed=1)
    stderr = returns.std() / np.sqrt(len(returns))
    assert abs(returns.mean() - mrp_value(P, R, gamma)[2]) < 4 * stderr


def test_episodes_stop_at_terminal_states_and_match_the_undiscounted_value():
    P, R = student_mrp()
    returns = sample_returns(P, R, 1.0, start=1, n_episodes=40_000, horizon=2_000, seed=0, terminal=[6])
    stderr = returns.std() / np.sqrt(len(returns))
    assert abs(returns.mean() - episodic_value(P, R, [6])[1]) < 4 * stderr
    # one deterministic episode: Pass -> Sleep collects 10, then stops
    np.testing.assert_array_equal(sample_returns(P, R, 0.5, 3, 3, 50, terminal=[6]), [10, 10, 10])


@pytest.mark.parametrize("gamma", [0.3, 0.9, 0.99])
def test_iteration_converges_within_the_contraction_bound(gamma):
    P = _random_chain(8, 4)
    R = np.random.default_rng(4).standard_normal(8)
    V = mrp_value(P, R, gamma)
    history = evaluation_history(P, R, gamma, 60, V0=np.ones(8) * 5)
    errors = np.abs(history - V).max(-1)
    bound = gamma ** np.arange(61) * errors[0]
    assert np.all(errors <= bound + 1e-12)
    if gamma == 0.3:
        assert errors[-1] < 1e-10  # 0.3^60 is far below float64 precision


def test_student_mrp_matches_the_slides():
    P, R = student_mrp()
    V = mrp_value(P, R, 0.9)
    published = np.array([f.value for f in STUDENT_MRP_VALUES_GAMMA_0_9.values()])
    np.testing.assert_allclose(V, published, atol=0.05 + 1e-9)


def test_student_mdp_random_policy_matches_the_slides():
    P, R = student_mdp()
    P_pi, R_pi = induced_mrp(P, R, np.full((5, 2), 0.5))
    published = np.array([f.value for f in STUDENT_MDP_RANDOM_POLICY_VALUES.values()])
    np.testing.assert_allclose(episodic_value(P_pi, R_pi, [4]), published, atol=0.05 + 1e-9)


def test_episodic_value_agrees_with_discounted_closed_form():
    P, R = student_mrp()
    np.testing.assert_allclose(episodic_value(P, R, [6], gamma=0.9), mrp_value(P, R, 0.9), atol=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda: transition_counts([0, 3], 3), r"\[0, 3\)"),
    (lambda: transition_counts([0.5, 1.0], 3), "ints"),
    (lambda: transition_counts([], 3), "non-empty"),
    (lambda: estimate_transition_matrix([0, 1], 0), "n_states"),
    (lambda: sample_path([[0.5, 0.4], [0, 1]], 0, 3), "sum to 1"),
    (lambda: sample_path([[1.0]], 1, 3), "start"),
    (lambda: sample_returns([[1.0]], [1.0], 1.5, 0, 10, 10), "gamma"),
    (lambda: sample_returns([[1.0]], [1.0, 2.0], 0.5, 0, 10, 10), "shape"),
    (lambda: evaluation_history([[1.0]], [1.0], 1.0, 5), "gamma"),
    (lambda: evaluation_history([[1.0]], [1.0], 0.5, 5, V0=[1.0, 2.0]), "V0"),
    (lambda: episodic_value([[0, 1], [0, 1]], [1, 5], [1]), "reward 0"),
    (lambda: episodic_value([[1, 0], [0, 1]], [1, 0], [1]), "never reach"),
    (lambda: episodic_value([[1.0]], [0.0], []), "terminal"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_two_episodes_add_their_counts_without_a_transition_between_them():
    """The source notes' two observed rows: S1 S1 S1 S2 S1 S2 S1 S2 S2 S3 and S3 S1 S3 S2 S3 S3."""
    first, second = [0, 0, 0, 1, 0, 1, 0, 1, 1, 2], [2, 0, 2, 1, 2, 2]
    expected = np.array([[2, 3, 1], [2, 1, 2], [1, 1, 1]]) / np.array([[6], [5], [3]])
    np.testing.assert_allclose(estimate_transition_matrix([first, second], 3), expected)
    # Joining them into one path would invent an S3 -> S3 step at the seam.
    joined = estimate_transition_matrix(first + second, 3)
    assert joined[2, 2] == 0.5 and expected[2, 2] == 1 / 3
