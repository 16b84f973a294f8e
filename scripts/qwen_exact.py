"""Full depth through `d3 generate --model qwen2.5-coder-1.5b --alpha 1 --dtype float32` against plain transformers
greedy `generate` on the GGUF itself (assembled from the installed chunk packages, loaded with transformers' GGUF
loader in bfloat16, the dtype the conversion stores, then computed in float32 as the d3 side is), with the chat
template, on a prompt no test uses. Each side in its own process, one after the other, so two copies of the model are
never held at once. `--dtype bfloat16` compares both sides computing in bfloat16 instead.

Usage: nice -n 10 python scripts/qwen_exact.py [--tokens 64] [--prompt TEXT]"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = "Name three uses of a hash map, one sentence each."


def transformers_side(prompt: str, tokens: int, compute: str) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from d3.models import DTYPES, QWEN_CODER, QWEN_CODER_CHUNKS, own_dtype

    with tempfile.TemporaryDirectory() as work:
        gguf = QWEN_CODER_CHUNKS.make(Path(work))
        kwargs = {"gguf_file": gguf.name}
        tokenizer = AutoTokenizer.from_pretrained(work, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(work, dtype=DTYPES[own_dtype(QWEN_CODER)], **kwargs).eval()
    model = model.to(DTYPES[compute])
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=tokens, do_sample=False)
    return out[0, ids["input_ids"].shape[1]:].tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--side", choices=("transformers",), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(transformers_side(args.prompt, args.tokens, args.dtype)))
        return
    started = time.perf_counter()
    ours = subprocess.run([sys.executable, "-m", "d3", "generate", "--model", "qwen2.5-coder-1.5b", "--alpha", "1",
                           "--max-new-tokens", str(args.tokens), "--prompt", args.prompt, "--dtype", args.dtype, "--json"],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    trace = json.loads(ours.stdout)
    d3_ids = [s["token_id"] for s in trace["steps"]]
    d3_s = time.perf_counter() - started
    started = time.perf_counter()
    plain = subprocess.run([sys.executable, __file__, "--side", "transformers", "--tokens", str(args.tokens),
                            "--prompt", args.prompt, "--dtype", args.dtype], capture_output=True, text=True, check=True)
    hf_ids = json.loads(plain.stdout.strip().splitlines()[-1])
    hf_s = time.perf_counter() - started
    n = min(len(d3_ids), len(hf_ids))
    first = next((i for i in range(n) if d3_ids[i] != hf_ids[i]), None)
    print(json.dumps({"prompt": args.prompt, "dtype": args.dtype, "tokens": [len(d3_ids), len(hf_ids)], "equal": d3_ids == hf_ids,
                      "first_difference": first, "d3_text": "".join(s["text"] for s in trace["steps"]),
                      "d3_generate_s": round(d3_s), "transformers_on_gguf_s": round(hf_s)}))


if __name__ == "__main__":
    main()
