"""Sampling responses from a policy: samplers registered by name behind one protocol, one concept per file.

- ``protocol.py``: what a sampler returns and takes, its registry (:data:`SAMPLERS`, filled by the folder scan that
  finds tasks, algorithms and engines), ``auto``; ``generate.py``: the low-level transformers call and prompt
  rendering; ``hf.py`` and ``vllm.py``: the two samplers; ``rollout.py``: training rollouts from a policy in memory
  and the speed model that chooses between them.

- ``generate_responses`` is the low-level transformers call that training rollouts use too.
- :class:`HFSampler` (``hf``): transformers ``generate`` on the model's device (a GPU when present).
- :class:`VLLMSampler` (``vllm``): vLLM's offline engine on a checkpoint folder (GPU, or vLLM's CPU
  build on a CPU machine).
- ``auto`` (:func:`resolve_sampler`): the available sampler with the highest ``auto_rank`` on this
  machine: vLLM when it is installed and a CUDA device is visible, else transformers.

Every sampler fills ``mean_token_entropy`` with the exact entropy of the full next-token distribution at the
sampling temperature, when asked. The transformers sampler takes it from the logits ``generate`` computed while
sampling, when a call's logits fit :data:`ENTROPY_LOGITS_BUDGET` (else, and for vLLM, which returns only top-k
log-probs, from a teacher-forced pass of the sampled tokens through the transformers model,
:func:`core.scoring.mean_token_entropies`, output head in chunks). The two agree to float rounding (tested); the
run's ``rlvr.entropy_method`` tag says which was used.
"""
from ..generation import Generation, response_mask_from_ids  # noqa: F401  (the samplers' return type, re-exported)
from .generate import entropy_temperature, generate_responses, prompt_texts  # noqa: F401
from .hf import HFSampler  # noqa: F401  (registers hf)
from .interface import (  # noqa: F401
                       ENTROPY_LOGITS_BUDGET,
                       ENTROPY_METHOD,
                       GENERATION_ENTROPY_METHOD,
                       SAMPLERS,
                       VLLM_ENTROPY_METHOD,
                       Sample,
                       Sampler,
                       SamplerOptions,
                       SamplerSpec,
                       SamplingSettings,
                       build_sampler,
                       register_sampler,
                       resolve_sampler,
                       tool_samplers,
)
from .rollout import (  # noqa: F401
                       ROLLOUT_SPEED,
                       HFRollout,
                       RolloutOptions,
                       RolloutPlan,
                       RolloutSampler,
                       VLLMRollout,
                       build_rollout,
                       choose_rollout_sampler,
                       concat_generations,
)
from .vllm import VLLMSampler, vllm_engine_defaults  # noqa: F401  (registers vllm)
