#!/usr/bin/env python3
"""check_fixtures.py - validate m3-dump/1 files and oracle fixture folders.

usage: check_fixtures.py PATH...
  PATH is a fixture folder (model/config.json, model/model.safetensors,
  tokens.txt, *.h5) or a single .h5 dump.

Checks each dump against ../shared/spec/dump-schema.md using the model config
stored in the file itself (attribute model_config):
  - file attributes: format "m3-dump", format_version 1, producer, profile,
    model_config (JSON), variant (JSON object when present); dumps written by
    transformers (producer "transformers ...") must also record
    attn_implementation, experts_implementation, router_dtype and
    rope_inv_freq_dtype;
  - layout: a single pass at the root, or passes/0000, passes/0001, ... with
    consecutive positions across passes;
  - every dataset: float32 for activations (with a produced_dtype attribute),
    int32 for tokens / positions / index_topk / expert_ids, finite values
    (index_scores may hold +-inf);
  - names and shapes: layer groups zero-padded (two digits, three from 100
    layers), every known stage with the shape the config implies, index stages
    only on sparse layers and router stages only on MoE layers;
  - discrete outputs: index_topk ids in [-1, n_blocks) with no repeated id in a
    row, expert_ids in [0, E) with no repeats, expert_weights rows summing to 1;
  - in a fixture folder, tokens.txt equals the first pass's tokens.

Needs h5py and numpy (Debian: apt-get install python3-h5py python3-numpy).
Prints one line per problem and a summary; exit 0 = all valid, 1 = problems
found, 2 = could not run.
"""

import json
import os
import sys

PROG = "check_fixtures"


def die(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(2)


try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover - environment problem
    die(f"needs h5py and numpy ({e}); on Debian: apt-get install python3-h5py python3-numpy "
        "and run with /usr/bin/python3")


INT_STAGES = {"tokens", "positions", "index_topk", "expert_ids"}
SPARSE_STAGES = {"index_q", "index_k", "index_topk", "index_scores", "index_q_proj", "index_k_proj"}
MOE_STAGES = {"router_logits", "expert_ids", "expert_weights", "shared_out"}


class Geometry:
    """Shapes implied by a config.json (HF-normalised or original dialect)."""

    def __init__(self, cfg):
        tc = cfg.get("text_config", cfg)
        sac = tc.get("sparse_attention_config") or {}

        def pick(legacy, flat, default):
            if legacy in sac:
                return int(sac[legacy])
            return int(tc.get(flat, default))

        self.H = int(tc["hidden_size"])
        self.V = int(tc["vocab_size"])
        self.L = int(tc["num_hidden_layers"])
        self.nq = int(tc["num_attention_heads"])
        self.nkv = int(tc["num_key_value_heads"])
        self.d = int(tc.get("head_dim") or self.H // self.nq)
        self.G = pick("sparse_num_index_heads", "index_n_heads", 4)
        self.di = pick("sparse_index_dim", "index_head_dim", 128)
        self.B = pick("sparse_block_size", "index_block_size", 128)
        self.K = pick("sparse_topk_blocks", "index_topk_blocks", 16)
        self.E = int(tc.get("num_local_experts", tc.get("num_experts", 0)))
        self.k = int(tc.get("num_experts_per_tok", 0))
        lt = tc.get("layer_types")
        if lt is None and "sparse_attention_freq" in sac:
            lt = ["minimax_m3_sparse" if f else "full_attention" for f in sac["sparse_attention_freq"]]
        self.sparse = [t == "minimax_m3_sparse" for t in (lt or ["full_attention"] * self.L)]
        mt = tc.get("mlp_layer_types")
        if mt is None and "moe_layer_freq" in tc:
            mt = ["sparse" if f else "dense" for f in tc["moe_layer_freq"]]
        self.moe = [t == "sparse" for t in (mt or ["sparse"] * self.L)]
        self.width = 3 if self.L >= 100 else 2

    def shape(self, stage, T, S):
        """Expected shape of a layer stage (None: not checked). S = keys visible."""
        H, nq, nkv, d, G, di, E, k = self.H, self.nq, self.nkv, self.d, self.G, self.di, self.E, self.k
        nb = -(-S // self.B) if self.B else 0
        table = {
            "input": (T, H), "output": (T, H), "attn_norm": (T, H), "mlp_norm": (T, H),
            "attn_proj": (T, H), "mlp_out": (T, H), "shared_out": (T, H),
            "q_proj": (T, nq * d), "k_proj": (T, nkv * d), "v_proj": (T, nkv * d),
            "q": (T, nq, d), "k": (T, nkv, d), "v": (T, nkv, d), "attn_out": (T, nq * d),
            "index_q": (T, G, di), "index_k": (T, di), "index_q_proj": (T, G * di),
            "index_k_proj": (T, di), "index_scores": (G, T, nb),
            "router_logits": (T, E), "expert_ids": (T, k), "expert_weights": (T, k),
        }
        return table.get(stage)


class Checker:
    def __init__(self):
        self.errors = 0
        self.files = 0
        self.stages = set()

    def err(self, where, msg):
        self.errors += 1
        print(f"{where}: {msg}")

    # ------------------------------------------------------------------
    def check_dataset(self, where, ds, stage):
        want_int = stage in INT_STAGES
        if "produced_dtype" not in ds.attrs and not want_int:
            self.err(where, "no produced_dtype attribute")
        if want_int and ds.dtype != np.int32:
            self.err(where, f"dtype {ds.dtype}, want int32")
        if not want_int and ds.dtype != np.float32:
            self.err(where, f"dtype {ds.dtype}, want float32")
        if not want_int:
            a = ds[()]
            bad = ~np.isfinite(a)
            if stage == "index_scores":
                bad = np.isnan(a)
            if bad.any():
                self.err(where, f"{int(bad.sum())} non-finite values")

    def check_pass(self, name, g, geo, past, is_first):
        """Returns T of the pass (or None)."""
        if "tokens" not in g or "positions" not in g:
            self.err(name, "missing tokens or positions")
            return None
        tok = g["tokens"][()]
        pos = g["positions"][()]
        T = int(tok.shape[0]) if tok.ndim == 1 else -1
        if tok.ndim != 1 or pos.shape != tok.shape:
            self.err(name, f"tokens {tok.shape} / positions {pos.shape}: want [T] each")
            return None
        for nm in ("tokens", "positions"):
            self.check_dataset(f"{name}/{nm}", g[nm], nm)
        if not np.array_equal(pos, np.arange(past, past + T)):
            self.err(name, f"positions are not {past}..{past + T - 1}")
        if tok.size and (tok.min() < 0 or tok.max() >= geo.V):
            self.err(name, "token id outside the vocabulary")
        S = past + T
        for key in g:
            obj = g[key]
            if key in ("tokens", "positions"):
                continue
            if key == "layers":
                self.check_layers(f"{name}/layers", obj, geo, T, S)
                continue
            if key in ("passes", "vision"):
                continue
            if not isinstance(obj, h5py.Dataset):
                continue
            where = f"{name}/{key}"
            self.stages.add(key)
            self.check_dataset(where, obj, key)
            if key in ("embed", "final_norm") and obj.shape != (T, geo.H):
                self.err(where, f"shape {obj.shape}, want {(T, geo.H)}")
            if key == "logits":
                rows = T
                if "positions" in obj.attrs:
                    lp = np.asarray(obj.attrs["positions"])
                    rows = lp.size
                    if lp.dtype != np.int32:
                        self.err(where, f"positions attribute dtype {lp.dtype}, want int32")
                    if not np.array_equal(lp, np.arange(past + T - rows, past + T)):
                        self.err(where, "positions attribute is not the last positions of the pass")
                if obj.shape != (rows, geo.V):
                    self.err(where, f"shape {obj.shape}, want {(rows, geo.V)}")
        return T

    def check_layers(self, where, grp, geo, T, S):
        for name in grp:
            lw = f"{where}/{name}"
            if not (name.isdigit() and len(name) == geo.width):
                self.err(lw, f"layer group name not zero-padded to {geo.width} digits")
                continue
            li = int(name)
            if li >= geo.L:
                self.err(lw, f"layer {li} >= num_hidden_layers {geo.L}")
                continue
            for st in grp[name]:
                ds = grp[name][st]
                sw = f"{lw}/{st}"
                self.stages.add(f"layers/{st}")
                if not isinstance(ds, h5py.Dataset):
                    self.err(sw, "not a dataset")
                    continue
                self.check_dataset(sw, ds, st)
                if st in SPARSE_STAGES and not geo.sparse[li]:
                    self.err(sw, "index stage on a full-attention layer")
                if st in MOE_STAGES and not geo.moe[li]:
                    self.err(sw, "router / shared-expert stage on a dense-MLP layer")
                want = geo.shape(st, T, S)
                if st == "index_topk":
                    nb = -(-S // geo.B)
                    if ds.ndim != 3 or ds.shape[:2] != (geo.G, T) or not 1 <= ds.shape[2] <= geo.K:
                        self.err(sw, f"shape {ds.shape}, want ({geo.G},{T},K<= {geo.K})")
                        continue
                    a = ds[()]
                    if a.min() < -1 or a.max() >= nb:
                        self.err(sw, f"block id outside [-1,{nb})")
                    srt = np.sort(a, axis=-1)
                    dup = (srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)
                    if dup.any():
                        self.err(sw, f"{int(dup.any(-1).sum())} rows repeat a block id")
                    # the query's own block is always selected (local block)
                    own = (np.arange(S - T, S) // geo.B)[None, :, None]
                    if not (a == own).any(-1).all():
                        self.err(sw, "some rows miss the query's own block")
                elif want is not None and ds.shape != want:
                    self.err(sw, f"shape {ds.shape}, want {want}")
                elif st == "expert_ids":
                    a = ds[()]
                    if a.min() < 0 or a.max() >= geo.E:
                        self.err(sw, f"expert id outside [0,{geo.E})")
                    srt = np.sort(a, axis=-1)
                    if (srt[:, 1:] == srt[:, :-1]).any():
                        self.err(sw, "a row repeats an expert")
                elif st == "expert_weights":
                    s = ds[()].astype(np.float64).sum(-1)
                    if np.abs(s - 1).max() > 1e-3:
                        self.err(sw, f"rows sum to {s.min():.6g}..{s.max():.6g}, want 1 (before "
                                     "routed_scaling_factor)")

    # ------------------------------------------------------------------
    def check_file(self, path, tokens_txt=None):
        self.files += 1
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            self.err(path, f"cannot open: {e}")
            return
        with f:
            a = f.attrs

            def sattr(k):
                v = a.get(k)
                if isinstance(v, bytes):
                    v = v.decode()
                return v

            if sattr("format") != "m3-dump":
                self.err(path, f"format attribute {sattr('format')!r}, want 'm3-dump'")
            if a.get("format_version") != 1:
                self.err(path, f"format_version {a.get('format_version')!r}, want 1")
            prod = sattr("producer")
            if not isinstance(prod, str) or not prod:
                self.err(path, "no producer attribute")
                prod = ""
            prof = sattr("profile")
            if not isinstance(prof, str) or not prof:
                self.err(path, "no profile attribute")
            try:
                cfg = json.loads(sattr("model_config"))
                geo = Geometry(cfg)
            except (TypeError, ValueError, KeyError) as e:
                self.err(path, f"model_config is not a usable config.json: {e}")
                return
            if "variant" in a:
                try:
                    if not isinstance(json.loads(sattr("variant")), dict):
                        raise ValueError("not an object")
                except (TypeError, ValueError) as e:
                    self.err(path, f"variant is not a JSON object: {e}")
            if prod.startswith("transformers"):
                if prof not in ("fp32", "hf"):
                    self.err(path, f"profile {prof!r}: a transformers dump is 'fp32' or 'hf'")
                for k in ("attn_implementation", "experts_implementation", "router_dtype",
                          "rope_inv_freq_dtype"):
                    if not isinstance(sattr(k), str):
                        self.err(path, f"transformers dump without attribute {k}")
            if "passes" in f:
                names = sorted(f["passes"])
                if names != [f"{i:04d}" for i in range(len(names))]:
                    self.err(path, f"passes not numbered 0000..: {names[:5]}")
                past = 0
                first = None
                for i, n in enumerate(names):
                    T = self.check_pass(f"{path}:/passes/{n}", f["passes"][n], geo, past, i == 0)
                    if T is None:
                        break
                    if i == 0:
                        first = f["passes"][n]["tokens"][()]
                    past += T
                if "tokens" in f:
                    self.err(path, "both root stages and passes/")
            else:
                self.check_pass(f"{path}:", f, geo, 0, True)
                first = f["tokens"][()] if "tokens" in f else None
            if tokens_txt is not None and first is not None and not np.array_equal(first, tokens_txt):
                self.err(path, "first pass tokens differ from tokens.txt")

    def check_fixture_dir(self, d):
        for need in ("model/config.json", "model/model.safetensors", "tokens.txt"):
            if not os.path.exists(os.path.join(d, need)):
                self.err(d, f"missing {need}")
        toks = None
        try:
            with open(os.path.join(d, "tokens.txt")) as f:
                toks = np.array([int(x) for x in f.read().split()], dtype=np.int32)
        except (OSError, ValueError) as e:
            self.err(d, f"tokens.txt unreadable: {e}")
        st = os.path.join(d, "model/model.safetensors")
        if os.path.exists(st):
            try:
                with open(st, "rb") as f:
                    n = int.from_bytes(f.read(8), "little")
                    if n <= 0 or n > os.path.getsize(st) - 8:
                        raise ValueError(f"header length {n}")
                    hdr = json.loads(f.read(n))
                dts = {v["dtype"] for k, v in hdr.items() if k != "__metadata__"}
                f32 = [k for k, v in hdr.items() if k != "__metadata__" and v["dtype"] == "F32"]
                if any(not (k.endswith(".gate.weight") or k.endswith("e_score_correction_bias")) for k in f32):
                    self.err(st, "fp32 tensors other than the router gate and routing bias")
                if dts - {"BF16", "F32"}:
                    self.err(st, f"unexpected dtypes {sorted(dts)}")
            except (OSError, ValueError) as e:
                self.err(st, f"bad safetensors header: {e}")
        h5s = sorted(x for x in os.listdir(d) if x.endswith(".h5"))
        if not h5s:
            self.err(d, "no .h5 dumps")
        for x in h5s:
            self.check_file(os.path.join(d, x), toks)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    c = Checker()
    for p in argv:
        if os.path.isdir(p):
            c.check_fixture_dir(p)
        elif os.path.isfile(p):
            c.check_file(p)
        else:
            die(f"{p}: no such file or folder")
    print(f"{PROG}: {c.files} dumps, {c.errors} problems; stages seen: "
          + ", ".join(sorted(c.stages)))
    return 1 if c.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
