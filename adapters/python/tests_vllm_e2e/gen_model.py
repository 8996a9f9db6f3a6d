"""Write a tiny Llama with random weights and an offline tokenizer into a directory.

Nothing is downloaded: the tokenizer is a byte-level BPE trained with the `tokenizers`
library on a text generated here from a fixed word list (so decoding round-trips bytes and
stop strings can be matched), and the model is transformers' LlamaForCausalLM built from a
small LlamaConfig (head_dim 64: the CPU attention has no kernel for 16) with a fixed seed and saved with save_pretrained. The weights are drawn
with a large initializer range so the logits are peaked: greedy decoding then has wide
margins, and a token that differs between two runs means different inputs (a scheduling or
KV-cache error), not float noise from a different batch shape. Used by run_e2e.py.

    python gen_model.py OUTDIR
"""
import json
import random
import sys
from pathlib import Path

WORDS = ("the a one two three red blue green cat dog bird tree river stone light dark "
         "runs sleeps jumps sings over under near far quick slow old new small large "
         "alpha beta gamma delta north south east west apple pear plum grape stop end "
         "seven eight nine ten and or but so then when where why how what who").split()


def corpus(n_lines=4000, seed=1):
    rng = random.Random(seed)
    for _ in range(n_lines):
        yield " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))) + "."


def build_tokenizer(out: Path, vocab_size=512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": 4096, "add_bos_token": False, "clean_up_tokenization_spaces": False,
    }, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>"}))
    return tok


def build_model(out: Path, vocab_size: int, bos: int, eos: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-5,
                      initializer_range=0.5, bos_token_id=bos, eos_token_id=eos,
                      tie_word_embeddings=False, dtype="float32")
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(str(out), safe_serialization=True)
    # generation_config.json would carry sampling defaults; vLLM reads it, keep it neutral.
    gc = out / "generation_config.json"
    if gc.exists():
        gc.write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    build_model(out, tok.get_vocab_size(), tok.token_to_id("<s>"), tok.token_to_id("</s>"))
    print(f"gen_model: {out}: vocab {tok.get_vocab_size()}, 2 layers, hidden 128, head_dim 64")
    return 0


if __name__ == "__main__":
    sys.exit(main())
