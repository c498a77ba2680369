"""A rollout batch's policy update: ``ppo_epochs`` passes over the batch in shuffled minibatches, one optimiser step
per minibatch, each minibatch run through the policy in micro-batches under a token budget with exact gradient
accumulation.

Read top to bottom: :class:`UpdateSettings` (what the config decides), :func:`policy_objective` (the loss of one
batch of rows, with the policy loss bound once to its parameters: :class:`training.algorithms.BoundLoss`),
:func:`update_policy` (epochs and minibatches), :class:`Updater` and :class:`MinibatchPass` (one optimiser step: the
micro-batches, their accumulated gradient, the step, the minibatch's metrics).

The loss contract: a registered policy loss aggregates every per-token term with
:func:`training.algorithms.agg_loss`; the trainer hands it two things through that one function rather than through
the loss's arguments, so no loss has to know about them: the minibatch's normalisers
(:func:`~training.algorithms.aggregation.over_minibatch`, while a micro-batch runs) and the rollout correction's
per-token weights (:func:`~training.algorithms.aggregation.token_weights`, while the loss is called). Both are context
variables set only here and by the verl adapter, each for the duration of one call.

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
from training.corrections import Correction, correct
from training.settings import OldLogprobs


@dataclass(frozen=True)
class UpdateSettings:
    """The update's settings (``train.*`` and ``algo.*`` keys; :meth:`of`).

    Attributes:
        ppo_epochs: passes over the rollout batch (``train.ppo_epochs``).
        minibatch_size: responses per optimiser step (``train.minibatch_size``; None: the whole batch).
        max_grad_norm: gradient clipping (``train.max_grad_norm``).
        beta: k3 KL coefficient to the reference policy (``algo.kl_beta``).
        entropy_coef: entropy bonus (``algo.entropy_coef``; GRPO-H).
        temperature: the sampling temperature the logits are divided by (``train.temperature``).
        bf16: bf16 autocast (``train.precision=bf16``).
        old_logprobs: the path the old log-probs take (:class:`training.settings.OldLogprobs`): kept as the rollout
            gave them, recomputed on the update's own path before its first optimiser step (ALIGNED), or filled
            there with the rollout policy's entropies (DEFERRED).
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
    old_logprobs: OldLogprobs = OldLogprobs.KEPT
    correction: str = "none"
    correction_cap: float = 2.0
    correction_lower: float | None = None
    norm_constant: float | None = None
    couples_rows: bool = False

    @classmethod
    def of(cls, s) -> "UpdateSettings":
        """The update's settings of a run (:class:`training.settings.RunSettings`)."""
        lower = s.rollout.correction_lower
        return cls(ppo_epochs=s.ppo_epochs, minibatch_size=s.minibatch_size, max_grad_norm=s.max_grad_norm,
                   beta=float(s.terms.kl_beta), entropy_coef=float(s.terms.entropy_coef), temperature=s.temperature,
                   bf16=s.bf16, old_logprobs=s.needs.old_logprobs, correction=s.rollout.correction,
                   correction_cap=float(s.rollout.correction_cap),
                   correction_lower=None if lower is None else float(lower), norm_constant=float(s.max_new_tokens),
                   couples_rows=s.needs.couples_rows)

    @property
    def deferred(self) -> bool:
        """The rollout scored nothing: the update fills the old log-probs and the rollout policy's entropies."""
        return self.old_logprobs is OldLogprobs.DEFERRED


def policy_objective(logprobs, entropy, batch, advantages, loss: BoundLoss, beta: float = 0.0,
                     entropy_coef: float = 0.0, correction: Correction = Correction.none()):
    """The loss one optimiser step minimises (the verl engine's adapter is tested against this).

    loss = policy_loss(logprobs, batch, advantages) + beta * agg(k3 KL to the reference)
           - entropy_coef * agg(entropy),
    both extra terms aggregated with the policy loss's own ``loss_agg_mode`` (and ``norm_constant``), as verl does.

    Args:
        logprobs: (B, L) log pi_theta of the sampled tokens (with gradient); entropy: (B, L) or None
            (needed when entropy_coef > 0); batch: the minibatch (``ref_logprobs`` when beta > 0);
        advantages: (B,) or (B, L).
        loss: the policy loss and its parameters (:class:`training.algorithms.BoundLoss`).
        correction: the rollout correction (:class:`training.corrections.Correction`; :meth:`Correction.none`: none):
            its ``weights * keep`` on the policy loss's terms and its ``keep`` (0 on the tokens it rejected) on the KL
            and entropy terms, so a rejected token adds nothing to any term (the denominators unchanged); the weights
            enter through the one aggregation every loss shares (the loss contract, module docstring).
    Returns:
        (loss, policy loss term, metrics dict). Inside
        :func:`~training.algorithms.aggregation.over_minibatch` every term is its share of the minibatch's.
    """
    agg_mode, norm = loss.agg_mode, loss.norm_constant
    keep = correction.keep
    with token_weights(correction.loss_weights):
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
    (:class:`MinibatchPass`).

    When ``settings.old_logprobs`` is recomputed (ALIGNED or DEFERRED) the old log-probabilities are computed before
    the first update, without gradients, minibatch by minibatch in the first epoch's order: the same rows, passes and
    precision path as the updates' own forward passes, so the first minibatch's ratio is exactly 1 in bf16 too. The
    first minibatch needs no such pass: before any update its own forward pass *is* the rollout policy, so its old
    log-probs are that pass's values, detached. DEFERRED: the rollout computed no old log-probs at all: they, and the
    rollout policy's entropies (``batch.entropy``), are filled here the same way.

    Args:
        batch: RolloutBatch of B responses (with ``ref_logprobs`` when beta > 0);
        advantages: (B,) or (B, L) on the model's device.
        loss: the policy loss bound to its parameters (:class:`training.algorithms.BoundLoss`).
        scorer: the run's passes (token budget and layout, :class:`core.scoring.Scorer`); None: one padded pass per
            minibatch.
        control: the shuffles' generator, the stop check and where a stopped update continues
            (:class:`UpdateControl`; None: a fresh update that never stops early).
    Returns:
        One metrics dict per optimiser step (:meth:`MinibatchPass.run`); the first also has
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
    if s.old_logprobs.recomputed and c.start == 0:  # a continued update's batch has them already
        with torch.no_grad():
            for i in range(mb_size, B, mb_size):  # every minibatch but the first, before any update
                idx = perms[0][i:i + mb_size]
                mb = batch.select(idx)
                lp, ent = scorer.score(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                       s.temperature, with_entropy=s.deferred, bf16=s.bf16)
                batch.old_logprobs[idx] = lp
                if s.deferred:
                    batch.entropy[idx] = ent
    t_old = time.perf_counter() - t_old
    out = list(c.done_metrics or [])
    steps = [perm[i:i + mb_size] for perm in perms for i in range(0, B, mb_size)]
    for k in range(c.start, len(steps)):
        idx = steps[k]
        out.append(MinibatchPass(up, batch, idx, advantages[idx], k == 0).run())
        if k == 0:
            out[0]["update_old_logprob_time_s"] = t_old
        if c.should_stop is not None and k + 1 < len(steps) and c.should_stop():
            raise UpdateStopped(k + 1, len(steps), out)
    return out


def minibatch_step(up: Updater, batch, idx, advantages, first: bool) -> dict:
    """One optimiser step of ``up`` on the rows ``idx`` of ``batch``: :meth:`MinibatchPass.run`."""
    return MinibatchPass(up, batch, idx, advantages, first).run()


class MinibatchPass:
    """One optimiser step of ``up`` (:class:`Updater`) on the rows ``idx`` of ``batch`` (``advantages``: theirs, (b,)
    or (b, L)): their micro-batches (``scorer.plan``), each forward and backward with the minibatch's normalisers, so
    the accumulated gradient is the minibatch's; gradient clipping to ``max_grad_norm``; the step (:meth:`run`).

    With ``first`` and recomputed old log-probs the forward passes (before any update) give the rows' old log-probs
    (DEFERRED: also their entropies), written back to ``batch``. ``lp_all`` and ``ent_all`` (b, L) collect the passes'
    log-probs and entropies (detached), for the whole minibatch's metrics; ``times`` their forward and backward
    seconds."""

    def __init__(self, up: Updater, batch, idx, advantages, first: bool):
        self.up, self.s, self.batch, self.idx, self.advantages, self.first = up, up.settings, batch, idx, advantages, first
        self.mb = batch.select(idx)
        B, L = self.mb.response_ids.shape
        self.set_old = first and self.s.old_logprobs.recomputed
        self.want_entropy = self.s.entropy_coef > 0 or (self.set_old and self.s.deferred)
        dtype = torch.float64 if next(up.model.parameters()).dtype == torch.float64 else torch.float32
        self.lp_all = torch.zeros((B, L), dtype=dtype, device=self.mb.response_ids.device)
        self.ent_all = torch.zeros_like(self.lp_all) if self.want_entropy else None
        self.times = {"forward": 0.0, "backward": 0.0}

    def forward(self, micro):
        """One micro-batch's forward pass: (its rows in the minibatch, log-probs (r, L), entropies or None), the
        detached values kept in ``lp_all``/``ent_all`` (and, on the first minibatch of a recomputing update, as the
        rows' old log-probs and entropies)."""
        s, mb = self.s, self.mb
        t0 = time.perf_counter()
        lp, ent = self.up.scorer.forward(self.up.model, micro, Sequences.of(mb), s.temperature,
                                         with_entropy=self.want_entropy, bf16=s.bf16)
        rows = micro.rows.to(self.lp_all.device)
        self.lp_all[rows] = lp.detach()
        if self.want_entropy:
            self.ent_all[rows] = ent.detach()
        if self.set_old:  # before any update this pass is the rollout policy: its own old log-probs
            mb.old_logprobs[rows] = lp.detach()
            if s.deferred:
                mb.entropy[rows] = ent.detach()
        self.times["forward"] += time.perf_counter() - t0
        return rows, lp, ent

    def objective(self, rows_batch, lp, ent, adv):
        """The loss of ``rows_batch`` (:func:`policy_objective`) with the rollout correction
        (:mod:`training.corrections`) of the proximal log-probs (the ratio's old policy) against the sampler's
        (k = 0), or with staleness the behaviour policy's b: a rejected token weighs 0 in every term; the
        denominators still count it. Returns (loss, policy loss term, metrics)."""
        s = self.s
        b = rows_batch.behaviour_logprobs if rows_batch.behaviour_logprobs is not None else rows_batch.rollout_logprobs
        corr = Correction.none()
        if s.correction != "none" and b is not None:
            corr = correct(s.correction, rows_batch.old_logprobs, b, rows_batch.response_mask, cap=s.correction_cap,
                           lower=s.correction_lower)
        loss, pg, m = policy_objective(lp, ent, rows_batch, adv, self.up.loss, beta=s.beta,
                                       entropy_coef=s.entropy_coef, correction=corr)
        m.update(corr.metrics)
        return loss, pg, m

    def accumulate(self, plan):
        """Each micro-batch forward and backward inside the minibatch's normalisers; the whole minibatch's (loss,
        policy loss, metrics), from the log-probs the passes computed when there was more than one."""
        mb, advantages = self.mb, self.advantages
        with over_minibatch(Normalisers.of(mb.response_mask, self.s.norm_constant)):
            for micro in plan:
                rows, lp, ent = self.forward(micro)
                loss, pg, m = self.objective(mb.select(rows), lp, ent, advantages[rows])
                t0 = time.perf_counter()
                loss.backward()
                self.times["backward"] += time.perf_counter() - t0
            if len(plan) != 1:  # the whole minibatch's metrics, from the log-probs the passes computed
                with torch.no_grad():
                    loss, pg, m = self.objective(mb, self.lp_all, self.ent_all, advantages)
        return loss, pg, m

    def coupled(self, plan):
        """The backward pass of a loss that reads other responses' log-probs (:func:`training.algorithms.couples_rows`)
        over several micro-batches: the loss's gradient w.r.t. the minibatch's log-probs (and entropies) first, from
        passes without gradients, then back-propagated through each micro-batch's forward pass again. Returns the
        minibatch's (loss, policy loss, metrics)."""
        want_entropy = self.ent_all is not None
        with torch.no_grad():
            for micro in plan:
                self.forward(micro)
        lp_leaf = self.lp_all.clone().requires_grad_(True)
        ent_leaf = self.ent_all.clone().requires_grad_(True) if want_entropy else None
        loss, pg, m = self.objective(self.mb, lp_leaf, ent_leaf, self.advantages)
        leaves = [lp_leaf] + ([ent_leaf] if want_entropy else [])
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        for micro in plan:
            rows, lp, ent = self.forward(micro)
            t0 = time.perf_counter()
            outs = [lp] + ([ent] if want_entropy else [])
            pairs = [(o, g[rows]) for o, g in zip(outs, grads) if g is not None]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            self.times["backward"] += time.perf_counter() - t0
        return loss, pg, m

    def run(self) -> dict:
        """The optimiser step. Returns the minibatch's metrics: the loss function's (clip fractions, ratios, ...),
        ``policy_loss``, ``loss``, ``kl_ref`` / ``entropy_bonus`` when those terms are on, ``grad_norm``, the rollout
        correction's (``correction_*``, ``tis_*``: :mod:`training.corrections`) with one, ``nonfinite_skips`` (1 when
        a non-finite term skipped the step, :func:`nonfinite_term`; then also ``nonfinite_<term>`` = 1),
        ``micro_batches``, ``update_tokens`` and ``update_padding`` (positions computed and positions without a token,
        over the forward passes), ``update_forward_time_s``, ``update_backward_time_s``; on the first minibatch,
        ``first_minibatch_ratio_dev`` = max |pi_theta / pi_old - 1| over its tokens before any update."""
        up, s, mb = self.up, self.s, self.mb
        model, optimizer = up.model, up.optimizer
        plan = up.scorer.plan(mb.prompt_ids, mb.prompt_mask, mb.response_mask)
        optimizer.zero_grad(set_to_none=True)
        if len(plan) > 1:  # the gradients exist from the first pass on, so the first (largest) pass is the step's peak
            for p in model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        loss, pg, m = (self.coupled if s.couples_rows and len(plan) > 1 else self.accumulate)(plan)
        if self.set_old:
            self.batch.old_logprobs[self.idx] = mb.old_logprobs
            if s.deferred:
                self.batch.entropy[self.idx] = mb.entropy
        t0 = time.perf_counter()
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], s.max_grad_norm)
        fault = nonfinite_term(self.advantages, mb.response_mask, pg, m, grad_norm)
        if fault is None:
            optimizer.step()
        else:  # a non-finite term: the step is skipped, weights and optimiser state untouched (verl and Megatron-LM too)
            m[f"nonfinite_{fault}"] = 1.0
        m["nonfinite_skips"] = float(fault is not None)
        optimizer.zero_grad(set_to_none=True)  # gradients freed until the next step (memory for generation)
        self.times["backward"] += time.perf_counter() - t0
        m.update(policy_loss=float(pg.detach()), loss=float(loss.detach()), grad_norm=float(grad_norm),
                 micro_batches=len(plan), update_tokens=sum(x.tokens for x in plan),
                 update_padding=sum(x.padding for x in plan),
                 update_forward_time_s=self.times["forward"], update_backward_time_s=self.times["backward"])
        if self.first:  # before any update the ratio must be exactly 1 on every token
            keep = mb.response_mask.bool()
            dev = ((self.lp_all - mb.old_logprobs).exp() - 1).abs()
            m["first_minibatch_ratio_dev"] = float(dev[keep].max()) if keep.any() else 0.0
        return m
