"""Writes a tiny Llama model directory that a real vLLM can serve with `--load-format dummy`.

Usage: python scripts/real_vllm_model.py DIR [--shape tiny|half-billion]
(run with the vLLM environment's python; see scripts/real-vllm.sh)

`half-billion` (for scripts/sharing-real.sh on a GPU) has Qwen2.5-0.5B's layer shapes on the Llama architecture:
24 layers, hidden 896, MLP 4864, 14 heads, 2 KV heads of 64, so 12,288 bytes of KV cache per token in bf16 and
about 0.36 B parameters with this tokenizer's small vocabulary. Step times on a GPU follow the shapes, not the
weights' values, so nothing has to be downloaded to measure what sharing a GPU costs.

Nothing is downloaded: the weights are vLLM's random "dummy" weights, and the tokenizer is a byte-level BPE
trained here on a few lines of text, so any prompt tokenizes. The shapes are chosen to keep the CPU engine's
start-up and steps short: 2 layers, hidden 128, 4 attention heads, 2 KV heads, head_dim 32, so one token of KV
cache is 2 x 2 layers x 2 heads x 32 x 2 bytes = 512 bytes.
"""

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 2000

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tessera scales vLLM servers on Kubernetes from the metrics they publish.",
    "Hello, how are you today? I am fine, thank you, and you?",
    "Write a short poem about the sea, the wind and the light on the water.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" \\ _ # @ $ % ^ & |",
] * 50

# A plain template with no special syntax beyond what vLLM's chat endpoint needs.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


SHAPES = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
    },
    "half-billion": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
}


def main() -> None:
    out = Path(sys.argv[1])
    shape = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--shape" else "tiny"
    if shape not in SHAPES:
        sys.exit(f"unknown --shape {shape!r}: one of {', '.join(SHAPES)}")
    out.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()

    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 4096,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2)
    )
    (out / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                **SHAPES[shape],
                "hidden_act": "silu",
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0,
                "vocab_size": vocab,
                "bos_token_id": tok.token_to_id("<s>"),
                "eos_token_id": tok.token_to_id("</s>"),
                "tie_word_embeddings": False,
                "torch_dtype": "bfloat16",
            },
            indent=2,
        )
    )
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": tok.token_to_id("<s>"), "eos_token_id": tok.token_to_id("</s>")}, indent=2)
    )


if __name__ == "__main__":
    main()
