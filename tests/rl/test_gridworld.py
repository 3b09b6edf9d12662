import numpy as np
import pytest

from utils.rl import policy_evaluation, policy_iteration, value_iteration
from utils.rl.gridworld import (GridWorld, gridworld_mdp, iterative_policy_evaluation, policy_iteration_history,
                                value_iteration_history)
from utils.rl.gridworld_plots import greedy_actions

# Sutton & Barto (2018), Figure 4.1, k = infinity: v_pi of the equiprobable random policy, Example 4.1.
EXAMPLE_4_1_TABLE = np.array([[0, -14, -20, -22], [-14, -18, -20, -20], [-20, -20, -18, -14], [-22, -20, -14, 0]])
EXAMPLE_4_1_WORLD = GridWorld(4, 4, terminals=((0, 0), (3, 3)), step_reward=-1.0)
MAZE = GridWorld(4, 5, terminals=((0, 4), (1, 4)), walls=((1, 1), (2, 3)), bonus={(0, 4): 1.0, (1, 4): -1.0},
                 step_reward=-0.04, slip=0.2)


@pytest.mark.parametrize("in_place", [False, True])
def test_example_4_1_values_of_the_random_policy(in_place):
    P, R = gridworld_mdp(EXAMPLE_4_1_WORLD)
    V, history = iterative_policy_evaluation(P, R, np.full((16, 4), 0.25), 1.0, tol=1e-10, in_place=in_place)
    np.testing.assert_allclose(EXAMPLE_4_1_WORLD.to_grid(V), EXAMPLE_4_1_TABLE, atol=1e-7)
    if not in_place:  # Figure 4.1, k = 1: -1 everywhere but the terminal corners
        np.testing.assert_array_equal(history[1], np.where(np.isin(np.arange(16), (0, 15)), 0.0, -1.0))


def test_in_place_needs_fewer_sweeps_on_example_4_1():
    P, R = gridworld_mdp(EXAMPLE_4_1_WORLD)
    _, two_arrays = iterative_policy_evaluation(P, R, np.full((16, 4), 0.25), 1.0, tol=1e-6)
    _, in_place = iterative_policy_evaluation(P, R, np.full((16, 4), 0.25), 1.0, tol=1e-6, in_place=True)
    assert len(in_place) < len(two_arrays)


def test_example_4_1_optimal_values_are_minus_the_steps_to_the_nearest_corner():
    P, R = gridworld_mdp(EXAMPLE_4_1_WORLD)
    steps = np.array([[min(r + c, 6 - r - c) for c in range(4)] for r in range(4)])
    V, _, _ = value_iteration_history(P, R, 1.0)
    np.testing.assert_allclose(EXAMPLE_4_1_WORLD.to_grid(V), -steps)
    V_pi, _, history, _ = policy_iteration_history(P, R, 1.0)
    np.testing.assert_allclose(EXAMPLE_4_1_WORLD.to_grid(V_pi), -steps, atol=1e-8)
    assert len(history) <= 3


@pytest.mark.parametrize("world", [EXAMPLE_4_1_WORLD, MAZE, GridWorld(3, 3, slip=1.0, step_reward=0.5)])
def test_transition_rows_sum_to_one_and_terminals_absorb(world):
    P, R = gridworld_mdp(world)
    np.testing.assert_allclose(P.sum(-1), 1.0)
    for cell in world.terminals:
        s = world.index()[cell]
        np.testing.assert_array_equal(P[s, :, s], 1.0)
        np.testing.assert_array_equal(R[s], 0.0)


def test_slip_moves_sideways_and_walls_block():
    P, R = gridworld_mdp(MAZE)
    idx = MAZE.index()
    s = idx[(1, 0)]
    up = P[s, 0]  # intended up to (0, 0); slips: right into the wall (1, 1) -> stay, left off the grid -> stay
    assert up[idx[(0, 0)]] == pytest.approx(0.8) and up[s] == pytest.approx(0.2)
    into_goal = idx[(0, 3)]
    assert R[into_goal, 1] == pytest.approx(-0.04 + 0.8 * 1.0)  # right: goal; slips: up stays, down to (1, 3)
    assert R[idx[(2, 4)], 0] == pytest.approx(-0.04 + 0.8 * -1.0)  # up from below the pit


@pytest.mark.parametrize("gamma", [0.5, 0.9, 0.99])
def test_histories_converge_to_the_closed_form_solvers(gamma):
    P, R = gridworld_mdp(MAZE)
    rng = np.random.default_rng(0)
    pi = rng.dirichlet(np.ones(4), size=len(R))
    for in_place in (False, True):
        V, _ = iterative_policy_evaluation(P, R, pi, gamma, tol=1e-12, in_place=in_place)
        np.testing.assert_allclose(V, policy_evaluation(P, R, pi, gamma), atol=1e-9)
    V_vi, policy_vi, history = value_iteration_history(P, R, gamma, tol=1e-12)
    V_ref, policy_ref = value_iteration(P, R, gamma, tol=1e-12)
    np.testing.assert_allclose(V_vi, V_ref, atol=1e-9)
    errors = [np.abs(v - V_ref).max() for v in history]
    assert all(e <= gamma ** k * errors[0] + 1e-9 for k, e in enumerate(errors))  # contraction bound
    V_pi, policy_pi, _, _ = policy_iteration_history(P, R, gamma, tol=1e-12)
    V_exact, _, _ = policy_iteration(P, R, gamma)
    np.testing.assert_allclose(V_pi, V_exact, atol=1e-8)
    np.testing.assert_allclose(policy_evaluation(P, R, policy_pi, gamma), V_exact, atol=1e-8)


def test_greedy_actions_keep_ties():
    assert greedy_actions([[1.0, 1.0, 0.0, 1.0 - 1e-9]]) == [[0, 1, 3]]


@pytest.mark.parametrize("make, match", [
    (lambda: GridWorld(0, 3), "rows"),
    (lambda: GridWorld(2, 2, terminals=((2, 0),)), "inside"),
    (lambda: GridWorld(2, 2, slip=1.5), "slip"),
    (lambda: GridWorld(2, 2, walls=((0, 0),), terminals=((0, 0),)), "wall"),
    (lambda: GridWorld(1, 1, walls=((0, 0),)), "no states"),
    (lambda: gridworld_mdp("grid"), "GridWorld"),
    (lambda: iterative_policy_evaluation(*gridworld_mdp(MAZE), np.full((18, 4), 0.25), 1.5), "gamma"),
    (lambda: iterative_policy_evaluation(*gridworld_mdp(MAZE), np.full((18, 3), 0.25), 0.9), "policy"),
    (lambda: value_iteration_history(*gridworld_mdp(MAZE), 0.9, tol=0), "tol"),
    (lambda: EXAMPLE_4_1_WORLD.to_grid(np.zeros(3)), "shape"),
])
def test_bad_input_raises(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_an_improper_policy_with_gamma_one_raises():
    world = GridWorld(1, 3, terminals=((0, 2),))
    P, R = gridworld_mdp(world)
    always_left = np.eye(4)[[3, 3, 3]]
    with pytest.raises(RuntimeError, match="terminal"):
        iterative_policy_evaluation(P, R, always_left, 1.0, max_sweeps=500)


def test_the_module_table_is_the_published_one_and_example_4_1_matches_it():
    from utils.rl.gridworld import EXAMPLE_4_1_VALUES, example_4_1
    np.testing.assert_array_equal(EXAMPLE_4_1_VALUES, EXAMPLE_4_1_TABLE)
    assert example_4_1() == EXAMPLE_4_1_WORLD
