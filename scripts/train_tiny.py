#!/usr/bin/env python3
"""train_tiny.py: train a small MiniMax-M3 on GSM8K-format arithmetic, for `m3 eval gsm8k`.

The model is transformers' own MiniMax-M3 class (the one scripts/hf_dump.py builds the oracle
fixtures with, so the checkpoint layout is the one ref/ loads): dense and MoE layers with a
shared expert, full-attention and sparse (indexer) layers whose block size and top-k are small
enough that few-shot prompts are longer than topk*block. The data are make_arith.py problems
(--level easy by default); the tokenizer is a byte-level BPE trained here with `tokenizers`,
digits split one per token so that arithmetic is learnable.

Training: sequences laid out as lm-eval's gsm8k prompt ("Question: q\\nAnswer: a" shots joined
by blank lines, 0..--max-shots shots drawn from train, then the target question), loss on the
target answer and the EOS after it only; AdamW, warm-up then cosine decay. Training stops at
--max-steps or when --budget-s of wall time has passed, whichever is first (the schedule is
set from the measured step time), and always saves. The indexer's projections get no gradient
(top-k selection is not differentiable) and keep their initial values, as do the routing biases.

Saved in --out: config.json, model.safetensors (bf16; router gate and routing bias fp32, as the
real checkpoint), tokenizer.json (+ tokenizer_config.json), test.jsonl (held-out problems),
train_log.json (command, seed, versions, steps, losses, measured accuracy).

Quick check: greedy generation with the HF model on held-out items (--eval-shots shots from
train, like `m3 eval gsm8k --fewshot`), for at most --eval-s seconds, scored with lm-eval's
strict-match rule (first "#### N", commas/$ removed).

    python3 train_tiny.py --out DIR [--seed 0] [--budget-s 200] [--eval-s 30]

Needs torch, transformers (with MiniMax-M3), tokenizers, safetensors; make_arith.py and
hf_dump.py next to this file.
"""
import argparse
import json
import math
import os
import platform
import random
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_arith  # noqa: E402
import hf_dump  # noqa: E402  (model_class, config_class, router_tensors)

EOS = "<|endoftext|>"


def log(msg):
    print(f"train_tiny: {msg}", flush=True)


def make_data(seed, n_train, n_test, level):
    tpl = make_arith.EASY_TEMPLATES if level == "easy" else make_arith.TEMPLATES
    tag = "easy-" if level == "easy" else ""
    test = make_arith.generate(random.Random(f"{tag}test-{seed}"), n_test, True, (), tpl)
    train = make_arith.generate(random.Random(f"{tag}train-{seed}"), n_train, True,
                                [r["question"] for r in test], tpl)
    return train, test


def shot_text(item):
    return f"Question: {item['question']}\nAnswer: {item['answer']}\n\n"


def train_tokenizer(train, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    # Digits first (one digit per piece), then GPT-2's byte-level split: both are read by
    # compare/tokenizer.c. No normalizer and no post-processor (neither is applied there).
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator((shot_text(r) for r in train), trainer=tr)
    return tok


def build_model(torch, transformers, args, vocab, eos_id):
    Cfg = hf_dump.config_class(transformers)
    L = ["full_attention", "minimax_m3_sparse", "full_attention", "minimax_m3_sparse"]
    tc = {
        "vocab_size": vocab, "hidden_size": args.hidden, "num_hidden_layers": len(L),
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": args.hidden // 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.5},
        # transformers' attention rotates min(rotary_dim, head_dim * factor) channels; the
        # config class defaults rotary_dim to 64, so set the width it really uses
        "rotary_dim": (args.hidden // 4) // 2,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "layer_types": L, "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
        # block 8 x top-4 = 32 keys for the sparse layers: a 5-shot prompt (~300 tokens) is
        # far longer, so the indexer's choice matters
        "index_n_heads": 2, "index_head_dim": args.index_dim, "index_block_size": 8,
        "index_topk_blocks": 4, "index_local_blocks": 1,
        "num_local_experts": 8, "num_experts_per_tok": 2,
        "intermediate_size": args.hidden, "shared_intermediate_size": args.hidden,
        "dense_intermediate_size": 3 * args.hidden, "routed_scaling_factor": 2.0,
        "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "bos_token_id": eos_id, "eos_token_id": eos_id,
    }
    vc = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 2, "patch_size": 14, "temporal_patch_size": 2,
          "spatial_merge_size": 2}
    cfg = Cfg(text_config=tc, vision_config=vc, projector_hidden_size=64,
              tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    return hf_dump.model_class(transformers)(cfg)


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def make_batch(torch, rng, train, tok, eos_id, batch, max_shots, dev):
    seqs, labs = [], []
    for _ in range(batch):
        k = rng.randint(0, max_shots)
        shots = rng.sample(train, k + 1)
        tgt = shots.pop()
        prompt = "".join(shot_text(s) for s in shots) + f"Question: {tgt['question']}\nAnswer:"
        p = encode(tok, prompt)
        a = encode(tok, " " + tgt["answer"]) + [eos_id]
        seqs.append(p + a)
        labs.append([-100] * len(p) + a)
    T = max(len(s) for s in seqs)
    # right padding and no attention mask: causal attention never reads the padding of
    # earlier positions, and padded positions carry no loss
    ids = torch.full((batch, T), eos_id, dtype=torch.long)
    lab = torch.full((batch, T), -100, dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labs)):
        ids[i, :len(s)] = torch.tensor(s)
        lab[i, :len(l)] = torch.tensor(l)
    return ids.to(dev), lab.to(dev)


STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def norm(s):
    s = s.replace(",", "").replace("$", "")
    s = re.sub(r"(?s).*#### ", "", s)
    return re.sub(r"\.$", "", s).lower()


def quick_eval(torch, model, tok, eos_id, train, test, shots, seconds, dev, max_new=64):
    """HF greedy (full recompute per token: no cache involved), strict-match accuracy."""
    rng = random.Random(1234)
    model.eval()
    n = correct = 0
    t0 = time.time()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for item in test:
            if time.time() - t0 > seconds:
                break
            sh = rng.sample(train, shots)
            prompt = "".join(shot_text(s) for s in sh) + f"Question: {item['question']}\nAnswer:"
            ids = encode(tok, prompt)
            out = []
            for _ in range(max_new):
                x = torch.tensor([ids + out], device=dev)
                nxt = int(model(input_ids=x).logits[0, -1].float().argmax())
                if nxt == eos_id:
                    break
                out.append(nxt)
                if "Question:" in tok.decode(out):
                    break
            resp = tok.decode(out).split("Question:")[0]
            m = STRICT.search(resp)
            n += 1
            correct += bool(m) and norm(m.group(1).strip()) == norm(item["answer"])
    model.train()
    return n, correct


def save(torch, model, tok, out, eos_id):
    from transformers import PreTrainedTokenizerFast
    keep = [(m, a, getattr(m, a).detach().clone().float())
            for (m, a, _) in hf_dump.router_tensors(model)]
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        for m, a, t in keep:
            cur = getattr(m, a)
            if isinstance(cur, torch.nn.Parameter):
                cur.data = t
            else:
                setattr(m, a, t)
    for c in (model.config, getattr(model.config, "text_config", None),
              getattr(model.config, "vision_config", None)):
        if c is not None:
            try:
                c.dtype = torch.bfloat16
            except Exception:  # noqa: BLE001 - older configs have no dtype field
                pass
    model.save_pretrained(out, safe_serialization=True)
    ft = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS)
    ft.save_pretrained(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--level", choices=["easy", "full"], default="easy")
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--hidden", type=int, default=192)
    # >= the rotary width hidden/4 * 0.5: ref/config.c refuses a narrower index head (what
    # transformers does then is a truncated rope no real config uses)
    ap.add_argument("--index-dim", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--max-shots", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--max-steps", type=int, default=4000)
    ap.add_argument("--budget-s", type=float, default=200.0, help="wall time for training")
    ap.add_argument("--eval-s", type=float, default=30.0)
    ap.add_argument("--eval-shots", type=int, default=1)
    args = ap.parse_args()
    t_start = time.time()
    import torch
    import transformers
    import tokenizers
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)

    train, test = make_data(1, args.n_train, args.n_test, args.level)
    make_arith.write_jsonl(os.path.join(args.out, "test.jsonl"), test)
    tok = train_tokenizer(train, args.vocab)
    eos_id = tok.token_to_id(EOS)
    vocab = tok.get_vocab_size()
    log(f"tokenizer: vocab {vocab}, eos {eos_id}; sample {encode(tok, shot_text(test[0]))[:24]}")
    model = build_model(torch, transformers, args, vocab, eos_id).to(dev).float()
    model.train()
    n_par = sum(p.numel() for p in model.parameters())
    log(f"model {type(model).__name__}: {n_par} parameters on {dev}")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr,
                            betas=(0.9, 0.98), weight_decay=0.01)

    total = args.max_steps  # replaced once the step time is known
    losses, step = [], 0
    t_train = time.time()
    while step < total:
        if step < args.warmup:
            lr = args.lr * (step + 1) / args.warmup
        else:
            f = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
            lr = args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * f)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, lab = make_batch(torch, rng, train, tok, eos_id, args.batch, args.max_shots, dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]), lab[:, 1:].reshape(-1),
            ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        el = time.time() - t_train
        if step in (20, 60):
            # fit the cosine schedule into the time budget (again at 60: the first steps
            # include compilation and allocator warm-up)
            if step == 20:
                t20 = el
            rate = el / step if step == 20 else (el - t20) / 40
            total = max(step + 1, min(args.max_steps, step + int((args.budget_s - el) / rate)))
            log(f"{rate * 1000:.0f} ms/step -> {total} steps")
        if step % 50 == 0 or step == total:
            losses.append([step, round(loss.item(), 4)])
            log(f"step {step}/{total} loss {loss.item():.4f} lr {lr:.2e} {el:.0f}s")
        if el > args.budget_s:
            log(f"time budget reached at step {step}")
            break

    n_eval, correct = quick_eval(torch, model, tok, eos_id, train, test, args.eval_shots,
                                 args.eval_s, dev)
    acc = correct / max(1, n_eval)
    log(f"HF greedy strict-match on held-out: {correct}/{n_eval} = {acc:.3f} "
        f"({args.eval_shots}-shot)")
    save(torch, model, tok, args.out, eos_id)
    info = {
        "command": " ".join(sys.argv), "seed": args.seed, "args": vars(args),
        "steps": step, "train_s": round(time.time() - t_train, 1),
        "total_s": round(time.time() - t_start, 1), "losses": losses,
        "hf_eval": {"n": n_eval, "strict_correct": correct, "strict_accuracy": acc,
                    "shots": args.eval_shots, "note": "greedy, full recompute, bf16 autocast"},
        "parameters": n_par, "vocab": vocab, "eos_id": eos_id,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
    }
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(info, f, indent=1)
    log(f"saved {args.out} ({step} steps, {info['total_s']} s)")


if __name__ == "__main__":
    main()
