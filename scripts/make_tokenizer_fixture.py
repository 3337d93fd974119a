#!/usr/bin/env python3
r"""make_tokenizer_fixture.py: the tokenizer fixtures of tests/cmp_tokenizer.c.

Needs the Hugging Face `tokenizers` package (run on the GPU machine, where it is installed).
Trains a small byte-level BPE with `tokenizers` from make_arith.py problems plus a varied
string corpus, and writes, for three tokenizer.json configurations, the ids that
`tokenizers` itself produces (encode(text, add_special_tokens=False)) and its decode
(skip_special_tokens=False) of all ids and of the first half of them:

  tokenizer.json, cases.jsonl       vocab 2048, Sequence[Split(cl100k-style regex, Isolated),
                                    ByteLevel(use_regex=false)], ByteLevel decoder, special
                                    tokens <|endoftext|> <|im_start|> <|im_end|>.
  gpt2.json, gpt2_cases.jsonl       same model trained at vocab 600, GPT-2 ByteLevel
                                    pre-tokenizer (add_prefix_space, its own regex), merges
                                    rewritten in the legacy "a b" string form, added tokens
                                    with lstrip / rstrip / single_word / normalized flags.
  split.json, split_cases.jsonl     vocab 600 model, ignore_merges, a Sequence of Split
                                    pre-tokenizers using every behaviour (Removed, Isolated,
                                    MergedWithPrevious, MergedWithNext, Contiguous, invert),
                                    Digits, then ByteLevel(use_regex=true).

A case line: {"text": s, "ids": [...], "decoded": str, "half": n, "half_decoded": str}.
Texts are generated from fixed seeds (deterministic for a given `tokenizers` version; the
trained merges may differ between versions, which is why the ids are committed).

    python3 make_tokenizer_fixture.py OUT_DIR [--n-cases 3000]

Second mode, other split regexes over an existing small model (the vocab-600 model of
split.json, with its pre-tokenizer replaced):
  o200k.json, o200k_cases.jsonl   o200k-style regex (\p{Lu}\p{Ll}\p{Lt}\p{Lm}\p{Lo}\p{M}
                                  classes, optional (?i:'s|...) suffixes), Isolated, then
                                  ByteLevel(use_regex=false); added tokens as in gpt2.json
  qwen2.json, qwen2_cases.jsonl   Qwen2-style regex (single \p{N} digits), Isolated + ByteLevel

    python3 make_tokenizer_fixture.py OUT_DIR --regex-variants BASE.json [--n-cases 1000]
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_arith  # noqa: E402

CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

WORDS = ["the", "The", "hello", "world", "don't", "I'm", "they'll", "WE'RE", "it's", "You'VE",
         "she'd", "café", "naïve", "Zürich", "straße", "ÉCOLE", "mañana", "ﬁne", "Ωmega",
         "Москва", "привет", "Ελλάδα", "שלום", "مرحبا", "नमस्ते", "ภาษาไทย", "東京", "中文字符",
         "日本語のテキスト", "한국어", "ｆｕｌｌｗｉｄｔｈ", "e\u0301", "a\u0308\u0323",
         "Å", "ǅ", "x²", "½", "Ⅻ", "٣٤٥", "१२३", "_under_score", "camelCase", "snake_case",
         "$100", "3.14159", "-42", "1,234,567", "0x1F", "1e-9", "#### 72", "<<48/2=24>>24",
         "👍", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "🇺🇸", "❤️", "1️⃣", "🤖",
         "\u00a0", "\u3000", "\u2028", "\u200b", "\ufeff", "\t", "\n", "\r\n", "  ", "\n\n",
         "\x01", "\x1f", "\x7f", "\u0085", "\ufffd", "\U0010fffd", "\ue000", "...", "?!", "—",
         "“quoted”", "«guillemets»", "(parens)", "[brackets]", "{braces}", "a/b", "c:\\path",
         "http://example.com/x?y=1&z=2", "user@example.com", "#hashtag", "@mention", "%d",
         "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|endoftext", "|>", "<|", "<mask>",
         "[DAY]", "hello world", "<R>", "ab", "Question:", "Answer:"]
PUNCT = list(".,;:!?-'\"()[]{}<>/\\|@#$%^&*+=~`_")
BLOCKS = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff),
          (0x590, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f),
          (0x2070, 0x21ff), (0x3000, 0x30ff), (0x4e00, 0x4fff), (0xac00, 0xacff),
          (0xff00, 0xffef), (0x1f300, 0x1f6ff), (0x1f900, 0x1f9ff), (0x10000, 0x1007f)]
WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000", "\x0b",
      "\x0c", "\r", "\u2009", "\u2028"]


def rand_number(rng):
    k = rng.randint(1, 14)
    s = "".join(rng.choice("0123456789") for _ in range(k))
    r = rng.random()
    if r < 0.2:
        s = f"{int(s):,}"
    elif r < 0.35:
        s = s + "." + str(rng.randint(0, 999))
    elif r < 0.45:
        s = "-" + s
    elif r < 0.5:
        s = "$" + s
    return s


def rand_unicode(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(BLOCKS)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def rand_fragment(rng):
    r = rng.random()
    if r < 0.35:
        return rng.choice(WORDS)
    if r < 0.5:
        return rand_number(rng)
    if r < 0.65:
        return rng.choice(WS)
    if r < 0.75:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 4)))
    if r < 0.85:
        return rand_unicode(rng, rng.randint(1, 6))
    return "".join(chr(rng.randint(0x21, 0x7e)) for _ in range(rng.randint(1, 10)))


def rand_text(rng):
    k = rng.randint(1, 24)
    s = ""
    for _ in range(k):
        s += rand_fragment(rng)
        if rng.random() < 0.5:
            s += " "
    return s


def corpus(n_arith, n_varied):
    rows = make_arith.generate(random.Random("tok-corpus"), n_arith, True, ())
    out = []
    for r in rows:
        out.append("Question: " + r["question"] + "\nAnswer: " + r["answer"])
    rng = random.Random("tok-varied")
    for _ in range(n_varied):
        out.append(rand_text(rng))
    return out


def test_texts(n, seed):
    rng = random.Random(seed)
    fixed = ["", " ", "  ", "\n", "\n\n\n", " \t \n ", "a", "A  b", "hello world",
             "Hello, World!", "I'm here. They'll go; we're done. IT'S ok, You'Ve", "12345678901",
             "1,234.56", "$-3.5", "<|endoftext|>", "<|endoftext|><|endoftext|>",
             "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
             "x<|endoftext|>y", " <|endoftext|> ", "<|endoftext", "<|im_start|>",
             "👨\u200d👩\u200d👧\u200d👦 family", "🇺🇸🇯🇵", "e\u0301e\u0301", "中文 English 混合",
             "tabs\tand\ttabs", "trailing spaces   ", "   leading", "line\r\nbreaks\r\n",
             "<mask> x", "a <mask> b", "a  <mask>  b", "[DAY] one", "x[DAY]y", "a [DAY] b",
             "hello world", "say hello world now", "<R>  next", "ab ab", "xab abx", "ab_",
             "Question: 1+1?\nAnswer: 2\n\nQuestion:", "#### 1,000", "\u00a0\u00a0x"]
    out = list(fixed)
    arith = make_arith.generate(random.Random(f"{seed}-arith"), n // 4, True, ())
    for r in arith:
        out.append("Question: " + r["question"] + "\nAnswer: " + r["answer"])
    while len(out) < n:
        out.append(rand_text(rng))
    return out


def cases(tok, texts):
    rows = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        h = len(ids) // 2
        rows.append({"text": t, "ids": ids,
                     "decoded": tok.decode(ids, skip_special_tokens=False), "half": h,
                     "half_decoded": tok.decode(ids[:h], skip_special_tokens=False)})
    return rows


def write(path, obj):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        if isinstance(obj, list):
            for r in obj:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        else:
            f.write(obj)


O200K = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def regex_variants(out, base_path, n):
    from tokenizers import AddedToken, Tokenizer
    base = json.load(open(base_path, encoding="utf-8"))
    base["model"]["ignore_merges"] = False
    texts = test_texts(n, "tok-regex-variants")
    for name, pat, extra in [("o200k", O200K, True), ("qwen2", QWEN2, False)]:
        j = json.loads(json.dumps(base))
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]}
        t = Tokenizer.from_str(json.dumps(j))
        if extra:
            t.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False),
                          AddedToken("[DAY]", single_word=True, normalized=False),
                          AddedToken("hello world", normalized=True)])
        write(os.path.join(out, name + ".json"), t.to_str(pretty=False))
        write(os.path.join(out, name + "_cases.jsonl"), cases(t, texts))


def main():
    import tokenizers
    if len(sys.argv) > 3 and sys.argv[2] == "--regex-variants":
        n = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
        print("tokenizers", tokenizers.__version__)
        regex_variants(sys.argv[1], sys.argv[3], n)
        print("wrote", sorted(os.listdir(sys.argv[1])))
        return
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers,
                            trainers)
    out = sys.argv[1]
    n = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--n-cases" else 3000
    os.makedirs(out, exist_ok=True)
    print("tokenizers", tokenizers.__version__)
    text = corpus(20000, 20000)

    def train(vocab):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(CL100K), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                 show_progress=False)
        tok.train_from_iterator(text, tr)
        return tok

    main_tok = train(2048)
    write(os.path.join(out, "tokenizer.json"), main_tok.to_str(pretty=False))
    texts = test_texts(n, "tok-cases")
    write(os.path.join(out, "cases.jsonl"), cases(main_tok, texts))

    small = json.loads(train(600).to_str())
    sub = texts[: n // 3]

    # gpt2-style: ByteLevel pre-tokenizer alone, legacy "a b" merges, flagged added tokens
    g = json.loads(json.dumps(small))
    g["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                          "use_regex": True}
    g["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                            for m in g["model"]["merges"]]
    gt = Tokenizer.from_str(json.dumps(g))
    gt.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False),
                   AddedToken("[DAY]", single_word=True, normalized=False),
                   AddedToken("hello world", normalized=True),
                   AddedToken("<R>", rstrip=True, normalized=False),
                   AddedToken("ab", single_word=True, normalized=True)])
    write(os.path.join(out, "gpt2.json"), gt.to_str(pretty=False))
    write(os.path.join(out, "gpt2_cases.jsonl"), cases(Tokenizer.from_str(gt.to_str()), sub))

    # split: every Split behaviour, Digits, ByteLevel with its regex, ignore_merges
    s = json.loads(json.dumps(small))
    s["model"]["ignore_merges"] = True
    s["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "\t"}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"Regex": r"\p{P}"}, "behavior": "MergedWithNext",
         "invert": False},
        {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithPrevious",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": r"[0-9]"}, "behavior": "Contiguous",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": r"\p{L}+"}, "behavior": "Isolated",
         "invert": True},
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": True}]}
    st = Tokenizer.from_str(json.dumps(s))
    write(os.path.join(out, "split.json"), st.to_str(pretty=False))
    write(os.path.join(out, "split_cases.jsonl"), cases(st, sub))
    print("wrote", sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
