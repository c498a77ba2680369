"""KL penalty to the reference policy."""
from __future__ import annotations

import torch


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, clamp: float = 10.0) -> torch.Tensor:
    """Per-token k3 ("low-var") KL estimator of KL(pi_theta || pi_ref).

    k3 = exp(ref - logp) - (ref - logp) - 1, non-negative, unbiased for samples drawn from
    pi_theta (Schulman, "Approximating KL divergence", 2020; used by GRPO, Shao et al. 2024, eq. 4).

    Args:
        logprobs: (B, L) log pi_theta of the sampled tokens (with gradient).
        ref_logprobs: (B, L) log pi_ref of the same tokens (no gradient needed).
        clamp: the log-ratio is clamped to [-clamp, clamp] before exponentiation, as verl does,
            so a single outlier token cannot overflow.
    Returns:
        (B, L) per-token KL estimate; aggregate it with ``aggregation.agg_loss``.
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-clamp, clamp)
    return torch.exp(log_ratio) - log_ratio - 1.0
