"""verl's checkpoints: the steps verl saved (``global_step_N``), rewinding a resumed run to what this run logged, and
the export of a step's actor as a Hugging Face folder (merging a LoRA adapter when the run trained one) that the
evaluation stage reads."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


def latest_verl_step(ckpt_root: Path) -> Path | None:
    """The newest ``global_step_N`` folder under verl's ``default_local_dir`` (None when there is none)."""
    ckpt_root = Path(ckpt_root)
    marker = ckpt_root / "latest_checkpointed_iteration.txt"
    if marker.is_file():
        step_dir = ckpt_root / f"global_step_{int(marker.read_text().strip())}"
        if step_dir.is_dir():
            return step_dir
    steps = sorted(ckpt_root.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    return steps[-1] if steps else None


def checkpointed_steps(ckpt_root: Path) -> int:
    """How many training steps verl's last complete checkpoint under ``ckpt_root`` holds (its
    ``latest_checkpointed_iteration.txt``, written after the checkpoint itself); 0 when there is none."""
    marker = Path(ckpt_root) / "latest_checkpointed_iteration.txt"
    try:
        return int(marker.read_text().strip())
    except (OSError, ValueError):
        return 0


def verl_steps(ckpt_root: Path) -> list[tuple[int, Path]]:
    """``[(step, global_step_<step> folder), ...]`` under verl's ``default_local_dir``, by step."""
    out = []
    for d in Path(ckpt_root).glob("global_step_*"):
        try:
            out.append((int(d.name.rsplit("_", 1)[1]), d))
        except ValueError:
            continue
    return sorted(out)


def rewind_to_logged(ckpt_root: Path, logged_through: int) -> int:
    """Make verl resume (``resume_mode=auto``) from the newest checkpoint whose steps all reached the tracker.

    verl saves a step's checkpoint before it logs that step's metrics, so a run stopped between the two leaves a
    checkpoint holding a step that was never logged; resuming there would leave that step out of the run's history
    for good. The marker ``latest_checkpointed_iteration.txt`` is moved back to the newest checkpoint
    ``global_step_k`` with ``k <= logged_through + 1`` (``global_step_k`` holds the 0-based steps ``0 .. k-1``), the
    newer checkpoints are removed, and the steps after it are trained again and logged once; with no such checkpoint
    the run starts over.

    Args:
        ckpt_root: verl's ``default_local_dir``.
        logged_through: the last 0-based step whose metrics the tracker holds (-1: none).
    Returns:
        The number of steps verl resumes after (0: from scratch).
    """
    ckpt_root = Path(ckpt_root)
    done = checkpointed_steps(ckpt_root)
    if done <= logged_through + 1:
        return done
    keep = max((k for k, _ in verl_steps(ckpt_root) if k <= min(done, logged_through + 1)), default=0)
    for k, folder in verl_steps(ckpt_root):
        if k > keep:
            shutil.rmtree(folder, ignore_errors=True)
    marker = ckpt_root / "latest_checkpointed_iteration.txt"
    if keep:
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(str(keep))
        tmp.replace(marker)
    else:
        marker.unlink(missing_ok=True)
    import logging

    logging.getLogger("rlvr").warning(
        "engine=verl: the checkpoint after step %d holds steps whose metrics were never logged (stopped between "
        "verl's save and its log); resuming after step %d instead", done, keep)
    return keep


def export_trajectory(ckpt_root: Path, run_dir: Path, save_every: int, total_steps: int) -> list[Path]:
    """Export verl's checkpoints at every ``save_every``-th step before the last to
    ``run_dir/checkpoints/step_<N>`` (:func:`core.lifecycle.step_checkpoint_dir`), skipping those already there."""
    from core.lifecycle import step_checkpoint_dir

    out = []
    for step, step_dir in verl_steps(ckpt_root):
        if save_every and step % save_every == 0 and step < total_steps:
            target = step_checkpoint_dir(run_dir, step)
            if not (target / "config.json").is_file():
                export_hf_checkpoint(ckpt_root, target, step_dir=step_dir)
            out.append(target)
    return out


def export_hf_checkpoint(ckpt_root: Path, out_dir: Path, step_dir: Path | None = None) -> Path:
    """Copy verl's latest actor checkpoint (or ``step_dir``'s), in Hugging Face format, to ``out_dir`` for evaluation.

    Uses ``actor/huggingface`` when verl saved the weights there (``save_contents`` with ``hf_model``);
    otherwise merges the FSDP shards with verl's own ``python -m verl.model_merger merge``. A LoRA actor's
    (``lora_train_meta.json``) is saved as the peft-wrapped model, which ``from_pretrained`` would load as random
    weights without a word: its adapters are merged into the base first (:func:`core.lora.merge_saved_peft_model`).

    Raises:
        FileNotFoundError: no verl checkpoint under ``ckpt_root``.
        RuntimeError: the model merger failed.
    """
    step_dir = step_dir or latest_verl_step(ckpt_root)
    if step_dir is None:
        raise FileNotFoundError(f"no verl checkpoint (global_step_*) under {ckpt_root}")
    actor, out_dir = step_dir / "actor", Path(out_dir)
    hf = actor / "huggingface"
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    has_weights = hf.is_dir() and (any(hf.glob("*.safetensors")) or any(hf.glob("pytorch_model*.bin")))
    if has_weights:
        shutil.copytree(hf, tmp)
    else:
        cmd = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
               "--local_dir", str(actor), "--target_dir", str(tmp)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"verl model merger failed ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
        if hf.is_dir():  # tokenizer and config files verl saved beside the shards
            for f in hf.iterdir():
                if f.is_file() and not (tmp / f.name).exists():
                    shutil.copy2(f, tmp / f.name)
    meta = actor / "lora_train_meta.json"
    if meta.is_file():  # a LoRA actor: verl saved the peft-wrapped state dict; evaluate the adapters merged
        from core.lora import merge_saved_peft_model

        info = json.loads(meta.read_text())
        merge_saved_peft_model(tmp, int(info["r"]), float(info["lora_alpha"]))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)
    return out_dir
