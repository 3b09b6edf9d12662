"""David Silver's "Student" Markov reward process and Markov decision process, with the values his slides print.

Source: David Silver, *UCL Course on Reinforcement Learning*, lecture 2,
"Markov Decision Processes", the slides of the Student Markov chain, MRP
and MDP, https://www.davidsilver.uk/wp-content/uploads/2020/03/MDP.pdf . The rewards
are received on *leaving* a state (``R_s = E[R_{t+1} | S_t = s]``), the same
convention as :func:`utils.rl.mdp.mrp_value`.

The MDP has different action names in different states; as an array it has two
action slots per state, named per state by :data:`STUDENT_MDP_ACTIONS`, and its
terminal state ``Sleep`` keeps both slots as "stay asleep, reward 0".
"""

from __future__ import annotations

import numpy as np

from utils.published import Published

SLIDES = "D. Silver, UCL RL course, lecture 2 'Markov Decision Processes', https://www.davidsilver.uk/wp-content/uploads/2020/03/MDP.pdf"

STUDENT_MRP_STATES = ("Class 1", "Class 2", "Class 3", "Pass", "Pub", "Facebook", "Sleep")
STUDENT_MDP_STATES = ("Facebook", "Class 1", "Class 2", "Class 3", "Sleep")
STUDENT_MDP_ACTIONS = (("Facebook", "Quit"), ("Facebook", "Study"), ("Sleep", "Study"), ("Pub", "Study"),
                       ("(stay)", "(stay)"))
"""The two actions of each state of :data:`STUDENT_MDP_STATES`, in the order of ``P[s, a]``."""


def student_mrp() -> tuple[np.ndarray, np.ndarray]:
    """``(P, R)`` of the Student MRP, states in the order of :data:`STUDENT_MRP_STATES`; ``Sleep`` is terminal."""
    c1, c2, c3, passed, pub, fb, sleep = range(7)
    P = np.zeros((7, 7))
    P[c1, [c2, fb]] = 0.5, 0.5
    P[c2, [c3, sleep]] = 0.8, 0.2
    P[c3, [passed, pub]] = 0.6, 0.4
    P[passed, sleep] = 1.0
    P[pub, [c1, c2, c3]] = 0.2, 0.4, 0.4
    P[fb, [fb, c1]] = 0.9, 0.1
    P[sleep, sleep] = 1.0
    R = np.array([-2.0, -2.0, -2.0, 10.0, 1.0, -1.0, 0.0])
    return P, R


def student_mdp() -> tuple[np.ndarray, np.ndarray]:
    """``(P, R)`` of the Student MDP, shapes ``(5, 2, 5)`` and ``(5, 2)``; ``Sleep`` (index 4) is terminal."""
    fb, c1, c2, c3, sleep = range(5)
    P = np.zeros((5, 2, 5))
    R = np.zeros((5, 2))
    P[fb, 0, fb], R[fb, 0] = 1.0, -1.0          # keep scrolling
    P[fb, 1, c1], R[fb, 1] = 1.0, 0.0           # quit
    P[c1, 0, fb], R[c1, 0] = 1.0, -1.0          # facebook
    P[c1, 1, c2], R[c1, 1] = 1.0, -2.0          # study
    P[c2, 0, sleep], R[c2, 0] = 1.0, 0.0        # sleep
    P[c2, 1, c3], R[c2, 1] = 1.0, -2.0          # study
    P[c3, 0, [c1, c2, c3]], R[c3, 0] = (0.2, 0.4, 0.4), 1.0   # pub
    P[c3, 1, sleep], R[c3, 1] = 1.0, 10.0       # study: pass, then sleep
    P[sleep, :, sleep] = 1.0
    return P, R


def _values(states: tuple[str, ...], values: tuple[float, ...], what: str) -> dict[str, Published]:
    return {s: Published(v, "return", f"{SLIDES}: {what}") for s, v in zip(states, values)}


STUDENT_MRP_VALUES_GAMMA_0_9 = _values(STUDENT_MRP_STATES, (-5.0, 0.9, 4.1, 10.0, 1.9, -7.6, 0.0),
                                      "state values of the Student MRP, gamma = 0.9")
"""The slides' values of the Student MRP for gamma = 0.9, rounded to 0.1 (cross-checked: microsoft/ai-edu's
A7 reinforcement-learning notes work out V(Class 3) = 4.09 from V(Pub) = 1.93 with the same numbers)."""

STUDENT_MDP_RANDOM_POLICY_VALUES = _values(STUDENT_MDP_STATES, (-2.3, -1.3, 2.7, 7.4, 0.0),
                                           "state values of the Student MDP under the uniform random policy")
"""``V_pi`` of the uniform random policy (each action with probability 1/2), gamma = 1, rounded to 0.1."""
