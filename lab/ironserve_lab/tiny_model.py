"""The lab's tiny model: a 2-layer Llama with random weights and a byte-level BPE tokenizer, generated locally.

No hub, no network, no third-party package: only the standard library, so the controller, a lab host's
runtime venv or a bare ``python3`` can all generate it, and the bytes are the same everywhere (fixed seed,
Mersenne Twister ``random.Random``, hand-written safetensors and JSON with sorted keys). What it writes:

- ``config.json`` (``LlamaForCausalLM``: hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads,
  vocab 320, 512 positions, bfloat16), ``generation_config.json``
- ``model.safetensors``: N(0, 0.02) weights (norms at 1.0), rounded to bfloat16
- ``tokenizer.json``: byte-level BPE (GPT-2 byte alphabet, 256 byte tokens + merges learned from ``CORPUS``
  by a small deterministic BPE trainer in this file) and Llama-3-like special tokens;
  ``tokenizer_config.json`` with a ``chat_template`` so ``/v1/chat/completions`` works;
  ``special_tokens_map.json``
- ``ironserve-manifest.sha256``: ``sha256sum -c`` format, paths relative to the model directory (what
  ``roles/model_weights.py`` verifies on the hosts)

The model answers with random bytes (weights are random): it exists to exercise serving, not language.

    python -m ironserve_lab.tiny_model /var/lib/ironserve/models/tiny-llama
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import struct
import sys
from collections import Counter
from pathlib import Path

SEED = 20260301
MANIFEST = "ironserve-manifest.sha256"
MODEL_NAME = "ironserve-tiny-llama"

HIDDEN = 64
INTERMEDIATE = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
MAX_POSITIONS = 512
VOCAB = 320  # 256 bytes + merges + special tokens, padded with reserved specials (a multiple of 64)
INIT_STD = 0.02

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
BOS, EOS_TEXT, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
N_RESERVED = 11
N_MERGES = VOCAB - 256 - len(SPECIALS) - N_RESERVED

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you today? I am fine, thank you.",
    "ironserve provisions servers that serve language models with SGLang.",
    "A tiny model answers quickly, even on the CPU of a small lab host.",
    "What is the capital of France? The capital of France is Paris.",
    "Count with me: one, two, three, four, five, six, seven, eight, nine, ten.",
    "The router sends each request to one of the servers behind it.",
    "Say hello to the world and the world says hello back to you.",
]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# GPT-2's ByteLevel pre-tokenizer split (the tokenizers library uses the same expression)
_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel encodes bytes as)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _train_merges(corpus: list[str], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE on the byte-level words of ``corpus``: most frequent pair first, ties by the pair itself."""
    byte_map = _bytes_to_unicode()
    words = Counter()
    for line in corpus:
        for piece in _SPLIT.findall(line):
            words[tuple(byte_map[b] for b in piece.encode())] += 1
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs = Counter()
        for word, count in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def tokenizer_json() -> dict:
    byte_map = _bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    merges = _train_merges(CORPUS, N_MERGES)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    specials = SPECIALS + [f"<|reserved_special_token_{i}|>" for i in range(VOCAB - len(vocab) - len(SPECIALS))]
    added = []
    for tok in specials:
        added.append(
            {
                "id": len(vocab),
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
        vocab[tok] = len(vocab)
    assert len(vocab) == VOCAB, len(vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[a, b] for a, b in merges],
        },
    }


def tokenizer_config(vocab: dict[str, int]) -> dict:
    decoder = {
        str(vocab[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in vocab
        if t.startswith("<|") and t.endswith("|>")
    }
    return {
        "added_tokens_decoder": decoder,
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": EOS_TEXT,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }


def model_config(vocab: dict[str, int]) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": INIT_STD,
        "tie_word_embeddings": False,
        "vocab_size": VOCAB,
        "bos_token_id": vocab[BOS],
        "eos_token_id": [vocab[EOT], vocab[EOS_TEXT]],
        "pad_token_id": vocab[EOS_TEXT],
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "_name_or_path": MODEL_NAME,
    }


def _shapes() -> list[tuple[str, tuple[int, ...]]]:
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", (HIDDEN,)),
            (f"{p}.self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
            (f"{p}.self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM)),
            (f"{p}.post_attention_layernorm.weight", (HIDDEN,)),
            (f"{p}.mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)),
            (f"{p}.mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
            (f"{p}.mlp.down_proj.weight", (HIDDEN, INTERMEDIATE)),
        ]
    return out + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def _bf16(x: float) -> int:
    """float -> bfloat16 bits, round to nearest even (what torch's .to(torch.bfloat16) does)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def safetensors_bytes(seed: int = SEED) -> bytes:
    """model.safetensors: header (JSON, sorted, no spaces, padded to 8 bytes) + little-endian bf16 data."""
    rng = random.Random(seed)
    header: dict = {"__metadata__": {"format": "pt", "generator": MODEL_NAME, "seed": str(seed)}}
    blobs, offset = [], 0
    for name, shape in _shapes():
        n = math.prod(shape)
        if name.endswith("norm.weight"):
            values = [0x3F80] * n  # 1.0
        else:
            values = [_bf16(rng.gauss(0.0, INIT_STD)) for _ in range(n)]
        blob = struct.pack(f"<{n}H", *values)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def _dump(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def files(seed: int = SEED) -> dict[str, bytes]:
    """Every file of the model directory (manifest excluded), name -> bytes."""
    tok = tokenizer_json()
    vocab = tok["model"]["vocab"]
    cfg = model_config(vocab)
    gen = {
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": cfg["pad_token_id"],
        "do_sample": False,
    }
    tcfg = tokenizer_config(vocab)
    special_map = {"bos_token": BOS, "eos_token": EOT, "pad_token": EOS_TEXT}
    return {
        "config.json": _dump(cfg),
        "generation_config.json": _dump(gen),
        "model.safetensors": safetensors_bytes(seed),
        "special_tokens_map.json": _dump(special_map),
        "tokenizer.json": _dump(tok),
        "tokenizer_config.json": _dump(tcfg),
    }


def manifest_text(contents: dict[str, bytes]) -> str:
    return "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(contents.items()))


def generate(path: str | os.PathLike, seed: int = SEED) -> Path:
    """Write the tiny model into ``path`` (created; files replaced atomically) and return the path.

    Same seed, same bytes: a second run rewrites identical files and an identical manifest.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    contents = files(seed)
    contents_with_manifest = {**contents, MANIFEST: manifest_text(contents).encode()}
    for name, data in contents_with_manifest.items():
        target = root / name
        if target.is_file() and target.read_bytes() == data:
            continue  # unchanged: keep the mtime (the hosts' manifest stamp stays valid)
        tmp = root / f".{name}.tmp-{os.getpid()}"
        tmp.write_bytes(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    return root


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m ironserve_lab.tiny_model PATH", file=sys.stderr)
        return 2
    root = generate(args[0])
    print(
        f"tiny model in {root} ({(root / 'model.safetensors').stat().st_size} bytes of weights, "
        f"manifest {root / MANIFEST})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
