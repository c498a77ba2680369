"""A plug-in policy loss in one file that reads other responses' log-probs (a group statistic of the current
policy), so it declares ``couples_rows``: the trainer then splits a minibatch into micro-batches by two passes
(:func:`training.update.minibatch_step`), exact too. Used by tests/training/test_micro_batches.py."""
import torch

from training.algorithms import agg_loss, register_policy_loss


@register_policy_loss("toy_group_centred", couples_rows="each response's log-ratio is centred on its group's mean")
def toy_group_centred(logprobs, batch, advantages, loss_agg_mode: str = "seq-mean-token-mean"):
    """A plug-in policy loss that reads other responses' log-probs: per response i, c_i = s_i - mean_{j in group(i)}
    s_j with s_i = mean_t (log pi - log pi_old), and loss = agg(-A_i c_i) over its tokens. The group mean couples the
    rows of a group, so it declares ``couples_rows`` and the trainer splits it into micro-batches by two passes.
    ``logprobs`` (B, L) with gradient; returns (loss, metrics)."""
    mask = batch.response_mask.to(logprobs.dtype)
    s = ((logprobs - batch.old_logprobs) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    groups, inverse = torch.unique(batch.group_index, return_inverse=True)
    sums = torch.zeros(len(groups), dtype=s.dtype, device=s.device).index_add(0, inverse, s)
    counts = torch.zeros(len(groups), dtype=s.dtype, device=s.device).index_add(0, inverse, torch.ones_like(s))
    c = s - (sums / counts)[inverse]
    adv = advantages if advantages.dim() == 1 else (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    loss = agg_loss((-adv * c).unsqueeze(-1).expand_as(logprobs), batch.response_mask, loss_agg_mode)
    return loss, {"centred_abs_mean": float(c.detach().abs().mean()) if c.numel() else 0.0}
