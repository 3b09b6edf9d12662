import numpy as np
import pytest

from utils.rl.environments import CLIFF_OPTIMAL_RETURN, CliffWalking, RandomActionGridWorld
from utils.rl.tabular import greedy_rollout
from utils.rl.mdp import value_iteration

UP, RIGHT, DOWN, LEFT = range(4)


def test_cliff_walking_is_sutton_and_bartos_example_6_6():
    """4 x 12, start bottom-left, goal bottom-right, -1 per move, -100 and back to the start for the cliff."""
    env = CliffWalking()
    assert (env.rows, env.cols, env.cell(env.start), env.cell(env.goal)) == (4, 12, (3, 0), (3, 11))
    assert env.reset() == env.start
    assert env.step(RIGHT) == (env.start, -100.0, False)  # into the cliff: back to the start
    assert env.step(LEFT) == (env.start, -1.0, False)      # into the edge: stay
    assert env.step(UP) == (env.index((2, 0)), -1.0, False)
    for _ in range(11):
        s, r, done = env.step(RIGHT)
    assert (env.cell(s), r, done) == ((2, 11), -1.0, False)
    assert env.step(DOWN) == (env.goal, -1.0, True)
    with pytest.raises(ValueError, match="reset"):
        env.step(UP)


def test_cliff_walking_optimal_return_is_minus_13():
    """The optimal path (up, 11 x right, down) has 13 moves; value iteration with gamma -> 1 finds it."""
    env = CliffWalking()
    P, R = env.transition_arrays()
    gamma = 0.999
    V, _ = value_iteration(P, R, gamma)
    assert V[env.start] == pytest.approx(-(1 - gamma ** 13) / (1 - gamma), rel=1e-6)
    q = R + gamma * P @ V
    assert greedy_rollout(env, q)[1] == CLIFF_OPTIMAL_RETURN.value


@pytest.mark.parametrize("env", [CliffWalking(), RandomActionGridWorld(3, 4, walls=((1, 1),), slip=0.0)])
def test_deterministic_steps_match_P_and_R(env):
    P, R = env.transition_arrays()
    for s in range(env.n_states):
        if s in env.terminal or s in env.walls or s in getattr(env, "cliff", ()):
            continue
        for a in range(env.n_actions):
            env.state = s
            s_next, r, _ = env.step(a)
            assert P[s, a, s_next] == 1.0 and R[s, a] == r


def test_slippery_steps_sample_P_and_R():
    """Empirical next-state frequencies and mean rewards of step() agree with the arrays."""
    env = RandomActionGridWorld(3, 3, walls=((1, 1),), slip=0.4, seed=1)
    P, R = env.transition_arrays()
    np.testing.assert_allclose(P.sum(-1), 1.0)
    n = 4000
    for s, a in [(0, 1), (3, 0), (5, 3)]:
        counts, total = np.zeros(env.n_states), 0.0
        for _ in range(n):
            env.state = s
            s_next, r, _ = env.step(a)
            counts[s_next] += 1
            total += r
        np.testing.assert_allclose(counts / n, P[s, a], atol=0.03)
        assert total / n == pytest.approx(R[s, a])
    # from the corner (0, 0) moving right: 0.6 + 0.1 right, 0.1 down, 0.2 bump (up, left) stays
    assert P[0, 1, 1] == pytest.approx(0.7) and P[0, 1, 3] == pytest.approx(0.1) and P[0, 1, 0] == pytest.approx(0.2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rows=0), "rows"), (dict(goal=(0, 0)), "different"), (dict(slip=1.5), "slip"),
    (dict(walls=((9, 9),)), "inside"),
])
def test_bad_grids_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RandomActionGridWorld(**kwargs)


def test_bad_action_raises():
    env = RandomActionGridWorld()
    env.reset()
    with pytest.raises(ValueError, match="action"):
        env.step(4)
