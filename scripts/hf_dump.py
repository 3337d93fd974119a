#!/usr/bin/env python3
"""hf_dump.py - the transformers oracle for m3kit.

Builds tiny MiniMax-M3 checkpoints with transformers' own `minimax_m3_vl` classes
and writes m3-dump/1 files (../shared/spec/dump-schema.md) of transformers'
forward passes, captured with forward hooks and thin pass-through wrappers that
never change a value.

Subcommands
  build    --spec S.json [--set K=V ...] --out MODEL_DIR
           seeded random tiny checkpoint, saved with save_pretrained (bf16 weights,
           router gate + e_score_correction_bias kept fp32 as in the real checkpoint)
  tokens   --spec S.json [--set ...] --out tokens.txt
  dump     --model DIR --tokens FILE --dtype float32|bfloat16 --out F.h5
           [--generate N] [--logits-last N] [--prefill-stages full|min]
           fresh from_pretrained(dtype=..., attn_implementation="eager"), one
           forward pass (or prefill + N greedy decode steps through the HF cache,
           each pass under passes/PPPP/)
  fixture  --spec S.json [--set ...] --out DIR
           build + tokens + every dump the spec lists + DIR/README.md
  probe    --model DIR --tokens FILE
           prints what transformers picks by default (attention / experts backend)
           and how far the defaults are from the eager run

Numerics rules (../shared/spec/m3-numerics.md section 10): every dump loads the
checkpoint fresh with from_pretrained(dtype=...); a model is never cast after
loading. TF32 is disabled and cuBLAS reduced-precision bf16 reductions are
disabled, so GEMMs accumulate in fp32 as the `fp32` and `hf` profiles assume;
the flags are recorded in the file's `variant` attribute.

Only torch / transformers / h5py / safetensors are needed, and only on the
machine that runs `build`, `dump` or `fixture`; `--help` works anywhere.
"""

import argparse
import copy
import datetime
import hashlib
import json
import math
import os
import platform
import random
import shlex
import sys

PROG = "hf_dump"

# Tiny default spec: every field can be overridden from a JSON spec file and/or
# --set section.key=JSON-value on the command line.
DEFAULT_SPEC = {
    "name": "tiny",
    "seed": 1,
    "text_config": {
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                            "partial_rotary_factor": 0.5},
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-06,
        "layer_types": ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse",
                        "minimax_m3_sparse"],
        "mlp_layer_types": ["dense", "dense", "sparse", "sparse"],
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_block_size": 8,
        "index_topk_blocks": 4,
        "index_local_blocks": 1,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 32,
        "shared_intermediate_size": 32,
        "dense_intermediate_size": 128,
        "routed_scaling_factor": 2.0,
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "vision_config": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
    },
    "config": {"projector_hidden_size": 64, "tie_word_embeddings": False},
    # Random init, all seeded. Matrices get N(0, gain^2 / fan_in). Gemma norm
    # weights and the routing bias are non-zero so (1+w) and the bias path matter.
    "init": {
        "embed_std": 1.0,
        "linear_gain": 1.0,
        "gate_up_gain": 2.0,      # makes swiglu's clamps (limit 7) fire now and then
        "router_gain": 1.0,
        "norm_std": 0.2,
        "routing_bias_std": 0.05,
        "other_std": 0.02,        # 1-D vision/projector biases
    },
    "tokens": {"count": 128, "seed": 7},
    "dumps": [
        {"file": "hf_fp32.h5", "dtype": "float32"},
        {"file": "hf_bf16.h5", "dtype": "bfloat16"},
    ],
}


def die(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(2)


def log(msg):
    print(f"[{PROG}] {msg}", flush=True)


# ----------------------------------------------------------------------------
# spec handling
# ----------------------------------------------------------------------------

def deep_merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_spec(path, sets):
    spec = copy.deepcopy(DEFAULT_SPEC)
    if path:
        try:
            with open(path) as f:
                user = json.load(f)
        except (OSError, ValueError) as e:
            die(f"{path}: cannot read spec: {e}")
        if not isinstance(user, dict):
            die(f"{path}: spec must be a JSON object")
        # text_config given in full replaces per key (lists like layer_types are replaced)
        spec = deep_merge(spec, user)
    for s in sets or []:
        if "=" not in s:
            die(f"--set {s!r}: expected section.key=JSON")
        key, val = s.split("=", 1)
        try:
            v = json.loads(val)
        except ValueError:
            v = val
        node = spec
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                die(f"--set {s!r}: {p} is not an object")
        node[parts[-1]] = v
    tc = spec["text_config"]
    n = tc["num_hidden_layers"]
    for k in ("layer_types", "mlp_layer_types"):
        if len(tc[k]) != n:
            die(f"spec: text_config.{k} has {len(tc[k])} entries, num_hidden_layers is {n}")
    # transformers reads partial_rotary_factor and ignores rotary_dim
    # (m3-numerics section 1.1); keep rotary_dim consistent so nobody is misled.
    prf = tc.get("rope_parameters", {}).get("partial_rotary_factor", 1.0)
    rd = int(tc["head_dim"] * prf)
    if "rotary_dim" in tc and tc["rotary_dim"] != rd:
        print(f"{PROG}: warning: rotary_dim {tc['rotary_dim']} disagrees with "
              f"head_dim*partial_rotary_factor = {rd}; transformers uses {rd}", file=sys.stderr)
    tc["rotary_dim"] = rd
    return spec


# ----------------------------------------------------------------------------
# transformers plumbing
# ----------------------------------------------------------------------------

def import_stack():
    try:
        import torch
        import transformers
    except ImportError as e:
        die(f"needs torch and transformers: {e}")
    return torch, transformers


def model_class(transformers):
    for name in ("MiniMaxM3SparseForConditionalGeneration", "MiniMaxM3VLForConditionalGeneration"):
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    die("this transformers has no MiniMaxM3SparseForConditionalGeneration")


def config_class(transformers):
    for name in ("MiniMaxM3VLConfig", "MiniMaxM3Config"):
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    die("this transformers has no MiniMaxM3VLConfig")


def set_backend_flags(torch):
    """fp32 GEMMs in IEEE fp32 (no TF32), bf16 GEMMs reduced in fp32."""
    flags = {}

    def setf(obj, attr, val):
        try:
            if hasattr(obj, attr):
                setattr(obj, attr, val)
                flags[attr] = getattr(obj, attr)
        except Exception as e:  # noqa: BLE001 - record, never fail on a flag
            flags[attr] = f"unset ({e})"

    setf(torch.backends.cuda.matmul, "allow_tf32", False)
    setf(torch.backends.cudnn, "allow_tf32", False)
    setf(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False)
    setf(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", False)
    try:
        torch.set_float32_matmul_precision("highest")
        flags["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except Exception as e:  # noqa: BLE001
        flags["float32_matmul_precision"] = f"unset ({e})"
    return flags


def find_text_model(model):
    for m in model.modules():
        if hasattr(m, "layers") and hasattr(m, "embed_tokens") and hasattr(m, "norm") \
                and hasattr(m, "rotary_emb"):
            return m
    die("cannot find the text model (embed_tokens/layers/norm) inside the checkpoint's model")


def text_config_of(model):
    cfg = model.config
    return getattr(cfg, "text_config", None) or cfg


# ----------------------------------------------------------------------------
# build
# ----------------------------------------------------------------------------

def make_config(spec):
    torch, transformers = import_stack()
    Cfg = config_class(transformers)
    kw = dict(spec.get("config", {}))
    tc = copy.deepcopy(spec["text_config"])
    vc = copy.deepcopy(spec["vision_config"])
    return Cfg(text_config=tc, vision_config=vc, **kw)


def init_weights(model, spec, torch):
    ini = spec["init"]
    g = torch.Generator().manual_seed(int(spec["seed"]))
    report = {}

    def normal_(t, std):
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32) * std)

    with torch.no_grad():
        for name, p in model.named_parameters():
            is_vision = ("vision" in name) or ("projector" in name) or ("patch_merge" in name)
            if "embed_tokens" in name:
                std, kind = ini["embed_std"], "embed"
            elif p.ndim == 1 and not is_vision and name.endswith("norm.weight"):
                std, kind = ini["norm_std"], "gemma_norm"
            elif p.ndim == 1 and is_vision and ("norm" in name):
                # vision LayerNorm: leave the default (w=1, b=0) affine; the
                # vision tower is not run by text dumps.
                continue
            elif p.ndim == 1:
                std, kind = ini["other_std"], "bias"
            else:
                fan_in = 1
                for s in p.shape[1:] if p.ndim > 3 else p.shape[-1:]:
                    fan_in *= s
                if name.endswith("mlp.gate.weight") or ".gate.weight" in name and "gate_up" not in name:
                    gain, kind = ini["router_gain"], "router"
                elif any(x in name for x in ("gate_up_proj", "gate_proj", "up_proj", ".w1.", ".w3.")):
                    gain, kind = ini["gate_up_gain"], "gate_up"
                else:
                    gain, kind = ini["linear_gain"], "linear"
                std = gain / math.sqrt(fan_in)
            normal_(p, std)
            report[kind] = report.get(kind, 0) + 1
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                normal_(b, ini["routing_bias_std"])
                report["routing_bias"] = report.get("routing_bias", 0) + 1
    return report


def router_tensors(model):
    """(module, attr, name) of the tensors the real checkpoint stores in fp32: the
    router gate weight and its e_score_correction_bias (both live on the router
    module in transformers 5.17; older layouts keep the bias on the MoE block)."""
    out = []
    for mname, m in model.named_modules():
        if not hasattr(m, "e_score_correction_bias"):
            continue
        out.append((m, "e_score_correction_bias", mname + ".e_score_correction_bias"))
        if isinstance(getattr(m, "weight", None), __import__("torch").nn.Parameter):
            out.append((m, "weight", mname + ".weight"))
        elif hasattr(m, "gate") and hasattr(m.gate, "weight"):
            out.append((m.gate, "weight", mname + ".gate.weight"))
    return out


def cmd_build(spec, out_dir, force=False):
    torch, transformers = import_stack()
    if os.path.exists(os.path.join(out_dir, "model.safetensors")) and not force:
        die(f"{out_dir}: already holds a checkpoint (use --force)")
    os.makedirs(out_dir, exist_ok=True)
    cfg = make_config(spec)
    Model = model_class(transformers)
    torch.manual_seed(int(spec["seed"]))
    model = Model(cfg).float().eval()  # constructing in fp32; weights are set below
    rep = init_weights(model, spec, torch)
    log(f"init: {rep}")
    keep = [(m, attr, full, getattr(m, attr).detach().clone().float())
            for (m, attr, full) in router_tensors(model)]
    if not keep:
        die("model has no MoE router (no mlp_layer_types 'sparse'?)")
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        for m, attr, full, t in keep:
            cur = getattr(m, attr)
            if isinstance(cur, torch.nn.Parameter):
                cur.data = t
            else:
                setattr(m, attr, t)
    for c in (model.config, getattr(model.config, "text_config", None),
              getattr(model.config, "vision_config", None)):
        if c is not None:
            try:
                c.dtype = torch.bfloat16
            except Exception:
                pass
    model.save_pretrained(out_dir, safe_serialization=True)
    # verify the dtypes actually written (save_pretrained writes the checkpoint's
    # own naming: block_sparse_moe.gate.weight, ...e_score_correction_bias)
    st = os.path.join(out_dir, "model.safetensors")
    hdr = safetensors_header(st)
    bad = []
    n_f32 = 0
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        is_router = k.endswith(".gate.weight") or k.endswith("e_score_correction_bias")
        if is_router:
            n_f32 += 1
            if v["dtype"] != "F32":
                bad.append(f"{k}:{v['dtype']} (want F32)")
        elif v["dtype"] != "BF16":
            bad.append(f"{k}:{v['dtype']} (want BF16)")
    if bad:
        die(f"{st}: unexpected tensor dtypes: {bad[:8]}")
    if n_f32 != len(keep):
        die(f"{st}: {n_f32} fp32 router tensors written, expected {len(keep)}")
    log(f"saved {st}: {len(hdr) - ('__metadata__' in hdr)} tensors, {n_f32} fp32 router tensors")
    return st


def safetensors_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def make_tokens(spec):
    t = spec["tokens"]
    rng = random.Random(int(t["seed"]))
    v = int(spec["text_config"]["vocab_size"])
    return [rng.randrange(v) for _ in range(int(t["count"]))]


def read_tokens(path):
    try:
        with open(path) as f:
            toks = [int(x) for x in f.read().split()]
    except (OSError, ValueError) as e:
        die(f"{path}: cannot read token ids: {e}")
    if not toks:
        die(f"{path}: no token ids")
    return toks


# ----------------------------------------------------------------------------
# capture
# ----------------------------------------------------------------------------

class Capture:
    """Hooks and pass-through wrappers that record each stage of one forward pass.

    Nothing here changes a value: hooks only read, and the wrappers call the
    original function with the original arguments and return its result.
    Hooks keep raw tensors; finish_pass() reshapes them into schema stages.
    """

    def __init__(self, torch, model):
        self.torch = torch
        self.model = model
        self.text = find_text_model(model)
        self.tcfg = text_config_of(model)
        self.nlayers = len(self.text.layers)
        self.rec = {}          # stage path -> raw tensor (detached)
        self.ctx = []          # stack of ("attn"|"index", layer)
        self.rope_depth = 0
        self.handles = []
        self.patched = []      # (obj, attr, original)
        self.notes = {}        # how each stage family was obtained / what HF emitted
        self.idx_hist = {}     # layer -> index_k history across passes [S,di]
        self._install()

    # -- helpers
    def lname(self, i):
        w = 3 if self.nlayers >= 100 else 2
        return f"layers/{i:0{w}d}"

    # Every hook below returns None: a forward hook that returns a value would
    # replace the module's output.
    def put(self, key, t):
        if self.torch.is_tensor(t):
            self.rec[key] = t.detach()

    def _push(self, kind, i):
        self.ctx.append((kind, i))

    def _pop(self):
        if self.ctx:
            self.ctx.pop()

    def _hook(self, mod, fn, pre=False, kw=False):
        if mod is None:
            return
        if pre:
            h = mod.register_forward_pre_hook(fn, with_kwargs=kw)
        else:
            h = mod.register_forward_hook(fn, with_kwargs=kw)
        self.handles.append(h)

    def _patch(self, obj, attr, wrapper):
        orig = getattr(obj, attr)
        setattr(obj, attr, wrapper(orig))
        self.patched.append((obj, attr, orig))

    def close(self):
        for h in self.handles:
            h.remove()
        for obj, attr, orig in reversed(self.patched):
            setattr(obj, attr, orig)

    @staticmethod
    def _first(out):
        return out[0] if isinstance(out, (tuple, list)) else out

    # -- installation
    def _install(self):
        text = self.text
        self._hook(text.embed_tokens, lambda m, a, o: self.put("embed", o))
        self._hook(text.norm, lambda m, a, o: self.put("final_norm", o))
        mm = sys.modules[type(text.layers[0].self_attn).__module__]
        self.modeling = mm

        for i, layer in enumerate(text.layers):
            L = self.lname(i)

            def pre_layer(m, args, kwargs, L=L):
                self.put(f"{L}/input", args[0] if args else kwargs.get("hidden_states"))
            self._hook(layer, pre_layer, pre=True, kw=True)
            self._hook(layer, lambda m, a, o, L=L: self.put(f"{L}/output", self._first(o)))
            self._hook(layer.input_layernorm, lambda m, a, o, L=L: self.put(f"{L}/attn_norm", o))
            self._hook(layer.post_attention_layernorm,
                       lambda m, a, o, L=L: self.put(f"{L}/mlp_norm", o))

            at = layer.self_attn
            for nm in ("q_proj", "k_proj", "v_proj"):
                self._hook(getattr(at, nm, None), lambda m, a, o, L=L, nm=nm: self.put(f"{L}/{nm}", o))
            self._hook(at.o_proj, lambda m, a, L=L: self.put(f"{L}/attn_out", a[0]), pre=True)
            self._hook(at.o_proj, lambda m, a, o, L=L: self.put(f"{L}/attn_proj", o))
            self._hook(at, lambda m, a, i=i: self._push("attn", i), pre=True)
            self._hook(at, lambda m, a, o: self._pop())

            ix = getattr(at, "indexer", None)
            if ix is not None:
                self._hook(ix, lambda m, a, i=i: self._push("index", i), pre=True)

                def post_index(m, a, out, L=L):
                    self._pop()
                    self._take_index_out(L, out)
                self._hook(ix, post_index)
                self._hook(getattr(ix, "q_proj", None), lambda m, a, o, L=L: self.put(f"{L}/index_q_proj", o))
                self._hook(getattr(ix, "k_proj", None), lambda m, a, o, L=L: self.put(f"{L}/index_k_proj", o))
            elif self.tcfg.layer_types[i] != "full_attention":
                self.notes[f"{L}/indexer"] = "sparse layer without an .indexer submodule"

            mlp = getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
            self._hook(mlp, lambda m, a, o, L=L: self.put(f"{L}/mlp_out", self._first(o)))
            gate = getattr(mlp, "gate", None)
            if isinstance(gate, self.torch.nn.Module):
                self._hook(gate, lambda m, a, o, L=L: self._take_router(L, o))
            if hasattr(mlp, "experts"):
                def pre_experts(m, args, kwargs, L=L):
                    names = ("hidden_states", "top_k_index", "top_k_weights")
                    vals = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
                    if len(vals) >= 3:
                        self.put(f"{L}/_experts_ids", vals[1])
                        self.put(f"{L}/_experts_w", vals[2])
                self._hook(mlp.experts, pre_experts, pre=True, kw=True)
            sh = getattr(mlp, "shared_experts", None) or getattr(mlp, "shared_expert", None)
            self._hook(sh, lambda m, a, o, L=L: self.put(f"{L}/shared_out", self._first(o)))

        # pass-through wrappers: the eager attention function (q/k/v after
        # norm + RoPE) and the RoPE helpers (index q/k after norm + RoPE).
        if hasattr(mm, "eager_attention_forward"):
            def wrap_eager(orig):
                def eager(module, query, key, value, *a, **kw):
                    self._take_qkv(module, query, key, value, a[0] if a else kw.get("attention_mask"))
                    return orig(module, query, key, value, *a, **kw)
                return eager
            self._patch(mm, "eager_attention_forward", wrap_eager)
        else:
            self.notes["eager_attention_forward"] = "absent from the modeling module"
        for fname in ("apply_rotary_pos_emb", "_apply_partial_rope"):
            if hasattr(mm, fname):
                self._patch(mm, fname, self._wrap_rope)
        for m in self.model.modules():
            if callable(getattr(m, "rotary_fn", None)):
                try:
                    self._patch(m, "rotary_fn", self._wrap_rope)
                    self.notes["rotary_fn"] = "instance rotary_fn wrapped"
                except Exception:  # noqa: BLE001 - a kernel module slot; leave it
                    pass

    def _wrap_rope(self, orig):
        def rope(*a, **kw):
            self.rope_depth += 1
            try:
                out = orig(*a, **kw)
            finally:
                self.rope_depth -= 1
            if self.rope_depth == 0 and self.ctx:
                kind, i = self.ctx[-1]
                L = self.lname(i)
                if kind == "index":
                    self.put(f"{L}/_rope_iq", out[0])
                    self.put(f"{L}/_rope_ik", out[1])
                else:
                    self.put(f"{L}/_rope_q", out[0])
                    self.put(f"{L}/_rope_k", out[1])
            return out
        return rope

    def _take_qkv(self, module, query, key, value, mask):
        i = getattr(module, "layer_idx", None)
        if i is None:
            return
        L = self.lname(i)
        self.put(f"{L}/_eager_q", query)
        self.put(f"{L}/_eager_k", key)
        self.put(f"{L}/_eager_v", value)
        self.put(f"{L}/_eager_mask", mask)

    def _take_index_out(self, L, out):
        torch = self.torch
        cand = out if isinstance(out, (tuple, list)) else (out,)
        for t in cand:
            if torch.is_tensor(t) and not t.is_floating_point():
                self.put(f"{L}/_topk_raw", t)
                return
        for t in cand:
            if torch.is_tensor(t):
                self.put(f"{L}/_index_out_float", t)
                return

    def _take_router(self, L, out):
        torch = self.torch
        ts = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if torch.is_tensor(t)]
        E = int(self.tcfg.num_local_experts)
        k = int(self.tcfg.num_experts_per_tok)
        for t in ts:
            if not t.is_floating_point():
                self.put(f"{L}/expert_ids", t)
            elif t.shape[-1] == E and f"{L}/router_logits" not in self.rec:
                self.put(f"{L}/router_logits", t)
            elif t.shape[-1] == E:
                self.put(f"{L}/_router_scores_full", t)
            elif t.shape[-1] == k:
                self.put(f"{L}/expert_weights", t)

    # -- reshaping helpers
    def _heads(self, t, n, T, d, L, what):
        """[B,n,S,d] (or [B,S,n,d]) with B = 1 -> this pass's rows [T,n,d]."""
        if t.dim() == 4 and t.shape[1] == n and t.shape[3] == d:
            return t[0, :, -T:].transpose(0, 1)
        if t.dim() == 4 and t.shape[2] == n and t.shape[3] == d:
            return t[0, -T:]
        self.notes[f"{L}/{what}_unparsed_shape"] = list(t.shape)
        return None

    # -- post-processing of one pass
    def finish_pass(self, T, past):
        """Turn raw records into schema stages; returns (stages, checks)."""
        torch = self.torch
        tc = self.tcfg
        rec = self.rec
        self.rec = {}
        out = {}
        checks = {}
        H = int(tc.hidden_size)
        nq = int(tc.num_attention_heads)
        nkv = int(tc.num_key_value_heads)
        d = int(tc.head_dim)
        G = int(getattr(tc, "index_n_heads", 0) or 0)
        di = int(getattr(tc, "index_head_dim", 0) or 0)
        B = int(getattr(tc, "index_block_size", 0) or 0)
        K = int(getattr(tc, "index_topk_blocks", 0) or 0)
        local = int(getattr(tc, "index_local_blocks", 1))
        E = int(tc.num_local_experts)
        k = int(tc.num_experts_per_tok)
        for s in ("embed", "final_norm"):
            if s in rec:
                out[s] = rec[s].reshape(T, H)
        for i in range(self.nlayers):
            L = self.lname(i)
            for s in ("input", "output", "attn_norm", "mlp_norm", "attn_proj", "mlp_out", "shared_out"):
                if f"{L}/{s}" in rec:
                    out[f"{L}/{s}"] = rec[f"{L}/{s}"].reshape(T, H)
            for s in ("q_proj", "k_proj", "v_proj", "attn_out", "index_q_proj", "index_k_proj"):
                if f"{L}/{s}" in rec:
                    out[f"{L}/{s}"] = rec[f"{L}/{s}"].reshape(T, -1)
            # q/k/v after norm + RoPE: the tensors eager attention received
            for s, n in (("q", nq), ("k", nkv), ("v", nkv)):
                t = rec.get(f"{L}/_eager_{s}")
                src = "eager_attention_forward arguments"
                if t is None and f"{L}/_rope_{s}" in rec:
                    t, src = rec[f"{L}/_rope_{s}"], "apply_rotary_pos_emb result"
                if t is not None:
                    h = self._heads(t, n, T, d, L, s)
                    if h is not None:
                        out[f"{L}/{s}"] = h
                        self.notes[f"{s}_source"] = src
            if f"{L}/v" not in out and f"{L}/v_proj" in out:
                out[f"{L}/v"] = out[f"{L}/v_proj"].reshape(T, nkv, d)
                self.notes["v_source"] = "v_proj reshaped"
            # indexer q/k after norm + RoPE
            if f"{L}/_rope_iq" in rec:
                h = self._heads(rec[f"{L}/_rope_iq"], G, T, di, L, "index_q")
                if h is not None:
                    out[f"{L}/index_q"] = h
            if f"{L}/_rope_ik" in rec:
                h = self._heads(rec[f"{L}/_rope_ik"], 1, T, di, L, "index_k")
                if h is not None:
                    out[f"{L}/index_k"] = h[:, 0]
            # router
            if f"{L}/router_logits" in rec:
                out[f"{L}/router_logits"] = rec[f"{L}/router_logits"].reshape(T, E)
                ids_e = rec.get(f"{L}/_experts_ids")
                w_e = rec.get(f"{L}/_experts_w")
                if f"{L}/expert_ids" in rec:
                    out[f"{L}/expert_ids"] = rec[f"{L}/expert_ids"].reshape(T, k)
                elif ids_e is not None:
                    out[f"{L}/expert_ids"] = ids_e.reshape(T, k)
                    self.notes["expert_ids_source"] = "experts() arguments"
                if f"{L}/expert_weights" in rec:
                    out[f"{L}/expert_weights"] = rec[f"{L}/expert_weights"].reshape(T, k)
                elif f"{L}/_router_scores_full" in rec and f"{L}/expert_ids" in out:
                    out[f"{L}/expert_weights"] = rec[f"{L}/_router_scores_full"].reshape(T, E).gather(
                        1, out[f"{L}/expert_ids"].long())
                    self.notes["expert_weights_source"] = "router full scores gathered at expert_ids"
                elif w_e is not None:
                    out[f"{L}/expert_weights"] = w_e.reshape(T, k)
                    self.notes["expert_weights_source"] = "experts() arguments (check the rsf ratio)"
                if f"{L}/expert_weights" in out:
                    checks[f"{L}/expert_weights_rowsum_mean"] = float(
                        out[f"{L}/expert_weights"].float().sum(-1).mean())
                if w_e is not None and f"{L}/expert_weights" in out:
                    checks[f"{L}/experts_arg_weights_over_expert_weights"] = float(
                        (w_e.reshape(T, k).float() / out[f"{L}/expert_weights"].float()).mean())
                if ids_e is not None and f"{L}/expert_ids" in out:
                    checks[f"{L}/expert_ids==experts_args"] = bool(
                        torch.equal(ids_e.reshape(T, k), out[f"{L}/expert_ids"]))
            # index_topk: HF's own indexer output -> [G,T,K]
            raw = rec.get(f"{L}/_topk_raw")
            if raw is not None:
                r = raw[0] if raw.dim() >= 3 and raw.shape[0] == 1 else raw
                lay = None
                if r.dim() == 2 and r.shape[0] == T:
                    r = r.unsqueeze(0).expand(G, -1, -1)
                    lay = "[B,T,K]: one selection shared by all index heads (replicated to G)"
                elif r.dim() == 3 and r.shape[0] == G and r.shape[1] == T:
                    lay = "[B,G,T,K]"
                elif r.dim() == 3 and r.shape[0] == T and r.shape[1] == G:
                    r = r.transpose(0, 1)
                    lay = "[B,T,G,K] (transposed to [G,T,K])"
                if lay is None:
                    self.notes[f"{L}/index_topk_unparsed_shape"] = list(raw.shape)
                else:
                    self.notes["index_topk_layout"] = lay
                    out[f"{L}/index_topk"] = r.contiguous()
                    checks[f"{L}/index_topk_width"] = int(r.shape[-1])
            fl = rec.get(f"{L}/_index_out_float")
            if fl is not None:
                self.notes["indexer_output"] = f"float tensor {list(fl.shape)} (a mask, not block ids)"
            # index scores, recomputed from HF's own index_q / index_k exactly as
            # the indexer ranks them (block max, future -inf, local +inf)
            if f"{L}/index_q" in out and f"{L}/index_k" in out and B > 0:
                hist = self.idx_hist.get(i)
                ik = out[f"{L}/index_k"]
                hist = ik if (hist is None or past == 0) else torch.cat([hist, ik], 0)
                self.idx_hist[i] = hist
                try:
                    sc = self._block_scores(out[f"{L}/index_q"], hist, past, B, local)
                    out[f"{L}/index_scores"] = sc
                    if f"{L}/index_topk" in out:
                        checks.update(self._check_topk(L, sc, out[f"{L}/index_topk"], K))
                except Exception as e:  # noqa: BLE001 - an extra stage; never lose the dump
                    self.notes[f"{L}/index_scores_error"] = f"{type(e).__name__}: {e}"
            m = rec.get(f"{L}/_eager_mask")
            if m is not None and f"{L}/index_topk" in out and B > 0:
                try:
                    checks.update(self._check_mask(L, m, out[f"{L}/index_topk"], T, B, nq, G))
                except Exception as e:  # noqa: BLE001
                    self.notes[f"{L}/mask_check_error"] = f"{type(e).__name__}: {e}"
        # identity checks (exact: the run's own tensors and arithmetic order)
        for i in range(self.nlayers):
            L = self.lname(i)
            nxt = f"{self.lname(i + 1)}/input" if i + 1 < self.nlayers else None
            if nxt and f"{L}/output" in out and nxt in out:
                checks[f"{L}/output==next.input"] = bool(torch.equal(out[f"{L}/output"], out[nxt]))
            if all(f"{L}/{s}" in out for s in ("input", "attn_proj", "mlp_out", "output")):
                o = (out[f"{L}/input"] + out[f"{L}/attn_proj"]) + out[f"{L}/mlp_out"]
                checks[f"{L}/output==input+attn_proj+mlp_out"] = bool(torch.equal(o, out[f"{L}/output"]))
            if f"{L}/v" in out and f"{L}/v_proj" in out:
                checks[f"{L}/v==v_proj"] = bool(torch.equal(
                    out[f"{L}/v"].reshape(T, -1), out[f"{L}/v_proj"]))
        if "embed" in out and f"{self.lname(0)}/input" in out:
            checks["embed==layers00.input"] = bool(torch.equal(out["embed"], out[f"{self.lname(0)}/input"]))
        return out, checks

    def _block_scores(self, iq, ik, past, B, local):
        """[G,T,nb] fp32: max over each key block of iq.ik (fp32 dot of the
        captured values), future blocks -inf, the local block(s) +inf."""
        torch = self.torch
        T, G = iq.shape[0], iq.shape[1]
        S = ik.shape[0]
        nb = -(-S // B)
        q = iq.float().transpose(0, 1)                  # [G,T,di]
        kk = ik.float().unsqueeze(0).expand(G, -1, -1)   # [G,S,di]
        s = torch.matmul(q, kk.transpose(-1, -2))        # [G,T,S]
        pad = nb * B - S
        if pad:
            s = torch.nn.functional.pad(s, (0, pad), value=float("-inf"))
        bs = s.reshape(G, T, nb, B).amax(-1)
        qpos = torch.arange(past, past + T, device=bs.device)
        qb = (qpos // B).view(1, T, 1)
        blk = torch.arange(nb, device=bs.device).view(1, 1, nb)
        bs = bs.masked_fill(blk > qb, float("-inf"))
        if local > 0:
            bs = bs.masked_fill((blk <= qb) & (blk > qb - local), float("inf"))
        return bs

    def _check_mask(self, L, mask, topk, T, B, nq, G):
        """Fraction of (query head, token) rows whose key blocks left open by the
        additive mask eager attention received equal the selected blocks."""
        torch = self.torch
        m = mask[0, :, -T:]                   # [H or 1, T, S]
        S = m.shape[-1]
        ok = torch.isfinite(m) & (m > torch.finfo(m.dtype).min / 2)
        nb = -(-S // B)
        pad = nb * B - S
        if pad:
            ok = torch.nn.functional.pad(ok, (0, pad), value=False)
        blk = ok.reshape(m.shape[0], T, nb, B).any(-1).cpu()     # [H,T,nb]
        nh = m.shape[0]
        rep = nq // G if nh == nq and G else 0
        tk = topk.cpu()
        agree = 0
        for h in range(nh):
            g = h // rep if rep else 0
            sel = torch.zeros(T, nb, dtype=torch.bool)
            v = tk[g]
            valid = v >= 0
            rows = torch.arange(T).unsqueeze(1).expand_as(v)[valid]
            sel[rows, v[valid].long()] = True
            agree += int((sel == blk[h]).all(-1).sum())
        return {f"{L}/mask_blocks==index_topk": agree / (nh * T), f"{L}/mask_heads": int(nh)}

    def _check_topk(self, L, sc, topk, K):
        G, T, nb = sc.shape
        kk = min(K, nb)
        res = {}
        scm = sc.amax(0, keepdim=True).expand(G, -1, -1)
        tk = topk.cpu().tolist()
        for label, S_ in (("per_head", sc), ("max_over_heads", scm)):
            idx = S_.topk(kk, dim=-1).indices
            val = S_.gather(-1, idx).cpu().tolist()
            idx = idx.cpu().tolist()
            agree = 0
            for g in range(G):
                for t in range(T):
                    hf = {b for b in tk[g][t] if b >= 0}
                    mine = {b for b, v in zip(idx[g][t], val[g][t]) if v != float("-inf")}
                    agree += (hf == mine)
            res[f"{L}/index_topk_vs_scores_{label}"] = agree / (G * T)
        srt = sc.sort(-1, descending=True).values.cpu()
        ties = 0
        if kk < nb:
            a, b = srt[..., kk - 1], srt[..., kk]
            ties = int(((a == b) & (b != float("-inf"))).sum())
        res[f"{L}/index_ties_at_rank_k"] = ties
        return res


# ----------------------------------------------------------------------------
# dump
# ----------------------------------------------------------------------------

def torch_dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def to_numpy(t):
    import numpy as np
    t = t.detach().cpu()
    if t.is_floating_point():
        return t.float().numpy().astype(np.float32, copy=False), torch_dtype_name(t)
    a = t.long().numpy()
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        die("index out of int32 range")
    return a.astype(np.int32), torch_dtype_name(t)


def write_group(h5, g, stages, prefill_min=False):
    names = sorted(stages)
    for name in names:
        if name.split("/")[-1].startswith("_"):
            continue
        if prefill_min and name not in ("tokens", "positions", "logits"):
            continue
        arr, produced = stages[name]
        kw = {}
        if arr.size >= 256 and arr.ndim >= 1:
            chunks = list(arr.shape)
            # chunk along T (the first axis, or the second for [G,T,K]/[G,T,nb])
            tax = 1 if name.endswith(("index_topk", "index_scores")) else 0
            chunks[tax] = min(arr.shape[tax], 64)
            kw = dict(compression="gzip", compression_opts=9, shuffle=True, chunks=tuple(chunks))
        ds = g.create_dataset(name, data=arr, **kw)
        ds.attrs["produced_dtype"] = produced
    return [n for n in names if not n.split("/")[-1].startswith("_")]


def write_dump_file(out, root, passes, multipass, prefill_min=False):
    """Write one m3-dump/1 file atomically (OUT.tmp, then rename).

    root: file attributes (str, int or numpy arrays; str subclasses such as
    torch's version object are turned into plain str). passes: list of
    (stages, logits_positions) with stages name -> (numpy array, produced dtype).
    Returns the stage names written for the first full pass."""
    import h5py
    import numpy as np
    tmp = out + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    stage_names = None
    notes = {
        "index_topk_note": ("a set per (index head, token); HF's width is min(index_topk_blocks, "
                            "ceil(S_k/block)); -1 marks slots that fell on -inf (future) blocks"),
        "index_scores_note": ("extra stage [G,T,nb]: recomputed by hf_dump.py from HF's index_q/index_k "
                              "(fp32 matmul of the captured values, block max), future blocks -inf, "
                              "local blocks +inf: the values the indexer's top-k ranks"),
    }
    try:
        with h5py.File(tmp, "w") as f:
            for k, v in list(root.items()) + list(notes.items()):
                if isinstance(v, str):
                    # an exact str (torch.__version__ is a str subclass that h5py
                    # would turn into a fixed-width numpy string and reject)
                    v = v.encode("utf-8").decode("utf-8")
                elif isinstance(v, bool):
                    v = np.int8(v)
                f.attrs[k] = v
            for p, (st, keep_pos) in enumerate(passes):
                g = f.create_group(f"passes/{p:04d}") if multipass else f
                names = write_group(f, g, st, prefill_min=(multipass and prefill_min and p == 0))
                if keep_pos is not None:
                    g["logits"].attrs["positions"] = np.asarray(keep_pos, dtype=np.int32)
                if stage_names is None and not (multipass and prefill_min and p == 0):
                    stage_names = names
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return stage_names


def load_model(model_dir, dtype_name, device, experts_impl):
    torch, transformers = import_stack()
    Model = model_class(transformers)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    kw = dict(dtype=dt, attn_implementation="eager")
    if experts_impl and experts_impl != "default":
        kw["experts_implementation"] = experts_impl
    model = Model.from_pretrained(model_dir, **kw)
    model = model.to(device).eval()   # a device move, never a dtype cast
    return model


def describe_model(model, torch):
    text = find_text_model(model)
    tcfg = text_config_of(model)
    info = {}
    info["attn_implementation"] = str(getattr(tcfg, "_attn_implementation", None)
                                      or getattr(model.config, "_attn_implementation", None))
    ei = None
    if hasattr(model, "get_experts_implementation"):
        try:
            ei = model.get_experts_implementation()
        except Exception as e:  # noqa: BLE001 - report, do not fail
            ei = f"unknown ({e})"
    if isinstance(ei, dict):
        ei = ei.get("text_config", ei.get("", json.dumps(ei, sort_keys=True)))
    info["experts_implementation"] = str(ei if ei is not None
                                         else getattr(tcfg, "_experts_implementation", "unknown"))
    rdt = None
    for m, attr, _ in router_tensors(model):
        if attr == "weight":
            rdt = (torch_dtype_name(m.weight), None)
        else:
            bias_dt = torch_dtype_name(m.e_score_correction_bias)
    if rdt:
        rdt = (rdt[0], bias_dt)
    info["router_dtype"] = rdt[0] if rdt else "none"
    info["routing_bias_dtype"] = rdt[1] if rdt else "none"
    info["rope_inv_freq_dtype"] = torch_dtype_name(text.rotary_emb.inv_freq)
    info["rotary_dim_used"] = int(text.rotary_emb.inv_freq.numel() * 2)
    pd = {}
    for n, p in model.named_parameters():
        if "vision" in n or "projector" in n or "patch_merge" in n:
            continue
        pd[torch_dtype_name(p)] = pd.get(torch_dtype_name(p), 0) + 1
    info["text_param_dtypes"] = pd
    return info


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def cmd_dump(model_dir, tokens, dtype_name, out, generate=0, logits_last=0,
             prefill_stages="full", device=None, experts_impl="eager", force=False,
             seed=None, command=None):
    torch, transformers = import_stack()
    import numpy as np
    if os.path.exists(out) and not force:
        die(f"{out}: exists (use --force)")
    cfg_path = os.path.join(model_dir, "config.json")
    try:
        with open(cfg_path) as f:
            cfg_text = f.read()
    except OSError as e:
        die(f"{cfg_path}: {e}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    flags = set_backend_flags(torch)
    model = load_model(model_dir, dtype_name, device, experts_impl)
    info = describe_model(model, torch)
    tcfg = text_config_of(model)
    V = int(tcfg.vocab_size)
    bad = [t for t in tokens if t < 0 or t >= V]
    if bad:
        die(f"token id {bad[0]} outside vocabulary [0,{V})")
    cap = Capture(torch, model)
    passes = []
    all_checks = {}
    generated = []
    last_logits = []
    try:
        with torch.no_grad():
            ids = torch.tensor([tokens], dtype=torch.long, device=device)
            past = 0
            cache = None
            for p in range(generate + 1):
                kw = dict(input_ids=ids, use_cache=bool(generate))
                if cache is not None:
                    kw["past_key_values"] = cache
                out_m = model(**kw)
                cache = out_m.past_key_values if generate else None
                T = ids.shape[1]
                stages, checks = cap.finish_pass(T, past)
                logits = out_m.logits[0]
                nxt = int(torch.argmax(logits[-1]).item())
                last_logits.append(logits[-1].float())
                top2 = torch.topk(logits[-1].float(), 2).values
                all_checks[f"pass{p}/argmax_margin"] = float(top2[0] - top2[1])
                st = {}
                st["tokens"] = to_numpy(ids[0])
                st["positions"] = to_numpy(torch.arange(past, past + T))
                for k, v in stages.items():
                    st[k] = to_numpy(v)
                keep_pos = None
                if logits_last and logits_last < T:
                    keep_pos = list(range(past + T - logits_last, past + T))
                    st["logits"] = to_numpy(logits[-logits_last:])
                else:
                    st["logits"] = to_numpy(logits)
                if prefill_stages == "min" and p == 0 and generate:
                    keep_pos = [past + T - 1]
                    st["logits"] = to_numpy(logits[-1:])
                passes.append((st, keep_pos))
                for k, v in checks.items():
                    all_checks[(f"passes/{p:04d}/" if generate else "") + k] = v
                past += T
                if p < generate:
                    generated.append(nxt)
                    ids = torch.tensor([[nxt]], dtype=torch.long, device=device)
    finally:
        cap.close()
    decode_cmp = None
    if generate:
        # transformers against itself: each decode step's logits vs a full
        # forward over the longer sequence (what m3 run --generate is held to)
        with torch.no_grad():
            full = torch.tensor([tokens + generated], dtype=torch.long, device=device)
            fl = model(input_ids=full).logits[0].float()
        decode_cmp = []
        for p, lg in enumerate(last_logits):
            ref = fl[len(tokens) - 1 + p]
            decode_cmp.append({"pass": p, "max_abs": float((lg - ref).abs().max()),
                               "nmse": float(((lg - ref) ** 2).sum() / (ref ** 2).sum()),
                               "same_argmax": bool(int(lg.argmax()) == int(ref.argmax()))})
        all_checks["decode_vs_full_forward"] = decode_cmp

    st_path = os.path.join(model_dir, "model.safetensors")
    root = {
        "format": "m3-dump",
        "format_version": 1,
        "producer": f"transformers {transformers.__version__} (m3kit hf_dump.py)",
        "profile": "fp32" if dtype_name == "float32" else "hf",
        "model_config": cfg_text,
        "variant": json.dumps({
            "backend": "transformers",
            "model_dtype": dtype_name,
            "attn_implementation": info["attn_implementation"],
            "experts_implementation": info["experts_implementation"],
            "router_dtype": info["router_dtype"],
            "routing_bias_dtype": info["routing_bias_dtype"],
            "rope_inv_freq_dtype": info["rope_inv_freq_dtype"],
            "device": device,
            "torch": str(torch.__version__),
            **flags,
        }, sort_keys=True),
        "attn_implementation": info["attn_implementation"],
        "experts_implementation": info["experts_implementation"],
        "router_dtype": info["router_dtype"],
        "routing_bias_dtype": info["routing_bias_dtype"],
        "rope_inv_freq_dtype": info["rope_inv_freq_dtype"],
        "rotary_dim_used": info["rotary_dim_used"],
        "model_dtype": dtype_name,
        "device": device if device == "cpu" else f"{device} ({torch.cuda.get_device_name()})",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(shlex.quote(x) for x in sys.argv),
        "capture_notes": json.dumps(cap.notes, sort_keys=True),
    }
    if os.path.exists(st_path):
        root["weights_sha256"] = sha256_file(st_path)
    if seed is not None:
        root["seed"] = int(seed)
    if generate:
        root["generated_tokens"] = np.asarray(generated, dtype=np.int32)
        root["decode_vs_full_forward"] = json.dumps(decode_cmp)
        root["prefill_stages"] = prefill_stages
    stage_names = write_dump_file(out, root, passes, multipass=bool(generate),
                                  prefill_min=(prefill_stages == "min"))
    log(f"wrote {out} ({os.path.getsize(out)} bytes) {info}")
    log(f"checks: {json.dumps(all_checks, sort_keys=True)}")
    log(f"notes: {json.dumps(cap.notes, sort_keys=True)}")
    return {"info": info, "checks": all_checks, "notes": cap.notes, "stages": stage_names,
            "generated": generated, "flags": flags}


# ----------------------------------------------------------------------------
# probe: what transformers does by default
# ----------------------------------------------------------------------------

def cmd_probe(model_dir, tokens, device=None):
    torch, transformers = import_stack()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    set_backend_flags(torch)
    Model = model_class(transformers)
    res = {}
    for dn, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        ids = torch.tensor([tokens], device=device)
        outs = {}
        for label, kw in (("default", {}), ("eager/eager", dict(attn_implementation="eager",
                                                                  experts_implementation="eager"))):
            try:
                m = Model.from_pretrained(model_dir, dtype=dt, **kw).to(device).eval()
                d = describe_model(m, torch)
                with torch.no_grad():
                    outs[label] = m(input_ids=ids).logits.float()
                res[f"{dn}/{label}"] = d
            except Exception as e:  # noqa: BLE001
                res[f"{dn}/{label}"] = f"error: {type(e).__name__}: {e}"
        if len(outs) == 2:
            a, b = outs["default"], outs["eager/eager"]
            res[f"{dn}/default_vs_eager_logits_max_abs"] = float((a - b).abs().max())
            res[f"{dn}/default_vs_eager_logits_nmse"] = float(((a - b) ** 2).sum() / (b ** 2).sum())
    print(json.dumps(res, indent=1, sort_keys=True, default=str))
    return res


# ----------------------------------------------------------------------------
# fixture
# ----------------------------------------------------------------------------

def versions():
    torch, transformers = import_stack()
    import h5py
    v = {"python": platform.python_version(), "torch": torch.__version__,
         "transformers": transformers.__version__, "h5py": h5py.__version__}
    try:
        import safetensors
        v["safetensors"] = safetensors.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        v["device"] = torch.cuda.get_device_name()
        v["cuda"] = torch.version.cuda
    return v


def geometry_lines(spec):
    tc = spec["text_config"]
    prf = tc["rope_parameters"].get("partial_rotary_factor", 1.0)
    lines = [
        f"- layers {tc['num_hidden_layers']}: attention {tc['layer_types']}, MLP {tc['mlp_layer_types']}",
        f"- hidden {tc['hidden_size']}, vocab {tc['vocab_size']}, {tc['num_attention_heads']} q / "
        f"{tc['num_key_value_heads']} kv heads (GQA {tc['num_attention_heads'] // tc['num_key_value_heads']}), "
        f"head_dim {tc['head_dim']}",
        f"- RoPE theta {tc['rope_parameters']['rope_theta']:g}, partial_rotary_factor {prf} -> rotary width "
        f"{int(tc['head_dim'] * prf)} (config rotary_dim {tc['rotary_dim']}, not read by transformers)",
        f"- indexer {tc['index_n_heads']} heads x {tc['index_head_dim']}, block {tc['index_block_size']}, "
        f"top-{tc['index_topk_blocks']} blocks, local {tc['index_local_blocks']}",
        f"- MoE {tc['num_local_experts']} experts top-{tc['num_experts_per_tok']}, expert width "
        f"{tc['intermediate_size']}, shared expert width {tc['shared_intermediate_size']}, "
        f"routed_scaling_factor {tc['routed_scaling_factor']}; dense MLP width {tc['dense_intermediate_size']}",
        f"- swiglu alpha {tc['swiglu_alpha']}, limit {tc['swiglu_limit']}; rms_norm_eps {tc['rms_norm_eps']}",
    ]
    return lines


def cmd_fixture(spec, out_dir, spec_path, force=False, device=None):
    import shlex as _sh
    model_dir = os.path.join(out_dir, "model")
    cmd_build(spec, model_dir, force=force)
    toks = make_tokens(spec)
    tok_path = os.path.join(out_dir, "tokens.txt")
    with open(tok_path, "w") as f:
        f.write(" ".join(str(t) for t in toks) + "\n")
    command = "python3 " + " ".join(_sh.quote(x) for x in sys.argv)
    results = []
    failed = []
    for d in spec["dumps"]:
        try:
            r = cmd_dump(model_dir, toks, d["dtype"], os.path.join(out_dir, d["file"]),
                         generate=int(d.get("generate", 0)), logits_last=int(d.get("logits_last", 0)),
                         prefill_stages=d.get("prefill_stages", "full"), device=device,
                         experts_impl=d.get("experts_implementation", "eager"), force=force,
                         seed=spec["seed"], command=command)
            results.append((d, r))
        except Exception as e:  # noqa: BLE001 - go on with the other dumps, fail at the end
            import traceback
            traceback.print_exc()
            failed.append(f"{d['file']}: {type(e).__name__}: {e}")
    try:
        write_readme(spec, out_dir, spec_path, command, toks, results)
    except Exception as e:  # noqa: BLE001 - the dumps are written; say what failed
        import traceback
        traceback.print_exc()
        print(f"{PROG}: README not written: {e}", file=sys.stderr)
    if failed:
        die("dumps failed: " + "; ".join(failed))
    return results


def write_readme(spec, out_dir, spec_path, command, toks, results):
    v = versions()
    lines = [f"# {spec['name']}: transformers oracle fixture", "",
             "Made by `scripts/hf_dump.py fixture` (do not edit by hand; regenerate instead).", "",
             "## How it was made", "", "```", command, "```", ""]
    if spec_path:
        lines += [f"Spec: `{spec_path}` (copied below with every default filled in). Seed {spec['seed']} "
                  f"(weights), token seed {spec['tokens']['seed']}.", ""]
    lines += ["Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".", "",
              "## Checkpoint (`model/`)", ""]
    lines += geometry_lines(spec)
    lines += ["- written by `MiniMaxM3SparseForConditionalGeneration.save_pretrained`: weights bf16, router "
              "gate and `e_score_correction_bias` fp32 (as in the real checkpoint); every Gemma norm weight "
              "and the routing bias non-zero; a tiny unused vision tower is included.",
              f"- init: {json.dumps(spec['init'], sort_keys=True)}", "",
              f"`tokens.txt`: {len(toks)} token ids (seeded uniform over the vocabulary).", "",
              "## Dumps (m3-dump/1)", ""]
    for d, r in results:
        desc = (f"- `{d['file']}`: fresh `from_pretrained(dtype={d['dtype']}, attn_implementation=\"eager\", "
                f"experts_implementation=\"{d.get('experts_implementation', 'eager')}\")`, profile "
                f"`{'fp32' if d['dtype'] == 'float32' else 'hf'}`; ")
        info = r["info"]
        desc += (f"attention `{info['attn_implementation']}`, experts `{info['experts_implementation']}`, "
                 f"router `{info['router_dtype']}`, rotary table `{info['rope_inv_freq_dtype']}`")
        if int(d.get("generate", 0)):
            desc += (f"; prefill of {len(toks)} tokens then {d['generate']} greedy decode steps through the "
                     f"HF cache, each pass under `passes/PPPP/` (generated ids {r['generated']}); "
                     + ("pass 0000 keeps only tokens, positions and last-position logits "
                        "(the full prefill stages are in hf_fp32.h5)" if d.get("prefill_stages") == "min"
                        else "every pass has every stage"))
        if int(d.get("logits_last", 0)):
            desc += f"; `logits` keeps the last {d['logits_last']} positions (attribute `positions`)"
        lines.append(desc + ".")
    stages = results[0][1]["stages"] if results else []
    lines += ["", "Stages (per layer where applicable): " + ", ".join(sorted({s.split('/')[-1] for s in stages})),
              "", "Extra stages beyond dump-schema: `index_q_proj`, `index_k_proj` (raw indexer projections), "
              "`index_scores` [G,T,nb] (block-max index scores recomputed from HF's own index_q/index_k, "
              "future blocks -inf, local block +inf: what the top-k ranks).", "",
              "## Self-checks recorded while dumping", ""]
    for d, r in results:
        ck = r["checks"]
        summ = {}
        for k, val in ck.items():
            if isinstance(val, (bool, int, float)):
                summ.setdefault(k.split("/")[-1], []).append(val)
        parts = []
        for kind, vals in sorted(summ.items()):
            if all(isinstance(x, bool) for x in vals):
                parts.append(f"{kind}: {sum(vals)}/{len(vals)} true")
            else:
                parts.append(f"{kind}: min {min(vals):.6g} max {max(vals):.6g}")
        lines.append(f"- `{d['file']}`: " + "; ".join(parts))
        if "decode_vs_full_forward" in ck:
            lines.append(f"  - decode-step logits vs a full forward over the longer sequence (transformers "
                         f"against itself): {json.dumps(ck['decode_vs_full_forward'])}")
    lines += ["", "Check meanings: `output==input+attn_proj+mlp_out`, `output==next.input`, `v==v_proj`, "
              "`embed==layers00.input` are exact tensor equalities; `index_topk_vs_scores_per_head` is the "
              "fraction of (head, token) rows whose HF top-k set equals the top-k of the recomputed "
              "`index_scores`; `mask_blocks==index_topk` the fraction of (query head, token) rows whose open "
              "key blocks in the mask eager attention received equal the selected set; `index_ties_at_rank_k` "
              "counts rows whose k-th and (k+1)-th block scores are equal; `argmax_margin` is top1 - top2 of "
              "the last position's logits.", ""]
    lines += ["", "## Spec", "", "```json", json.dumps(spec, indent=1, sort_keys=True), "```", ""]
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines))


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(prog="hf_dump.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def spec_args(p):
        p.add_argument("--spec", help="JSON spec file (defaults filled in from the built-in tiny spec)")
        p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=JSON",
                       help="override one spec field, e.g. text_config.num_hidden_layers=6")

    p = sub.add_parser("build")
    spec_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--force", action="store_true")
    p = sub.add_parser("tokens")
    spec_args(p)
    p.add_argument("--out", required=True)
    p = sub.add_parser("dump")
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--generate", type=int, default=0)
    p.add_argument("--logits-last", type=int, default=0)
    p.add_argument("--prefill-stages", choices=("full", "min"), default="full")
    p.add_argument("--experts", default="eager", help="experts_implementation (default eager; 'default' = "
                   "whatever transformers picks)")
    p.add_argument("--device")
    p.add_argument("--force", action="store_true")
    p = sub.add_parser("fixture")
    spec_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--device")
    p.add_argument("--force", action="store_true")
    p = sub.add_parser("probe")
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--device")
    a = ap.parse_args(argv)

    if a.cmd == "build":
        cmd_build(load_spec(a.spec, a.set), a.out, force=a.force)
    elif a.cmd == "tokens":
        spec = load_spec(a.spec, a.set)
        with open(a.out, "w") as f:
            f.write(" ".join(str(t) for t in make_tokens(spec)) + "\n")
    elif a.cmd == "dump":
        n = a.generate
        if n < 0:
            die("--generate must be >= 0")
        cmd_dump(a.model, read_tokens(a.tokens), a.dtype, a.out, generate=n, logits_last=a.logits_last,
                 prefill_stages=a.prefill_stages, device=a.device, experts_impl=a.experts, force=a.force)
    elif a.cmd == "fixture":
        spec = load_spec(a.spec, a.set)
        os.makedirs(a.out, exist_ok=True)
        cmd_fixture(spec, a.out, a.spec, force=a.force, device=a.device)
    elif a.cmd == "probe":
        cmd_probe(a.model, read_tokens(a.tokens), device=a.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
