"""Part 4, reinforcement learning and post-training: from Bellman equations to RLHF.

Modules:

- :mod:`utils.rl.mdp`: MRPs and MDPs as arrays, solved in closed form and by
  dynamic programming (policy evaluation, value iteration, policy iteration);
- :mod:`utils.rl.objectives`: the Bradley-Terry reward-model loss, PPO's
  clipped surrogate, GRPO's group-relative advantages, DPO, GAE, and
  Schulman's KL estimators k1, k2, k3;
- :mod:`utils.rl.ppo`: PPO in full (Schulman et al. 2017, eq. 9): the critic's
  clipped value loss and targets, the entropy bonus, PPO-Penalty with its adaptive
  KL coefficient, Spinning Up's early stopping on the approximate KL, and
  per-token rewards and GAE for a batch of padded responses;
- :mod:`utils.rl.markov`: Markov chains and MRPs from data: the maximum-likelihood
  transition matrix, sampled returns (Monte Carlo), the iterates of Bellman
  evaluation, and values of episodic chains with gamma = 1;
- :mod:`utils.rl.student`: David Silver's Student MRP and MDP, with his slides' values;
- :mod:`utils.rl.bellman_plots`: the figures of chapters 02 and 03 of part 4;
- :mod:`utils.rl.gridworld`: GridWorlds as (P, R) arrays with absorbing
  terminal states and slip; iterative policy evaluation (also gamma = 1 on
  episodic tasks), value and policy iteration that keep their histories; its
  figures in :mod:`utils.rl.gridworld_plots`;
- :mod:`utils.rl.environments`: RandomActionGridWorld and CliffWalking (Sutton & Barto,
  Example 6.6) with reset/step and their (P, R) arrays;
- :mod:`utils.rl.tabular`: Q-learning, SARSA, epsilon-greedy, and REINFORCE
  (with a baseline) for tabular softmax policies;
- :mod:`utils.rl.lora`: LoRA layers (``LoRALinear``, ``apply_lora``,
  ``count_trainable``) and the parameters and model-state bytes of LoRA vs
  full fine-tuning;
- :mod:`utils.rl.tiny_lm`: a 2-layer transformer of one-digit sums, its noisy
  pre-training corpus, sampling with log-probabilities and sequence log-probs;
- :mod:`utils.rl.post_training`: the verifiable arithmetic reward, KL to a
  frozen reference, and the GRPO and DPO loops of the post-training labs;
- :mod:`utils.rl.starting_point`: the post-training labs' pre-trained, SFT and
  GRPO models, each trained once (:mod:`utils.train_once`) and loaded by the others;
- :mod:`utils.rl.rlhf_cost`: the models an RLHF step holds in memory (PPO,
  GRPO, DPO; ZeRO-sharded) and a cost model of one step (generation at the
  decode roofline, old log-probs, scoring, epochs x 6ND training, exposed ZeRO-3
  gathers, weight sync);
- :mod:`utils.rl.rollout_systems`: the rollout engine's weights and KV cache under
  colocated, sleep-mode and disaggregated placement, and one step's timeline under each;
- :mod:`utils.rl.grpo_variants`: GRPO's reward scaling and token-loss aggregation
  under TRL's names (``scale_rewards``, ``loss_type``; Dr. GRPO's biases);
- :mod:`utils.rl.best_of_n`: best-of-N with a 0/1 checker and the optimum of the
  KL-regularised objective, exactly (the accuracy-KL frontier);
- :mod:`utils.rl.post_training_plots`: the figures of "From pretraining to SFT
  to RLHF" and "Post-training at scale".
- :mod:`utils.rl.preference_losses`: IPO, KTO and SimPO, preference losses beyond DPO;
- :mod:`utils.rl.chat_template`: a toy chat template (special role tokens) and the
  assistant-only loss mask of multi-turn SFT.

The names part 4's pages and tests use are re-exported here
(``utils.rl.policy_evaluation``, ``utils.rl.dpo_loss``, ...).
"""

from utils.rl.mdp import mrp_value, policy_evaluation, policy_iteration, value_iteration
from utils.rl.objectives import bradley_terry_loss, dpo_loss, gae, grpo_advantages, kl_estimate, ppo_clip_loss

__all__ = ["bradley_terry_loss", "dpo_loss", "gae", "grpo_advantages", "kl_estimate", "mrp_value", "policy_evaluation",
           "policy_iteration", "ppo_clip_loss", "value_iteration"]

from utils.rl.preference_losses import ipo_loss, kto_loss, kto_reference_point, simpo_loss  # noqa: E402
__all__ += ["ipo_loss", "kto_loss", "kto_reference_point", "simpo_loss"]
from utils.rl.chat_template import masked_lm_loss, render as render_chat  # noqa: E402
__all__ += ["masked_lm_loss", "render_chat"]
from utils.rl.ppo import AdaptiveKLController, entropy_bonus, ppo_loss, ppo_value_loss, value_targets  # noqa: E402
__all__ += ["AdaptiveKLController", "entropy_bonus", "ppo_loss", "ppo_value_loss", "value_targets"]
