"""A rollout batch's policy update: ``ppo_epochs`` passes over the batch in shuffled minibatches, one optimiser step
per minibatch, each minibatch run through the policy in micro-batches under a token budget with exact gradient
accumulation.

Read top to bottom: :class:`UpdateSettings` (what the config decides), :func:`policy_objective` (the loss of one
batch of rows, with the policy loss bound once to its parameters: :class:`training.algorithms.BoundLoss`),
:func:`update_policy` (epochs and minibatches), :class:`Updater` and :func:`minibatch_step` (one optimiser step: the
micro-batches, their accumulated gradient, the step, the minibatch's metrics).

Exactness: every normaliser a loss divides by (token count, response count, Dr. GRPO's constant) is counted over the
whole minibatch before it is split (:func:`training.algorithms.aggregation.over_minibatch`), so the micro-batches'
gradients add up to the one-pass gradient for every registered loss, with the KL and entropy terms and the rollout
correction's weights (:mod:`training.corrections`; a loss that couples responses otherwise declares it and takes the
two-pass route, :func:`training.algorithms.registry.register_policy_loss`). The minibatch's metrics (loss terms,
clip fractions, ratios, the gradient norm) are the whole minibatch's, not a mean of micro-batch values.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from core.scoring import Scorer, Sequences
from training.algorithms import BoundLoss, agg_loss, kl_k3
from training.algorithms.aggregation import Normalisers, over_minibatch, token_weights
from training.corrections import correct


@dataclass(frozen=True)
class UpdateSettings:
    """The update's settings (``train.*`` and ``algo.*`` keys; :meth:`from_config`).

    Attributes:
        ppo_epochs: passes over the rollout batch (``train.ppo_epochs``).
        minibatch_size: responses per optimiser step (``train.minibatch_size``; None: the whole batch).
        max_grad_norm: gradient clipping (``train.max_grad_norm``).
        beta: k3 KL coefficient to the reference policy (``algo.kl_beta``).
        entropy_coef: entropy bonus (``algo.entropy_coef``; GRPO-H).
        temperature: the sampling temperature the logits are divided by (``train.temperature``).
        bf16: bf16 autocast (``train.precision=bf16``).
        align_old: recompute the old log-probs minibatch by minibatch on the update's own path before the first
            update (default: with bf16, whose results depend on the batch shape).
        deferred_old: the rollout computed no old log-probs; the update fills them (and the rollout policy's
            entropies) the same way.
        correction, correction_cap, correction_lower: the rollout correction (:mod:`training.corrections`) and its
            thresholds C and lower (None: 1 / C) (``train.rollout.correction*``).
        norm_constant: ``seq-mean-token-sum-norm``'s constant where the loss sets none: the configured maximum
            response length (``train.max_new_tokens``).
        couples_rows: the policy loss reads other responses' log-probs (:func:`training.algorithms.couples_rows`):
            two passes per split minibatch.
    """

    ppo_epochs: int = 1
    minibatch_size: int | None = None
    max_grad_norm: float = 1.0
    beta: float = 0.0
    entropy_coef: float = 0.0
    temperature: float = 1.0
    bf16: bool = False
    align_old: bool | None = None
    deferred_old: bool = False
    correction: str = "none"
    correction_cap: float = 2.0
    correction_lower: float | None = None
    norm_constant: float | None = None
    couples_rows: bool = False

    @classmethod
    def from_config(cls, cfg, deferred_old: bool) -> "UpdateSettings":
        """The settings of a composed run config."""
        from training.algorithms import couples_rows
        from training.settings import RunSettings

        t, conf = cfg.train, RunSettings.of(cfg)
        mb = t.minibatch_size
        lower = conf.rollout.correction_lower
        return cls(ppo_epochs=int(t.ppo_epochs), minibatch_size=None if mb is None else int(mb),
                   max_grad_norm=float(t.max_grad_norm), beta=float(conf.terms.kl_beta),
                   entropy_coef=float(conf.terms.entropy_coef), temperature=float(t.temperature),
                   # the ratio's denominator is the behaviour policy's, never recomputed on the update's path
                   align_old=False if conf.rollout.old_policy == "behaviour" else None,
                   bf16=conf.bf16, deferred_old=deferred_old, correction=conf.rollout.correction,
                   correction_cap=float(conf.rollout.correction_cap),
                   correction_lower=None if lower is None else float(lower), norm_constant=float(t.max_new_tokens),
                   couples_rows=couples_rows(str(cfg.algo.policy_loss.name)) is not None)

    @property
    def aligned(self) -> bool:
        """Whether the old log-probs are (re)computed on the update's own path before the first update."""
        return bool(self.bf16 if self.align_old is None else self.align_old) or self.deferred_old


def policy_objective(logprobs, entropy, batch, advantages, loss: BoundLoss, beta: float = 0.0,
                     entropy_coef: float = 0.0, weights=None):
    """The loss one optimiser step minimises (the verl engine's adapter is tested against this).

    loss = policy_loss(logprobs, batch, advantages) + beta * agg(k3 KL to the reference)
           - entropy_coef * agg(entropy),
    both extra terms aggregated with the policy loss's own ``loss_agg_mode`` (and ``norm_constant``), as verl does.

    Args:
        logprobs: (B, L) log pi_theta of the sampled tokens (with gradient); entropy: (B, L) or None
            (needed when entropy_coef > 0); batch: the minibatch (``ref_logprobs`` when beta > 0);
        advantages: (B,) or (B, L).
        loss: the policy loss and its parameters (:class:`training.algorithms.BoundLoss`).
        weights: (B, L) per-token weights of the policy loss's terms, applied inside its aggregation
            (:func:`training.algorithms.aggregation.token_weights`); or a rollout correction
            (:class:`training.corrections.Correction`): its ``weights * keep`` on the policy loss's terms and its
            ``keep`` (0 on the tokens it rejected) on the KL and entropy terms, so a rejected token adds nothing to
            any term (the denominators unchanged); None: none.
    Returns:
        (loss, policy loss term, metrics dict). Inside
        :func:`~training.algorithms.aggregation.over_minibatch` every term is its share of the minibatch's.
    """
    agg_mode, norm = loss.agg_mode, loss.norm_constant
    keep = None
    if weights is not None and not isinstance(weights, torch.Tensor):  # a Correction
        weights, keep = weights.weights * weights.keep, weights.keep
    with token_weights(weights):
        pg_loss, m = loss(logprobs, batch, advantages)
    loss = pg_loss
    if entropy_coef > 0:
        with token_weights(keep):
            ent = agg_loss(entropy, batch.response_mask, agg_mode, norm)
        loss = loss - entropy_coef * ent
        m["entropy_bonus"] = float(ent.detach())
    if beta > 0:
        with token_weights(keep):
            kl = agg_loss(kl_k3(logprobs, batch.ref_logprobs), batch.response_mask, agg_mode, norm)
        loss = loss + beta * kl
        m["kl_ref"] = float(kl.detach())
    return loss, pg_loss, m


#: the objective's terms a non-finite value is attributed to, in the order they are checked
NONFINITE_TERMS = ("advantage", "policy_loss", "kl", "entropy", "gradient")


def nonfinite_term(advantages: torch.Tensor, mask: torch.Tensor, pg: torch.Tensor, m: dict, grad_norm) -> str | None:
    """The first of :data:`NONFINITE_TERMS` that is not finite in one optimiser step, or None: the advantages on the
    response tokens (``advantages`` (B,) or (B, L), ``mask`` (B, L)), the policy loss ``pg``, the KL term
    (``m["kl_ref"]``), the entropy bonus (``m["entropy_bonus"]``), the gradient norm before clipping."""
    adv = advantages if advantages.dim() == 1 else advantages[mask.bool()]
    if adv.numel() and not bool(torch.isfinite(adv).all()):
        return "advantage"
    if not math.isfinite(float(pg.detach())):
        return "policy_loss"
    if not math.isfinite(m.get("kl_ref", 0.0)):
        return "kl"
    if not math.isfinite(m.get("entropy_bonus", 0.0)):
        return "entropy"
    if not math.isfinite(float(grad_norm)):
        return "gradient"
    return None


@dataclass
class UpdateControl:
    """How :func:`update_policy` is driven, apart from what it updates.

    Attributes:
        generator: the minibatch shuffles' random numbers (None: PyTorch's global generator).
        should_stop: ``() -> bool``, asked after every optimiser step but the last: True stops the update there
            (:class:`UpdateStopped`), a stop request honoured within one minibatch.
        start, done_metrics: continue a stopped update (the same batch, whose old log-probs it filled, and the
            same ``generator`` seed): the first ``start`` optimiser steps are done, ``done_metrics`` their metrics.
    """

    generator: torch.Generator | None = None
    should_stop: object = None
    start: int = 0
    done_metrics: list | None = None


@dataclass(frozen=True)
class Updater:
    """The trainer's side of an update, fixed for its minibatches: the ``model``, its ``optimizer``, the bound policy
    ``loss`` (:class:`training.algorithms.BoundLoss`), the update's ``settings`` and the ``scorer`` whose passes it
    runs (:class:`core.scoring.Scorer`)."""

    model: torch.nn.Module
    optimizer: object
    loss: BoundLoss
    settings: UpdateSettings
    scorer: Scorer


class UpdateStopped(Exception):
    """A stop request honoured between two optimiser steps of :func:`update_policy`: ``done`` of its minibatch steps
    were taken (the weights and optimiser state are theirs) and ``metrics`` are those steps' metrics; the update
    continues exactly from there with ``start=done, done_metrics=metrics`` on the same batch."""

    def __init__(self, done: int, total: int, metrics: list[dict]):
        super().__init__(f"stopped after {done} of {total} optimiser steps")
        self.done, self.total, self.metrics = done, total, metrics


def update_policy(model, optimizer, batch, advantages, loss: BoundLoss, settings: UpdateSettings = UpdateSettings(),
                  scorer: Scorer | None = None, control: UpdateControl | None = None) -> list[dict]:
    """``settings.ppo_epochs`` passes over ``batch`` in shuffled minibatches, one AdamW step per minibatch
    (:func:`minibatch_step`).

    With ``settings.aligned`` the old log-probabilities are recomputed before the first update, without gradients,
    minibatch by minibatch in the first epoch's order: the same rows, passes and precision path as the updates' own
    forward passes, so the first minibatch's ratio is exactly 1 in bf16 too. The first minibatch needs no such pass:
    before any update its own forward pass *is* the rollout policy, so its old log-probs are that pass's values,
    detached. With ``deferred_old`` the rollout computed no old log-probs at all: they, and the rollout policy's
    entropies (``batch.extras["entropy"]``), are filled here the same way.

    Args:
        batch: RolloutBatch of B responses (with ``ref_logprobs`` when beta > 0);
        advantages: (B,) or (B, L) on the model's device.
        loss: the policy loss bound to its parameters (:class:`training.algorithms.BoundLoss`).
        scorer: the run's passes (token budget and layout, :class:`core.scoring.Scorer`); None: one padded pass per
            minibatch.
        control: the shuffles' generator, the stop check and where a stopped update continues
            (:class:`UpdateControl`; None: a fresh update that never stops early).
    Returns:
        One metrics dict per optimiser step (:func:`minibatch_step`); the first also has
        ``update_old_logprob_time_s``, the seconds of the old-log-prob pass.
    Raises:
        UpdateStopped: ``should_stop`` said so.
    """
    s, scorer, c = settings, scorer or Scorer(), control or UpdateControl()
    up = Updater(model, optimizer, loss, s, scorer)
    B = batch.batch_size
    mb_size = int(s.minibatch_size or B)
    perms = [torch.randperm(B, generator=c.generator).to(advantages.device) for _ in range(s.ppo_epochs)]
    t_old = time.perf_counter()
    if s.aligned and c.start == 0:  # a continued update's batch has them already
        with torch.no_grad():
            for i in range(mb_size, B, mb_size):  # every minibatch but the first, before any update
                idx = perms[0][i:i + mb_size]
                mb = batch.select(idx)
                lp, ent = scorer.score(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                       s.temperature, with_entropy=s.deferred_old, bf16=s.bf16)
                batch.old_logprobs[idx] = lp
                if s.deferred_old:
                    batch.extras["entropy"][idx] = ent
    t_old = time.perf_counter() - t_old
    out = list(c.done_metrics or [])
    steps = [perm[i:i + mb_size] for perm in perms for i in range(0, B, mb_size)]
    for k in range(c.start, len(steps)):
        idx = steps[k]
        out.append(minibatch_step(up, batch, idx, advantages[idx], k == 0))
        if k == 0:
            out[0]["update_old_logprob_time_s"] = t_old
        if c.should_stop is not None and k + 1 < len(steps) and c.should_stop():
            raise UpdateStopped(k + 1, len(steps), out)
    return out


def minibatch_step(up: Updater, batch, idx, advantages, first: bool) -> dict:
    """One optimiser step of ``up`` (:class:`Updater`) on the rows ``idx`` of ``batch`` (``advantages``: theirs, (b,)
    or (b, L)): their micro-batches (``scorer.plan``), each forward and backward with the minibatch's normalisers, so
    the accumulated gradient is the minibatch's; gradient clipping to ``max_grad_norm``; the step.

    With ``first`` and ``s.aligned`` the forward passes (before any update) give the rows' old log-probs (and with
    ``deferred_old`` their entropies), written back to ``batch``.

    Returns:
        The minibatch's metrics: the loss function's (clip fractions, ratios, ...), ``policy_loss``, ``loss``,
        ``kl_ref`` / ``entropy_bonus`` when those terms are on, ``grad_norm``, the rollout correction's
        (``correction_*``, ``tis_*``: :mod:`training.corrections`) with one,
        ``nonfinite_skips`` (1 when a non-finite term skipped the step, :func:`nonfinite_term`; then also
        ``nonfinite_<term>`` = 1), ``micro_batches``, ``update_tokens`` and ``update_padding`` (positions computed and positions without a
        token, over the forward passes), ``update_forward_time_s``, ``update_backward_time_s``; with ``first``,
        ``first_minibatch_ratio_dev`` = max |pi_theta / pi_old - 1| over its tokens before any update.
    """
    model, optimizer, s, scorer = up.model, up.optimizer, up.settings, up.scorer
    mb = batch.select(idx)
    B, L = mb.response_ids.shape
    plan = scorer.plan(mb.prompt_ids, mb.prompt_mask, mb.response_mask)
    set_old = first and s.aligned
    want_entropy = s.entropy_coef > 0 or (set_old and s.deferred_old)
    norms = Normalisers.of(mb.response_mask, s.norm_constant)
    dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    lp_all = torch.zeros((B, L), dtype=dtype, device=mb.response_ids.device)
    ent_all = torch.zeros_like(lp_all) if want_entropy else None
    times = {"forward": 0.0, "backward": 0.0}

    def forward(micro):
        t0 = time.perf_counter()
        lp, ent = scorer.forward(model, micro, Sequences.of(mb), s.temperature, with_entropy=want_entropy, bf16=s.bf16)
        rows = micro.rows.to(lp_all.device)
        lp_all[rows] = lp.detach()
        if want_entropy:
            ent_all[rows] = ent.detach()
        if set_old:  # before any update this pass is the rollout policy: its own old log-probs
            mb.old_logprobs[rows] = lp.detach()
            if s.deferred_old:
                mb.extras["entropy"][rows] = ent.detach()
        times["forward"] += time.perf_counter() - t0
        return rows, lp, ent

    def objective(rows_batch, lp, ent, adv):
        # the rollout correction (training/corrections.py) of the proximal log-probs (the ratio's old policy) against
        # the sampler's: a rejected token weighs 0 in every term; the denominators still count it (its docstring)
        # the sampler's (k = 0), or with staleness the behaviour policy's b (training/engines/local.py::_behaviour)
        corr, b = None, rows_batch.extras.get("behaviour_logprobs", rows_batch.extras.get("rollout_logprobs"))
        if s.correction != "none" and b is not None:
            corr = correct(s.correction, rows_batch.old_logprobs, b, rows_batch.response_mask, cap=s.correction_cap,
                           lower=s.correction_lower)
        loss, pg, m = policy_objective(lp, ent, rows_batch, adv, up.loss, beta=s.beta, entropy_coef=s.entropy_coef,
                                       weights=corr)
        if corr is not None:
            m.update(corr.metrics)
        return loss, pg, m

    optimizer.zero_grad(set_to_none=True)
    if len(plan) > 1:  # the gradients exist from the first pass on, so the first (largest) pass is the step's peak
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    if s.couples_rows and len(plan) > 1:
        loss, pg, m = _coupled_backward(plan, forward, objective, mb, advantages, lp_all, ent_all, times)
    else:
        with over_minibatch(norms):
            for micro in plan:
                rows, lp, ent = forward(micro)
                sub = mb.select(rows)
                loss, pg, m = objective(sub, lp, ent, advantages[rows])
                t0 = time.perf_counter()
                loss.backward()
                times["backward"] += time.perf_counter() - t0
            if len(plan) != 1:  # the whole minibatch's metrics, from the log-probs the passes computed
                with torch.no_grad():
                    loss, pg, m = objective(mb, lp_all, ent_all, advantages)
    if set_old:
        batch.old_logprobs[idx] = mb.old_logprobs
        if s.deferred_old:
            batch.extras["entropy"][idx] = mb.extras["entropy"]
    t0 = time.perf_counter()
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], s.max_grad_norm)
    fault = nonfinite_term(advantages, mb.response_mask, pg, m, grad_norm)
    if fault is None:
        optimizer.step()
    else:  # a non-finite term: the step is skipped, weights and optimiser state untouched (verl and Megatron-LM too)
        m[f"nonfinite_{fault}"] = 1.0
    m["nonfinite_skips"] = float(fault is not None)
    optimizer.zero_grad(set_to_none=True)  # gradients freed until the next step (memory for generation)
    times["backward"] += time.perf_counter() - t0
    m.update(policy_loss=float(pg.detach()), loss=float(loss.detach()), grad_norm=float(grad_norm),
             micro_batches=len(plan), update_tokens=sum(x.tokens for x in plan),
             update_padding=sum(x.padding for x in plan),
             update_forward_time_s=times["forward"], update_backward_time_s=times["backward"])
    if first:  # before any update the ratio must be exactly 1 on every token
        keep = mb.response_mask.bool()
        dev = ((lp_all - mb.old_logprobs).exp() - 1).abs()
        m["first_minibatch_ratio_dev"] = float(dev[keep].max()) if keep.any() else 0.0
    return m


def _coupled_backward(plan, forward, objective, mb, advantages, lp_all, ent_all, times: dict):
    """The backward pass of a loss that reads other responses' log-probs (:func:`training.algorithms.couples_rows`)
    over several micro-batches: the loss's gradient w.r.t. the minibatch's log-probs (and entropies) first, from
    passes without gradients, then back-propagated through each micro-batch's forward pass again. ``forward(micro)``
    -> (rows, log-probs, entropies) fills ``lp_all``/``ent_all`` (B, L); ``objective`` is the minibatch's loss.
    Returns the minibatch's (loss, policy loss, metrics)."""
    want_entropy = ent_all is not None
    with torch.no_grad():
        for micro in plan:
            forward(micro)
    lp_leaf = lp_all.clone().requires_grad_(True)
    ent_leaf = ent_all.clone().requires_grad_(True) if want_entropy else None
    loss, pg, m = objective(mb, lp_leaf, ent_leaf, advantages)
    leaves = [lp_leaf] + ([ent_leaf] if want_entropy else [])
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    for micro in plan:
        rows, lp, ent = forward(micro)
        t0 = time.perf_counter()
        outs = [lp] + ([ent] if want_entropy else [])
        pairs = [(o, g[rows]) for o, g in zip(outs, grads) if g is not None]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        times["backward"] += time.perf_counter() - t0
    return loss, pg, m
