"""Write a tiny random-weight llama GGUF that ``llama-server`` loads, for tests only.

The tokenizer is byte-level (one token per UTF-8 byte, plus ChatML specials), so
prompt token counts are easy to predict: a system prompt of N ASCII bytes is about
N tokens.  The chat template is Qwen2.5-style ChatML that renders ``tools`` right
after the system text, so a change in tools[] breaks the prefix where a real model
would.  Weights are random: generated text is meaningless and never a tool call.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- "\n\n# Tools\n\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools><|im_end|>\n" }}
{%- else %}
{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif (message.role == 'user') or (message.role == 'system') or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tc in message.tool_calls %}
{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' + tc.name + '", "arguments": ' + (tc.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + (message.content or '') + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""


def _byte_symbols() -> list[str]:
    """GPT-2's reversible byte -> printable character table, indexed by byte value."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_model(path: Path, *, layers: int = 2, embd: int = 128, heads: int = 4, seed: int = 0) -> None:
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    head_dim = embd // heads
    ff = ((8 * embd // 3) + 63) // 64 * 64

    symbols = _byte_symbols()
    tokens = [*symbols, symbols[32] * 2]  # ids 0..255 are bytes; 256 is the one merge
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        tokens.append(special)
        types.append(gguf.TokenType.CONTROL)
    for marker in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        tokens.append(marker)
        types.append(gguf.TokenType.USER_DEFINED)
    vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"prefixpin-tiny-l{layers}-e{embd}")
    w.add_context_length(16384)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{symbols[32]} {symbols[32]}"])  # GGUF refuses empty arrays
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_eot_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def rnd(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    w.add_tensor("token_embd.weight", rnd(vocab, embd, std=1.0))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", rnd(embd, embd))
        w.add_tensor(p + "ffn_norm.weight", np.ones(embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rnd(ff, embd))
        w.add_tensor(p + "ffn_up.weight", rnd(ff, embd))
        w.add_tensor(p + "ffn_down.weight", rnd(embd, ff))
    w.add_tensor("output_norm.weight", np.ones(embd, dtype=np.float32))
    # Only printable ASCII rows get weight: greedy decoding then emits plain text,
    # never an invalid UTF-8 sequence or a control token.
    head = np.zeros((vocab, embd), dtype=np.float32)
    head[32:127] = rng.standard_normal((95, embd), dtype=np.float32)
    w.add_tensor("output.weight", head)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
