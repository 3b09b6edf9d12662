"""Part 4, reinforcement learning and post-training: from Bellman equations to RLHF.

Modules:

- :mod:`utils.rl.mdp`: MRPs and MDPs as arrays, solved in closed form and by
  dynamic programming (policy evaluation, value iteration, policy iteration);
- :mod:`utils.rl.objectives`: the Bradley-Terry reward-model loss, PPO's
  clipped surrogate, GRPO's group-relative advantages, DPO, and GAE.

The names part 4's pages and tests use are re-exported here
(``utils.rl.policy_evaluation``, ``utils.rl.dpo_loss``, ...).
"""

from utils.rl.mdp import mrp_value, policy_evaluation, policy_iteration, value_iteration
from utils.rl.objectives import bradley_terry_loss, dpo_loss, gae, grpo_advantages, ppo_clip_loss

__all__ = ["bradley_terry_loss", "dpo_loss", "gae", "grpo_advantages", "mrp_value", "policy_evaluation",
           "policy_iteration", "ppo_clip_loss", "value_iteration"]
