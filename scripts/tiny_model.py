"""A tiny Llama and tokenizer built from a config for the GPU check scripts (the device machine has no network).

Imported by scripts/gpu_check_eval.py and scripts/gpu_smoke_vllm.py (run as files, so this folder is on sys.path).
"""
from __future__ import annotations

from pathlib import Path


def build_tiny_model(path: Path, hidden: int = 256, layers: int = 4) -> None:
    """A Llama with head dimension 64 (every vLLM attention backend, the CPU's included, supports it) and a
    512-token byte-level BPE vocabulary trained in-process on arithmetic text, saved to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = [f"What is {a} + {b}? The answer is \\boxed{{{a + b}}}." for a in range(40) for b in range(40)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"]))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                     pad_token="</s>")
    hf_tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(hf_tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, max_position_embeddings=1024,
                      bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path)
