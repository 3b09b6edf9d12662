"""Post-training loops for the tiny arithmetic model: a verifiable reward, KL to a reference, GRPO and DPO.

- :func:`arithmetic_reward`: 1 if the response is the right sum followed by the
  end mark, else 0 (a *verifiable* reward, as DeepSeek-R1's accuracy reward,
  arXiv:2501.12948, section 2.2.2);
- :func:`kl_to_reference`: ``KL(pi || pi_ref)`` of whole responses, summed
  over response positions of the exact per-token KL of the two next-token
  distributions, averaged over responses sampled from ``pi``;
- :func:`grpo_loss` / :func:`train_grpo`: GRPO (Shao et al. 2024, arXiv:2402.03300,
  eq. 3): group z-scored rewards as advantages, PPO's clipped ratio per token,
  and ``beta`` times the k3 estimator ``r - log r - 1`` with
  ``r = pi_ref / pi`` (their eq. 4; Schulman 2020, "Approximating KL divergence"),
  put in the *loss* as GRPO does. Its value is an unbiased estimate of
  ``KL(pi || pi_ref)`` only on samples from ``pi`` (GRPO samples from ``pi_old``),
  and its expected gradient is that of the forward ``KL(pi_ref || pi)``
  (:func:`utils.rl.objectives.kl_estimate`; arXiv:2506.09477, arXiv:2510.01555);
  ``train_grpo`` also takes TRL's ``scale_rewards`` and ``loss_type``
  (:mod:`utils.rl.grpo_variants`: Dr. GRPO's ablations, arXiv:2503.20783) and
  any ``reward_fn`` (a learned reward model, say);
- :func:`preference_pairs` / :func:`train_dpo`: DPO (Rafailov et al. 2023,
  arXiv:2305.18290, eq. 7) on (correct, wrong) pairs sampled from the reference;
- :func:`expert_iteration`: rejection-sampling fine-tuning repeated (sample N
  answers per problem, keep those the checker accepts, fine-tune on them):
  STaR (arXiv:2203.14465), ReST (arXiv:2308.08998), Llama 2's rejection
  sampling (arXiv:2307.09288, section 3.2.3);
- :func:`lengths_by_correctness`: the mean length of right and of wrong responses.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn

from utils.progress import progress
from utils.rl.grpo_variants import LOSS_TYPES, aggregate_token_loss, group_advantages
from utils.rl.objectives import dpo_loss, grpo_advantages, kl_estimate, ppo_clip_loss
from utils.rl.tiny_lm import MAX_RESPONSE, PROMPT_LEN, decode, prompt_tokens, response_mask, sample, \
    sequence_logprob, token_logprobs, train_lm
from utils.validate import check_nonnegative, check_positive, check_positive_int


def arithmetic_reward(sequences: torch.Tensor) -> torch.Tensor:
    """``(batch,)`` floats: 1.0 where the response after ``"a+b="`` is exactly ``f"{a + b}."``, else 0.0."""
    rewards = []
    for row in sequences.tolist():
        a, b = row[0], row[2]  # digit tokens are their own values
        rewards.append(float(decode(row[PROMPT_LEN:]) == f"{a + b}."))
    return torch.tensor(rewards)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy with gradients off, in eval mode: the reference policy ``pi_ref``."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def kl_to_reference(policy: nn.Module, ref: nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """``(batch,)``: ``sum_t KL(pi(.|x, y_<t) || pi_ref(.|x, y_<t))`` over each response's real tokens.

    Averaged over ``y ~ pi`` this is the sequence-level ``KL(pi || pi_ref)``
    (the chain rule of KL), with less variance than ``log pi(y) - log pi_ref(y)``.
    """
    logits_p, logits_q = (m(sequences[:, :-1])[:, PROMPT_LEN - 1:] for m in (policy, ref))
    dtype = torch.promote_types(torch.promote_types(logits_p.dtype, logits_q.dtype), torch.float32)
    logp, logq = torch.log_softmax(logits_p.to(dtype), -1), torch.log_softmax(logits_q.to(dtype), -1)
    per_token = (logp.exp() * (logp - logq)).sum(-1)
    return torch.where(response_mask(sequences), per_token, 0.0).sum(-1)


@torch.no_grad()
def evaluate(policy: nn.Module, ref: nn.Module, problems: list[tuple[int, int]], samples_per_problem: int = 8,
             seed: int = 0) -> tuple[float, float]:
    """``(mean reward, mean KL to ref)`` of responses sampled at temperature 1 for each problem.

    A measurement only: the samples of one problem share their prefixes' forwards
    (:func:`~utils.rl.tiny_lm.sample`'s ``share_prefixes``), which nothing trains on.
    """
    check_positive_int("samples_per_problem", samples_per_problem)
    g = torch.Generator().manual_seed(seed)
    seq, _ = sample(policy, prompt_tokens(problems).repeat_interleave(samples_per_problem, 0), generator=g,
                    share_prefixes=True)
    return arithmetic_reward(seq).mean().item(), kl_to_reference(policy, ref, seq).mean().item()


def grpo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, clip: float = 0.2, beta: float = 0.04, loss_type: str = "bnpo",
              max_completion_length: int = MAX_RESPONSE) -> torch.Tensor:
    """GRPO's loss on ``(batch, T)`` token log-probs: clipped surrogate plus ``beta`` k3-KL per token, aggregated.

    The k3 term is differentiated through, as in DeepSeekMath's eq. 3 ("KL in the
    loss"): in expectation it pulls towards the reference along the gradient of
    ``KL(pi_ref || pi)``, not of the ``KL(pi || pi_ref)`` it estimates.

    ``advantages`` is ``(batch,)``, one per response, shared by its tokens.
    ``loss_type`` says how the per-token losses are reduced
    (:func:`utils.rl.grpo_variants.aggregate_token_loss`, TRL's names). The
    default ``"bnpo"`` is the mean over all real tokens of the batch (a
    token-level mean, as DAPO, arXiv:2503.14476, section 3.3); ``"grpo"`` is the
    paper's per-response mean, ``"dr_grpo"`` divides the sum by
    ``batch * max_completion_length``.
    """
    check_nonnegative("beta", beta)
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    mask = mask.bool()
    adv = advantages[:, None].expand_as(logp_new)
    if loss_type == "bnpo":  # the token mean, computed as it always was (stored notebooks rely on its digits)
        policy_term = ppo_clip_loss(logp_new[mask], logp_old[mask], adv[mask], clip=clip)
        return policy_term + beta * kl_estimate(logp_new[mask], logp_ref[mask], "k3").mean()
    # ppo_clip_loss of one token is that token's negated clipped surrogate: map it over every token
    per_token_policy = torch.vmap(lambda n, o, a: ppo_clip_loss(n, o, a, clip=clip))(
        logp_new.reshape(-1, 1), logp_old.reshape(-1, 1), adv.reshape(-1, 1)).reshape(logp_new.shape)
    per_token = per_token_policy + beta * kl_estimate(logp_new, logp_ref, "k3")
    return aggregate_token_loss(torch.where(mask, per_token, 0.0), mask, loss_type, max_completion_length)


def _record_evaluation(policy: nn.Module, ref: nn.Module, eval_problems: list[tuple[int, int]] | None,
                       eval_every: int, seed: int, step: int, history: dict[str, list[float]], reward_key: str,
                       kl_key: str) -> None:
    """Append :func:`evaluate`'s reward and KL at ``step`` to ``history`` when ``step`` is on the evaluation grid."""
    if eval_problems is not None and step % eval_every == 0:
        reward, kl = evaluate(policy, ref, eval_problems, seed=seed + 1)
        history["eval_step"].append(step)
        history[reward_key].append(reward)
        history[kl_key].append(kl)


def train_grpo(policy: nn.Module, ref: nn.Module, problems: list[tuple[int, int]], steps: int,
               prompts_per_step: int = 16, group_size: int = 8, lr: float = 1e-3, beta: float = 0.04,
               clip: float = 0.2, inner_epochs: int = 2, seed: int = 0, scale_rewards: str = "group",
               loss_type: str = "bnpo", reward_fn: Callable[[torch.Tensor], torch.Tensor] = arithmetic_reward,
               eval_problems: list[tuple[int, int]] | None = None, eval_every: int = 25) -> dict[str, list[float]]:
    """GRPO: per step, sample ``group_size`` responses to each of ``prompts_per_step`` problems, then
    take ``inner_epochs`` gradient steps on :func:`grpo_loss`.

    ``scale_rewards`` (:func:`utils.rl.grpo_variants.group_advantages`) and ``loss_type``
    (:func:`grpo_loss`) take TRL's names; the defaults are GRPO's z-scores and the token mean.
    ``reward_fn`` maps ``(batch, SEQ_LEN)`` sequences to ``(batch,)`` rewards.
    Returns per-step ``reward`` (of ``reward_fn``) and ``kl`` (of the step's samples, before the
    update), ``len_right`` / ``len_wrong`` (mean response length of the samples the checker
    :func:`arithmetic_reward` accepts / rejects, NaN if none) and, every ``eval_every`` steps on
    ``eval_problems``, ``eval_step``, ``eval_reward`` and ``eval_kl`` (:func:`evaluate`, checker's accuracy).
    """
    for name, value in (("steps", steps), ("prompts_per_step", prompts_per_step), ("group_size", group_size),
                        ("inner_epochs", inner_epochs), ("eval_every", eval_every)):
        check_positive_int(name, value)
    check_positive("lr", lr)
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    group_advantages(torch.zeros(group_size), group_size, scale_rewards)  # validates scale_rewards
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=lr)
    g = torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {"reward": [], "kl": [], "len_right": [], "len_wrong": [], "eval_step": [],
                                       "eval_reward": [], "eval_kl": []}

    def evaluate_every(step: int) -> None:
        _record_evaluation(policy, ref, eval_problems, eval_every, seed, step, history, "eval_reward", "eval_kl")

    for step in progress(range(steps), "GRPO", mininterval=5):
        evaluate_every(step)
        picks = torch.randint(len(problems), (prompts_per_step,), generator=g).tolist()
        prompts = prompt_tokens([problems[i] for i in picks]).repeat_interleave(group_size, 0)
        seq, logp_old = sample(policy, prompts, generator=g)
        rewards = reward_fn(seq)
        if scale_rewards == "group":
            advantages = grpo_advantages(rewards, group_size)
        else:
            advantages = group_advantages(rewards, group_size, scale_rewards)
        mask = response_mask(seq)
        with torch.no_grad():
            logp_ref = token_logprobs(ref, seq)
            history["kl"].append(kl_to_reference(policy, ref, seq).mean().item())
        history["reward"].append(rewards.float().mean().item())
        len_right, len_wrong = lengths_by_correctness(seq)
        history["len_right"].append(len_right)
        history["len_wrong"].append(len_wrong)
        for _ in range(inner_epochs):
            loss = grpo_loss(token_logprobs(policy, seq), logp_old, logp_ref, advantages, mask, clip, beta,
                             loss_type=loss_type)
            opt.zero_grad()
            loss.backward()
            opt.step()
    evaluate_every(steps)
    return history


def lengths_by_correctness(sequences: torch.Tensor) -> tuple[float, float]:
    """``(mean length of right responses, mean length of wrong ones)`` in tokens, end mark included;
    right and wrong as :func:`arithmetic_reward` says; NaN where there is none."""
    lengths = response_mask(sequences).sum(-1).float()
    right = arithmetic_reward(sequences) == 1
    mean = lambda sel: lengths[sel].mean().item() if sel.any() else float("nan")  # noqa: E731
    return mean(right), mean(~right)


@torch.no_grad()
def preference_pairs(model: nn.Module, problems: list[tuple[int, int]], samples_per_problem: int = 8,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen, rejected)`` sequences sampled from ``model``: for each problem whose samples hold both
    correct and wrong responses (rewards from :func:`arithmetic_reward`), every distinct wrong response is
    rejected once, against a correct sample."""
    check_positive_int("samples_per_problem", samples_per_problem)
    g = torch.Generator().manual_seed(seed)
    seq, _ = sample(model, prompt_tokens(problems).repeat_interleave(samples_per_problem, 0), generator=g)
    rewards = arithmetic_reward(seq).view(len(problems), samples_per_problem)
    seq = seq.view(len(problems), samples_per_problem, -1)
    chosen, rejected = [], []
    for i in range(len(problems)):
        good = (rewards[i] == 1).nonzero().flatten().tolist()
        seen = set()
        for j in (rewards[i] == 0).nonzero().flatten().tolist():
            if good and tuple(seq[i, j].tolist()) not in seen:
                seen.add(tuple(seq[i, j].tolist()))
                chosen.append(seq[i, good[len(seen) % len(good)]])
                rejected.append(seq[i, j])
    if not chosen:
        raise ValueError("no problem had both a correct and a wrong sample; sample more per problem")
    return torch.stack(chosen), torch.stack(rejected)


def train_dpo(policy: nn.Module, ref: nn.Module, chosen: torch.Tensor, rejected: torch.Tensor, steps: int,
              beta: float = 0.1, lr: float = 1e-3, batch_size: int = 32, seed: int = 0,
              eval_problems: list[tuple[int, int]] | None = None, eval_every: int = 10) -> dict[str, list[float]]:
    """DPO on preference pairs. Returns per-step ``loss`` and ``margin`` (the implicit reward margin
    ``beta [(log pi - log pi_ref)(y_w) - (log pi - log pi_ref)(y_l)]``, batch mean) and, every
    ``eval_every`` steps on ``eval_problems``, ``eval_step``, ``reward`` and ``kl`` (:func:`evaluate`)."""
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    check_positive("lr", lr)
    if chosen.shape != rejected.shape:
        raise ValueError(f"chosen and rejected must have the same shape, got {tuple(chosen.shape)} "
                         f"and {tuple(rejected.shape)}")
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=lr)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        ref_c, ref_r = sequence_logprob(ref, chosen), sequence_logprob(ref, rejected)
    history: dict[str, list[float]] = {"loss": [], "margin": [], "eval_step": [], "reward": [], "kl": []}

    def evaluate_every(step: int) -> None:
        _record_evaluation(policy, ref, eval_problems, eval_every, seed, step, history, "reward", "kl")

    for step in progress(range(steps), "DPO", mininterval=5):
        evaluate_every(step)
        idx = torch.randint(len(chosen), (batch_size,), generator=g)
        pc, pr = sequence_logprob(policy, chosen[idx]), sequence_logprob(policy, rejected[idx])
        loss = dpo_loss(pc, pr, ref_c[idx], ref_r[idx], beta=beta)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history["loss"].append(loss.item())
        history["margin"].append(beta * ((pc - ref_c[idx]) - (pr - ref_r[idx])).mean().item())
    evaluate_every(steps)  # the trained policy too, when steps falls on the evaluation grid
    return history


def expert_iteration(policy: nn.Module, ref: nn.Module, problems: list[tuple[int, int]], rounds: int,
                     samples_per_problem: int = 8, steps: int = 50, lr: float = 1e-3, batch_size: int = 64,
                     seed: int = 0, eval_problems: list[tuple[int, int]] | None = None) -> dict[str, list[float]]:
    """Expert iteration: ``rounds`` times, sample ``samples_per_problem`` answers to each problem from the
    current ``policy``, keep those :func:`arithmetic_reward` accepts, and fine-tune on them with SFT's loss
    (:func:`utils.rl.tiny_lm.train_lm`, ``response_only=True``, ``steps`` AdamW steps).

    One round is rejection-sampling fine-tuning (Llama 2, arXiv:2307.09288, section 3.2.3, with a
    reward model in place of the checker); repeated on the model's own accepted samples it is STaR
    (arXiv:2203.14465) or ReST's grow/improve loop (arXiv:2308.08998). Every accepted sample is kept,
    duplicates included, so a problem weighs by how often it is solved. Returns per round
    ``round``, ``accepted`` (samples kept) and, on ``eval_problems``, ``reward`` and ``kl`` (:func:`evaluate`).
    """
    for name, value in (("rounds", rounds), ("samples_per_problem", samples_per_problem), ("steps", steps)):
        check_positive_int(name, value)
    history: dict[str, list[float]] = {"round": [], "accepted": [], "reward": [], "kl": []}
    for k in range(rounds):
        g = torch.Generator().manual_seed(seed * 1000 + k)
        with torch.no_grad():
            seq, _ = sample(policy, prompt_tokens(problems).repeat_interleave(samples_per_problem, 0), generator=g)
        accepted = seq[arithmetic_reward(seq) == 1]
        if len(accepted) == 0:
            raise ValueError("the checker accepted no sample; sample more per problem")
        train_lm(policy, accepted, steps=steps, lr=lr, batch_size=batch_size, response_only=True,
                 seed=seed * 1000 + k, desc=f"expert iteration, round {k + 1}")
        history["round"].append(k + 1)
        history["accepted"].append(len(accepted))
        if eval_problems is not None:
            reward, kl = evaluate(policy, ref, eval_problems, seed=seed + 1)
            history["reward"].append(reward)
            history["kl"].append(kl)
    return history


def plot_reward_and_kl(steps, reward, kl, title: str = "", ref_reward: float | None = None) -> Figure:
    """Two panels: the mean reward and ``KL(pi || pi_ref)`` against the training step."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3))
    ax1.plot(steps, reward, color="tab:green")
    if ref_reward is not None:
        ax1.axhline(ref_reward, color="gray", ls=":", label="reference policy")
        ax1.legend(loc="lower right")
    ax1.set(xlabel="step", ylabel="mean reward (accuracy)", ylim=(0, 1.02))
    ax2.plot(steps, kl, color="tab:purple")
    ax2.set(xlabel="step", ylabel=r"KL($\pi$ || $\pi_{ref}$), nats")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def answer_distribution(model: nn.Module, problem: tuple[int, int], samples: int = 200, seed: int = 0) -> dict:
    """``{response: count}`` of ``samples`` temperature-1 responses to one problem, most common first.

    The samples share their prefixes' forwards (:func:`~utils.rl.tiny_lm.sample`'s ``share_prefixes``).
    """
    check_positive_int("samples", samples)
    seq, _ = sample(model, prompt_tokens([problem] * samples), generator=torch.Generator().manual_seed(seed),
                    share_prefixes=True)
    counts: dict[str, int] = {}
    for row in seq:
        text = decode(row[PROMPT_LEN:])
        counts[text] = counts.get(text, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def plot_answer_distributions(distributions: dict[str, dict[str, int]], correct: str, title: str = "") -> Figure:
    """Grouped bars: for each model (key), the share of samples giving each response; the correct one in green."""
    share = {a: sum(d.get(a, 0) / sum(d.values()) for d in distributions.values())
             for d in distributions.values() for a in d}
    answers = sorted(share, key=lambda a: (a != correct, -share[a], a))[:8]
    fig, ax = plt.subplots(figsize=(7, 2.8))
    width = 0.8 / len(distributions)
    for i, (name, counts) in enumerate(distributions.items()):
        total = sum(counts.values())
        ax.bar([j + i * width for j in range(len(answers))], [counts.get(a, 0) / total for a in answers],
               width=width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(answers))], [repr(a) for a in answers])
    ax.get_xticklabels()[0].set_color("tab:green")
    ax.set(ylabel="share of samples", title=title, ylim=(0, 1))
    ax.legend()
    fig.tight_layout()
    return fig
