/* tests/cmp_robust.c: a demanding user's bad-input audit of every m3 subcommand, as one
 * table (shared spec/cli.md: bad input -> exit 2 and ONE line "m3: ..." on stderr naming
 * what and where; never a crash, a hang or a half-written output; --help exits 0).
 *
 * Each row is a shell command run in the scratch directory (sh, $M3 = the binary under test,
 * $HF = the hf-tiny oracle fixture, $R = the repository root), the exit status it must give,
 * a substring that its stderr line (exit 2) or its output (exit 0/1) must contain, and the
 * outputs that must NOT exist afterwards (each also checked as NAME.tmp). With exit 2 the
 * whole stderr must be that one line: a sanitizer report, an assertion or a usage dump
 * fails the row. Every command runs under `timeout 60` (a hang fails the row with 124).
 *
 * The inputs are made once by the group setup: copies of the hf-tiny model with a config
 * edit, NaN/Inf poked into a weight, cut safetensors files; dumps written through
 * compare/dump.h with a missing stage, the wrong dtype or rank, mismatched T, 0-length
 * datasets, out-of-range teacher-forced selections; token and JSONL files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare/dump.h"
#include "tests/util.h"

typedef struct {
    const char *name;
    const char *cmd; /* sh; no single quotes (the row is written to a script file) */
    int rc;
    const char *msg; /* in the stderr line (rc 2), else in stdout+stderr */
    const char *gone; /* space-separated paths that must not exist (nor PATH.tmp) */
} row;

#define RUN "$M3 run --model good --ids \"1 2 3\" "
static const row rows[] = {
    /* ---- --help / --version of every subcommand ---- */
    {"help_info", "$M3 info --help", 0, "usage: m3 info", NULL},
    {"help_run", "$M3 run --help", 0, "usage: m3 run", NULL},
    {"help_replay", "$M3 replay --help", 0, "usage: m3 replay", NULL},
    {"help_compare", "$M3 compare --help", 0, "usage: m3 compare", NULL},
    {"help_attribute", "$M3 attribute --help", 0, "usage: m3 attribute", NULL},
    {"help_eval", "$M3 eval --help", 0, "usage: m3 eval gsm8k", NULL},
    {"help_eval_gsm8k", "$M3 eval gsm8k --help", 0, "usage: m3 eval gsm8k", NULL},
    {"help_quantize", "$M3 quantize --help", 0, "usage: m3 quantize", NULL},
    {"help_ls", "$M3 ls --help", 0, "usage: m3 ls", NULL},
    {"help_bench", "$M3 bench --help", 0, "usage: m3 bench", NULL},
    {"version", "$M3 --version", 0, "m3 0.", NULL},
    {"version_run", "$M3 run --version", 0, "m3 0.", NULL},
    {"version_compare", "$M3 compare --version", 0, "m3 0.", NULL},
    {"no_command", "$M3 frobnicate", 2, "unknown command 'frobnicate'", NULL},

    /* ---- m3 info ---- */
    {"info_no_dir", "$M3 info", 2, "need a MODEL_DIR", NULL},
    {"info_missing", "$M3 info nope", 2, "nope: no such file", NULL},
    {"info_empty_config", "$M3 info c_emptyfile", 2, "c_emptyfile/config.json: invalid JSON", NULL},
    {"info_config_is_dir", "$M3 info cfg_dir", 2, "cfg_dir/config.json: not a regular file", NULL},
    {"info_weights_is_dir", "$M3 info st_dir", 2, "st_dir: no model.safetensors", NULL},
    {"info_st_empty", "$M3 info st_empty", 2, "st_empty/model.safetensors: 0 bytes", NULL},
    {"info_st_truncated", "$M3 info st_trunc", 2, "outside the data region", NULL},
    {"info_st_header_only", "$M3 info st_hdr", 2, "outside the data region of 0 bytes", NULL},
    {"info_override_json", "$M3 info good --override \"{\"", 2, "invalid JSON", NULL},
    {"info_two_dirs", "$M3 info good good", 2, "more than one MODEL_DIR", NULL},

    /* ---- config values (m3 run loads and validates) ---- */
    {"cfg_theta_nan", RUN "--model c_theta_nan", 2, "c_theta_nan/config.json: invalid JSON", NULL},
    {"cfg_theta_1e400", RUN "--model c_theta_big", 2, "rope_theta must be finite", NULL},
    {"cfg_theta_neg", RUN "--model c_theta_neg", 2, "rope_theta = -1 must be > 0", NULL},
    {"cfg_theta_tiny", RUN "--model c_theta_tiny", 2, "rope_theta = 1e-300 must be > 0 and finite in float32", NULL},
    {"cfg_eps_zero", RUN "--model c_eps_zero", 2, "rms_norm_eps = 0 must be > 0", NULL},
    {"cfg_eps_huge", RUN "--model c_eps_huge", 2, "rms_norm_eps = 1e+300 must be > 0 and finite", NULL},
    {"cfg_eps_denormal", RUN "--model c_eps_tiny", 2, "rms_norm_eps = 1e-50", NULL},
    {"cfg_swiglu_limit_neg", RUN "--model c_lim_neg", 2, "swiglu_limit = -7 must be > 0", NULL},
    {"cfg_swiglu_limit_huge", RUN "--model c_lim_huge", 2, "swiglu_limit = 1e+300", NULL},
    {"cfg_swiglu_alpha_huge", RUN "--model c_alpha_huge", 2, "swiglu_alpha = 1e+300 must be finite", NULL},
    {"cfg_rsf_zero", RUN "--model c_rsf_zero", 2, "routed_scaling_factor = 0 must be > 0", NULL},
    {"cfg_rsf_neg", RUN "--model c_rsf_neg", 2, "routed_scaling_factor = -2 must be > 0", NULL},
    {"cfg_hidden_zero", RUN "--model c_hidden_zero", 2, "hidden_size must be positive", NULL},
    {"cfg_hidden_huge", RUN "--model c_hidden_huge", 2, "hidden_size = 1099511627776 is out of range", NULL},
    {"cfg_hidden_float", RUN "--model c_hidden_float", 2, "hidden_size must be an integer", NULL},
    {"cfg_vocab_mismatch", RUN "--model c_vocab_small", 2, "embed_tokens.weight has shape [512, 128], config implies [10, 128]", NULL},
    {"cfg_layers_huge", RUN "--model c_layers_huge", 2, "num_hidden_layers = 100000 is out of range", NULL},

    /* ---- weights ---- */
    {"run_model_is_file", "$M3 run --model good/config.json --ids 1", 2, "--model good/config.json: not a directory", NULL},
    {"replay_model_is_file", "$M3 replay --model good/model.safetensors --from ref.h5 --dump o.h5", 2, "not a directory", "o.h5"},
    {"run_model_missing", "$M3 run --model nope --ids 1", 2, "nope: no such file", NULL},
    {"run_st_truncated", "$M3 run --model st_trunc --ids 1", 2, "st_trunc/model.safetensors: tensor", NULL},
    {"run_st_empty", "$M3 run --model st_empty --ids 1", 2, "too short for a safetensors header", NULL},
    {"run_nan_weights", RUN "--model w_nan", 2, "NaN in stage logits (last position)", NULL},
    {"run_nan_weights_dump", RUN "--model w_nan --dump o.h5", 2, "NaN in stage layers/01/router_logits at flat index 0 of [3, 8]", "o.h5"},
    {"run_inf_weights_dump", RUN "--model w_inf --dump o.h5", 2, "NaN in stage layers/01/q_proj", "o.h5"},
    {"run_nan_embed_gen", "$M3 run --model w_nan --ids 0 --generate 2 --dump o.h5", 2, "passes/0000/embed", "o.h5"},
    {"run_nan_allowed", RUN "--model w_nan --dump ok_nan.h5 --allow-nonfinite", 0, "warning: non-finite activations: the first is NaN in stage layers/01/router_logits", NULL},

    /* ---- tokens ---- */
    {"tok_empty_file", "$M3 run --model good --tokens empty.txt", 2, "empty.txt: no token ids", NULL},
    {"tok_not_integer", "$M3 run --model good --tokens tok_bad.txt", 2, "tok_bad.txt: token 2 is not an integer", NULL},
    {"tok_float", "$M3 run --model good --tokens tok_float.txt", 2, "token 2 is not an integer", NULL},
    {"tok_out_of_range", "$M3 run --model good --tokens tok_oob.txt", 2, "token id 512 at position 1 is outside the vocabulary [0, 512)", NULL},
    {"tok_negative", "$M3 run --model good --ids \"1 -1\"", 2, "token id -1 at position 1", NULL},
    {"tok_overflow", "$M3 run --model good --ids \"1 99999999999999999999\"", 2, "token 1 is not an integer", NULL},
    {"tok_file_is_dir", "$M3 run --model good --tokens good", 2, "good: read error", NULL},
    {"tok_file_missing", "$M3 run --model good --tokens nope.txt", 2, "nope.txt: cannot open", NULL},
    {"tok_too_long", "$M3 run --model good --tokens tok_long.txt", 2, "5000 prompt tokens exceed max_position_embeddings 4096", NULL},
    {"ids_and_tokens", "$M3 run --model good --ids 1 --tokens empty.txt", 2, "exactly one of --tokens", NULL},

    /* ---- flags ---- */
    {"gen_negative", RUN "--generate -1", 2, "--generate wants an integer >= 0", NULL},
    {"gen_huge", RUN "--generate 99999999999", 2, "--generate wants an integer", NULL},
    {"gen_past_max_pos", RUN "--generate 1048576 --dump o.h5", 2, "3 prompt tokens + --generate N exceed max_position_embeddings 4096", "o.h5"},
    {"threads_zero", RUN "--threads 0", 2, "--threads wants an integer in 1..256, got '0'", NULL},
    {"threads_negative", RUN "--threads -1", 2, "--threads wants an integer", NULL},
    {"threads_huge", RUN "--threads 100000", 2, "got '100000'", NULL},
    {"override_bad_json", RUN "--override \"{\"", 2, "--override: invalid JSON", NULL},
    {"override_unknown_key", RUN "--override \"{\\\"foo\\\": 1}\"", 2, "unknown override 'foo'", NULL},
    {"override_wrong_type", RUN "--override \"{\\\"index_topk_freq\\\": \\\"x\\\"}\"", 2, "index_topk_freq must be an integer >= 1", NULL},
    {"override_not_object", RUN "--override \"[1]\"", 2, "expected a JSON object", NULL},
    {"profile_bad", RUN "--profile fp16", 2, "--profile must be fp32, hf or atom", NULL},
    {"variant_bad", RUN "--experts mxfp9", 2, "--experts must be", NULL},
    {"option_unknown", RUN "--bogus 1", 2, "unknown option '--bogus'", NULL},
    {"option_no_value", RUN "--profile", 2, "option --profile needs a value", NULL},

    /* ---- output paths ---- */
    {"dump_no_dir", RUN "--dump nodir/o.h5", 2, "nodir/o.h5: cannot create nodir/o.h5.tmp: No such file", "nodir/o.h5"},
    {"dump_under_file", RUN "--dump empty.txt/o.h5", 2, "empty.txt/o.h5: cannot create", "empty.txt/o.h5"},
    {"dump_is_dir", RUN "--dump good --force", 2, "good: is a directory", "good.tmp"},
    {"dump_empty_name", RUN "--dump \"\"", 2, "empty output file name", ".tmp"},
    {"dump_exists", RUN "--dump exists.h5", 2, "exists.h5: already exists (use --force", "exists.h5.tmp"},

    /* ---- m3 replay: malformed reference dumps ---- */
    {"replay_from_missing", "$M3 replay --model good --from nope.h5 --dump o.h5", 2, "nope.h5: no such file", "o.h5"},
    {"replay_from_not_hdf5", "$M3 replay --model good --from tok_bad.txt --dump o.h5", 2, "tok_bad.txt: not an HDF5 file", "o.h5"},
    {"replay_from_truncated", "$M3 replay --model good --from trunc.h5 --dump o.h5", 2, "trunc.h5", "o.h5"},
    {"replay_no_tokens", "$M3 replay --model good --from d_notok.h5 --dump o.h5", 2, "d_notok.h5: no 'tokens' stage", "o.h5"},
    {"replay_tokens_f32", "$M3 replay --model good --from d_tokf32.h5 --dump o.h5", 2, "stage 'tokens' is not a non-empty int32 vector", "o.h5"},
    {"replay_tokens_2d", "$M3 replay --model good --from d_tok2d.h5 --dump o.h5", 2, "stage 'tokens' is not a non-empty int32 vector", "o.h5"},
    {"replay_tokens_empty", "$M3 replay --model good --from d_tok0.h5 --dump o.h5", 2, "stage 'tokens' is not a non-empty int32 vector", "o.h5"},
    {"replay_tokens_oob", "$M3 replay --model good --from d_tokoob.h5 --dump o.h5", 2, "token id 9999 at position 2 is outside the vocabulary", "o.h5"},
    {"replay_positions_gap", "$M3 replay --model good --from d_posgap.h5 --dump o.h5", 2, "position 1 of token 2", "o.h5"},
    {"replay_positions_len", "$M3 replay --model good --from d_poslen.h5 --dump o.h5", 2, "positions has 2 entries for 3 tokens", "o.h5"},
    {"replay_no_input", "$M3 replay --model good --from d_noinput.h5 --dump o.h5", 2, "no stage 'layers/00/input'", "o.h5"},
    {"replay_input_shape", "$M3 replay --model good --from d_inshape.h5 --dump o.h5", 2, "layers/00/input", "o.h5"},
    {"replay_input_int", "$M3 replay --model good --from d_inint.h5 --dump o.h5", 2, "layers/00/input", "o.h5"},
    {"replay_other_model", "$M3 replay --model good --from $R/fixtures/tiny-moe/hf_fp32.h5 --dump o.h5", 2, "layers/00/input", "o.h5"},
    {"replay_expert_oob", "$M3 replay --model good --from d_expoob.h5 --dump o.h5 --ref-select", 2, "expert_ids", "o.h5"},
    {"replay_expert_neg", "$M3 replay --model good --from d_expneg.h5 --dump o.h5 --ref-select", 2, "expert_ids", "o.h5"},
    {"replay_topk_oob", "$M3 replay --model good --from d_topkoob.h5 --dump o.h5 --ref-select", 2, "block id 999 outside", "o.h5"},
    /* a wider -1-padded set is still a valid set of blocks */
    {"replay_topk_wide", "$M3 replay --model good --from d_topkwide.h5 --dump o.h5 --ref-select", 0, "dump: o.h5", NULL},
    {"replay_topk_f32", "$M3 replay --model good --from d_topkf32.h5 --dump o.h5 --ref-select", 2, "expected int32", "o.h5"},
    {"replay_nan_ref", "$M3 replay --model good --from d_nanin.h5 --dump o.h5", 2, "non-finite activations: the first is NaN in stage layers/00/input at flat index 5", "o.h5"},
    {"replay_no_dump", "$M3 replay --model good --from ref.h5", 2, "--dump OUT.h5 is required", NULL},

    /* ---- m3 compare / m3 ls ---- */
    {"compare_one_file", "$M3 compare ref.h5", 2, "need two dumps", NULL},
    {"compare_missing", "$M3 compare ref.h5 nope.h5", 2, "nope.h5: no such file", NULL},
    {"compare_empty_file", "$M3 compare ref.h5 empty.txt", 2, "empty.txt: not an HDF5 file", NULL},
    {"compare_dir", "$M3 compare ref.h5 good", 2, "good: not an HDF5 file", NULL},
    {"compare_truncated", "$M3 compare ref.h5 trunc.h5", 2, "trunc.h5", NULL},
    {"compare_no_attrs", "$M3 compare d_bare.h5 d_bare.h5 --quiet", 0, "", NULL},
    {"compare_other_T", "$M3 compare ref.h5 d_other_t.h5", 2, "different token counts", NULL},
    {"compare_shape", "$M3 compare d_a.h5 d_shape.h5 --json o.json", 2, "m3: layers/00/attn_norm: shape [3,128] in d_a.h5 but [3,64] in d_shape.h5", "o.json"},
    {"compare_rank", "$M3 compare d_a.h5 d_rank.h5 --json o.json", 2, "shape [3,128] in d_a.h5 but [384] in d_rank.h5", "o.json"},
    {"compare_dtype", "$M3 compare d_a.h5 d_dtype.h5 --json o.json", 2, "m3: layers/00/attn_norm: float in d_a.h5 but int32 in d_dtype.h5", "o.json"},
    {"compare_zero_len", "$M3 compare d_zero.h5 d_zero.h5 --json o.json", 0, "", NULL},
    {"compare_tol_missing", "$M3 compare ref.h5 ref.h5 --tol nope.json", 2, "nope.json: cannot open", NULL},
    {"compare_tol_malformed", "$M3 compare ref.h5 ref.h5 --tol tok_bad.txt", 2, "tok_bad.txt: invalid JSON", NULL},
    {"compare_tol_empty", "$M3 compare ref.h5 ref.h5 --tol empty.txt", 2, "empty.txt: invalid JSON", NULL},
    {"compare_tol_negative", "echo \"{\\\"stages\\\": {\\\"attn_out\\\": {\\\"nmse\\\": -1}}}\" > t.json && $M3 compare ref.h5 ref.h5 --tol t.json", 2, "t.json: stages.attn_out.nmse = -1: expected a finite number in [0, inf)", NULL},
    {"compare_tol_infinite", "echo \"{\\\"stages\\\": {\\\"*\\\": {\\\"nmse\\\": 1e400}}}\" > t.json && $M3 compare ref.h5 ref.h5 --tol t.json", 2, "stages.*.nmse = inf", NULL},
    {"compare_tol_fraction", "echo \"{\\\"stages\\\": {\\\"logits\\\": {\\\"top1_min\\\": {\\\"fp32\\\": 7}}}}\" > t.json && $M3 compare ref.h5 ref.h5 --tol t.json", 2, "stages.logits.top1_min = 7: expected a finite number in [0, 1]", NULL},
    {"compare_tol_dir", "$M3 compare ref.h5 ref.h5 --tol good", 2, "good: read error", NULL},
    {"compare_json_no_dir", "$M3 compare ref.h5 ref.h5 --json nodir/o.json", 2, "nodir/o.json: cannot create", "nodir/o.json"},
    {"compare_html_under_file", "$M3 compare ref.h5 ref.h5 --html empty.txt/o.html", 2, "empty.txt/o.html: cannot create", "empty.txt/o.html"},
    {"compare_json_is_dir", "$M3 compare ref.h5 ref.h5 --json good", 2, "good: is a directory", "good.tmp"},
    {"compare_pass_bad", "$M3 compare ref.h5 ref.h5 --pass -3", 2, "--pass wants 0..9999", NULL},
    {"compare_color_bad", "$M3 compare ref.h5 ref.h5 --color purple", 2, "--color wants auto", NULL},
    {"ls_none", "$M3 ls", 2, "need a dump", NULL},
    {"ls_not_hdf5", "$M3 ls tok_bad.txt", 2, "tok_bad.txt: not an HDF5 file", NULL},
    {"ls_truncated", "$M3 ls trunc.h5", 2, "trunc.h5", NULL},
    {"ls_no_attrs", "$M3 ls d_bare.h5", 0, "tokens", NULL},

    /* ---- m3 attribute ---- */
    {"attribute_nan_baseline", "$M3 attribute --model w_nan --ids \"1 2 3\" --factors hf --json o.json", 2, "baseline (fp32): stage layers/01/router_logits: NaN at flat index 0", "o.json"},
    {"attribute_factor_bad", "$M3 attribute --model good --ids 1 --factors bogus", 2, "unknown factor 'bogus'", NULL},
    {"attribute_factor_empty", "$M3 attribute --model good --ids 1 --factors \"\"", 2, "no factor named", NULL},
    {"attribute_mode_bad", "$M3 attribute --model good --ids 1 --mode x", 2, "--mode must be free, forced or both", NULL},
    {"attribute_json_under_file", "$M3 attribute --model good --ids 1 --factors hf --json empty.txt/o.json", 2, "empty.txt/o.json: cannot create", "empty.txt/o.json"},
    {"attribute_html_is_dir", "$M3 attribute --model good --ids 1 --factors hf --html good", 2, "good: is a directory", "good.tmp"},
    {"attribute_tokens_bad", "$M3 attribute --model good --tokens tok_bad.txt", 2, "tok_bad.txt: token 2 is not an integer", NULL},

    /* ---- m3 eval gsm8k ---- */
    {"eval_no_task", "$M3 eval", 2, "need a task", NULL},
    {"eval_task_bad", "$M3 eval mmlu", 2, "unknown task 'mmlu'", NULL},
    {"eval_no_input", "$M3 eval gsm8k", 2, "need --responses FILE", NULL},
    {"eval_resp_missing", "$M3 eval gsm8k --responses nope.jsonl", 2, "nope.jsonl: cannot open", NULL},
    {"eval_resp_dir", "$M3 eval gsm8k --responses good", 2, "good: read error", NULL},
    {"eval_resp_empty", "$M3 eval gsm8k --responses empty.txt", 2, "empty.txt: no responses", NULL},
    {"eval_resp_malformed", "$M3 eval gsm8k --responses r_trunc.jsonl --json o.json", 2, "r_trunc.jsonl:1: not a JSON object", "o.json"},
    {"eval_resp_no_response", "$M3 eval gsm8k --responses r_noresp.jsonl", 2, "r_noresp.jsonl:1: missing string field \"response\"", NULL},
    {"eval_resp_answer_number", "$M3 eval gsm8k --responses r_numans.jsonl", 2, "missing string field \"answer\"", NULL},
    {"eval_resp_not_utf8", "$M3 eval gsm8k --responses r_utf8.jsonl --json o.json", 2, "r_utf8.jsonl:2: not valid UTF-8", "o.json"},
    {"eval_resp_array", "$M3 eval gsm8k --responses r_arr.jsonl", 2, "r_arr.jsonl:1: not a JSON object", NULL},
    {"eval_min_acc_bad", "$M3 eval gsm8k --responses r_ok.jsonl --min-accuracy nan", 2, "--min-accuracy 'nan': expected 0..1", NULL},
    {"eval_json_under_file", "$M3 eval gsm8k --responses r_ok.jsonl --json empty.txt/o.json", 2, "cannot create", "empty.txt/o.json"},
    {"eval_json_is_dir", "$M3 eval gsm8k --responses r_ok.jsonl --json good", 2, "good: is a directory", NULL},
    {"eval_model_json_no_dir", "$M3 eval gsm8k --model tok --data $R/fixtures/arith/test.jsonl --json nodir/o.json", 2, "nodir/o.json: cannot create: nodir is not a directory", "nodir/o.json"},
    {"eval_samples_is_dir", "$M3 eval gsm8k --model tok --data $R/fixtures/arith/test.jsonl --samples good", 2, "good: is a directory", NULL},
    {"eval_json_empty_name", "$M3 eval gsm8k --responses r_ok.jsonl --json \"\"", 2, "empty output file name", NULL},
    {"eval_model_no_tokenizer", "$M3 eval gsm8k --model good --data $R/fixtures/arith/test.jsonl --limit 1", 2, "good/tokenizer.json: cannot open", NULL},
    {"eval_model_nan", "$M3 eval gsm8k --model tok_nan --data $R/fixtures/arith/test.jsonl --limit 1 --max-gen-toks 2 --variants fp32 --json o.json", 2, "logit 0 is NaN", "o.json"},
    {"eval_model_limit_bad", "$M3 eval gsm8k --model tok --data $R/fixtures/arith/test.jsonl --limit 0", 2, "--limit '0'", NULL},
    {"eval_model_data_bad", "$M3 eval gsm8k --model tok --data r_trunc.jsonl", 2, "r_trunc.jsonl:1: not a JSON object", NULL},
    {"eval_model_variant_bad", "$M3 eval gsm8k --model tok --data $R/fixtures/arith/test.jsonl --variants fp33", 2, "variant 'fp33'", NULL},

    /* ---- m3 quantize ---- */
    {"quantize_no_args", "$M3 quantize", 2, "--model DIR and --out DIR are required", NULL},
    {"quantize_model_missing", "$M3 quantize --model nope --out q", 2, "nope: no such file", "q"},
    {"quantize_out_exists", "$M3 quantize --model good --out qexist", 2, "qexist exists (use --force", NULL},
    {"quantize_force_foreign_dir", "$M3 quantize --model good --out qexist --force; rc=$?; test -f qexist/mine.txt || exit 9; exit $rc", 2, "qexist: holds 'mine.txt'", NULL},
    {"quantize_force_onto_model", "$M3 quantize --model qsrc --out qsrc --force; rc=$?; test -f qsrc/model.safetensors -a -f qsrc/config.json || exit 9; exit $rc", 2, "qsrc: --out is the --model directory", NULL},
    {"quantize_out_under_file", "$M3 quantize --model good --out empty.txt/q", 2, "cannot create", "empty.txt/q"},
    {"quantize_out_empty", "$M3 quantize --model good --out \"\"", 2, "--out: empty directory name", ".tmp"},
    {"quantize_st_truncated", "$M3 quantize --model st_trunc --out q", 2, "st_trunc/model.safetensors", "q"},
    {"quantize_experts_bad", "$M3 quantize --model good --out q --experts bf16", 2, "--experts must be mxfp4 or mxfp8", "q"},

    /* ---- m3 bench: argument errors only ---- */
    {"bench_no_target", "$M3 bench", 2, "usage: m3 bench ref", NULL},
    {"bench_tokens_bad", "$M3 bench ref --tokens 5x", 2, "--tokens wants an integer in 1..1048576, got '5x'", NULL},
    {"bench_threads_huge", "$M3 bench ref --threads 100000", 2, "--threads wants an integer in 1..256", NULL},
    {"bench_tokens_gt_ctx", "$M3 bench ref --tokens 9 --ctx 4", 2, "--tokens 9 exceeds --ctx 4", NULL},
    {"bench_option_unknown", "$M3 bench ref --bogus", 2, "unknown option '--bogus'", NULL},
    {"bench_no_value", "$M3 bench ref --tokens", 2, "--tokens needs a value", NULL},
};

/* ---- input files ---------------------------------------------------------------------- */

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[len] = 0;
    *n = (size_t)len;
    return b;
}

static void spit(const char *name, const void *data, size_t n) {
    FILE *f = fopen(m3_tmp_path(name), "wb");
    if (!f || fwrite(data, 1, n, f) != n) m3_test_failf("cannot write %s", name);
    fclose(f);
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...) {
    char cmd[4096], full[4400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "cd '%s' && %s", m3_tmpdir(), cmd);
    char *out = NULL;
    if (m3_run_cmd(full, &out) != 0) m3_test_failf("setup: '%s' failed: %s", cmd, out);
    free(out);
}

/* the binary under test as an absolute path (the rows run in the scratch directory) */
static const char *bin(void) {
    static char p[2048];
    char root[1024];
    const char *b = m3_bin();
    if (b[0] == '/' || !getcwd(root, sizeof root)) return b;
    snprintf(p, sizeof p, "%s/%s", root, b);
    return p;
}

static const char *hf(void) {
    static char p[4096];
    char rel[1024];
    snprintf(rel, sizeof rel, "%s/fixtures/hf-tiny", m3_shared_dir());
    if (!realpath(rel, p)) snprintf(p, sizeof p, "%s", rel); /* symlinks must not be relative */
    return p;
}

/* dir/config.json = hf-tiny's with `from` replaced by `to`; weights linked */
static void cfg_edit(const char *dir, const char *from, const char *to) {
    char p[1200];
    size_t n;
    snprintf(p, sizeof p, "%s/model/config.json", hf());
    char *c = slurp(p, &n);
    if (!c) m3_test_failf("%s: cannot read", p);
    char *at = strstr(c, from);
    if (!at) m3_test_failf("hf-tiny config.json lacks '%s'", from);
    sh("mkdir -p %s && ln -sf '%s/model/model.safetensors' %s/", dir, hf(), dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(m3_tmp_path(p), "wb");
    assert_non_null(f);
    fwrite(c, 1, (size_t)(at - c), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    free(c);
}

/* Copy src_dir's model to dir with `val` (n bytes, repeated `rep` times) written over the
 * start of tensor `name`'s data. */
static void poke_weight(const char *src_dir, const char *dir, const char *name,
                        const void *val, size_t n, int rep) {
    char p[1200];
    size_t len;
    snprintf(p, sizeof p, "%s/model.safetensors", src_dir);
    char *b = slurp(p, &len);
    if (!b) m3_test_failf("%s: cannot read", p);
    uint64_t hl;
    memcpy(&hl, b, 8);
    char key[300];
    snprintf(key, sizeof key, "\"%s\"", name);
    char *at = strstr(b + 8, key), *off = at ? strstr(at, "\"data_offsets\"") : NULL;
    long long o0 = -1;
    if (!off || sscanf(strchr(off, '[') + 1, "%lld", &o0) != 1 || o0 < 0)
        m3_test_failf("%s: no data_offsets for %s", p, name);
    for (int r = 0; r < rep; r++)
        memcpy(b + 8 + hl + (size_t)o0 + (size_t)r * n, val, n);
    if (strcmp(src_dir, m3_tmp_path(dir)))
        sh("mkdir -p %s && cp '%s/config.json' %s/ && { cp '%s/tokenizer.json' %s/ 2>/dev/null || "
           "true; }",
           dir, src_dir, dir, src_dir, dir);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    spit(p, b, len);
    free(b);
}

static void dump_tensor(m3_dump *d, const char *key, m3_dtype dt, int rank, const int64_t *shape,
                        const void *data) {
    m3_tensor t = {.dtype = dt, .rank = rank, .data = (void *)data};
    memcpy(t.shape, shape, (size_t)rank * sizeof *shape);
    assert_int_equal(m3_dump_write(d, key, &t, NULL), M3_OK);
}

static m3_dump *dump_new(const char *name) {
    m3_dump *d;
    assert_int_equal(m3_dump_open(&d, m3_tmp_path(name), M3_DUMP_CREATE | M3_DUMP_FORCE), M3_OK);
    return d;
}

static void dump_done(m3_dump *d) {
    assert_int_equal(m3_dump_commit(d), M3_OK);
    m3_dump_close(d);
}

/* a dump of 3 tokens with only tokens + positions (and optionally layers/00/input) */
static void dump_small(const char *name, const int32_t *tok, int nt, const int32_t *pos, int np,
                       bool input) {
    m3_dump *d = dump_new(name);
    int64_t s1[1] = {nt}, s2[1] = {np};
    dump_tensor(d, "tokens", M3_DT_I32, 1, s1, tok);
    dump_tensor(d, "positions", M3_DT_I32, 1, s2, pos);
    if (input) {
        static float x[3 * 128];
        int64_t sx[2] = {nt, 128};
        dump_tensor(d, "layers/00/input", M3_DT_F32, 2, sx, x);
    }
    dump_done(d);
}

/* Copy src to dst; stage `key` replaced by `rep` (NULL rep.data: left out). */
static void dump_copy(const char *src, const char *dst, const char *key, const m3_tensor *rep) {
    m3_dump *a, *b = dump_new(dst);
    assert_int_equal(m3_dump_open(&a, m3_tmp_path(src), M3_DUMP_READ), M3_OK);
    char **keys;
    int n;
    assert_int_equal(m3_dump_list(a, &keys, &n), M3_OK);
    for (int i = 0; i < n; i++) {
        if (key && !strcmp(keys[i], key)) {
            if (rep && rep->data) assert_int_equal(m3_dump_write(b, key, rep, NULL), M3_OK);
            continue;
        }
        m3_tensor t;
        assert_int_equal(m3_dump_read(a, keys[i], &t), M3_OK);
        assert_int_equal(m3_dump_write(b, keys[i], &t, NULL), M3_OK);
        m3_tensor_free(&t);
    }
    m3_dump_list_free(keys, n);
    m3_dump_close(a);
    dump_done(b);
}

/* stage `key` of dump `src`, with element `i` of the int32 data set to `v` */
static void dump_poke_i32(const char *src, const char *dst, const char *key, int64_t i, int32_t v) {
    m3_dump *a;
    assert_int_equal(m3_dump_open(&a, m3_tmp_path(src), M3_DUMP_READ), M3_OK);
    m3_tensor t;
    assert_int_equal(m3_dump_read(a, key, &t), M3_OK);
    m3_dump_close(a);
    ((int32_t *)t.data)[i] = v;
    dump_copy(src, dst, key, &t);
    m3_tensor_free(&t);
}

static int setup(void **state) {
    if (m3_tmpdir_setup(state)) return -1;
    char cwd[1024];
    if (!getcwd(cwd, sizeof cwd)) return -1;
    /* models */
    sh("mkdir good && cp '%s/model/config.json' '%s/model/model.safetensors' good/ && "
       "ln -s '%s/hf_fp32.h5' ref.h5",
       hf(), hf(), hf());
    cfg_edit("c_theta_nan", "\"rope_theta\": 5000000.0", "\"rope_theta\": NaN");
    cfg_edit("c_theta_big", "\"rope_theta\": 5000000.0", "\"rope_theta\": 1e400");
    cfg_edit("c_theta_neg", "\"rope_theta\": 5000000.0", "\"rope_theta\": -1");
    cfg_edit("c_theta_tiny", "\"rope_theta\": 5000000.0", "\"rope_theta\": 1e-300");
    cfg_edit("c_eps_zero", "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 0");
    cfg_edit("c_eps_huge", "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 1e300");
    cfg_edit("c_eps_tiny", "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 1e-50");
    cfg_edit("c_lim_neg", "\"swiglu_limit\": 7.0", "\"swiglu_limit\": -7");
    cfg_edit("c_lim_huge", "\"swiglu_limit\": 7.0", "\"swiglu_limit\": 1e300");
    cfg_edit("c_alpha_huge", "\"swiglu_alpha\": 1.702", "\"swiglu_alpha\": 1e300");
    cfg_edit("c_rsf_zero", "\"routed_scaling_factor\": 2.0", "\"routed_scaling_factor\": 0");
    cfg_edit("c_rsf_neg", "\"routed_scaling_factor\": 2.0", "\"routed_scaling_factor\": -2");
    cfg_edit("c_hidden_zero", "\"hidden_size\": 128", "\"hidden_size\": 0");
    cfg_edit("c_hidden_huge", "\"hidden_size\": 128", "\"hidden_size\": 1099511627776");
    cfg_edit("c_hidden_float", "\"hidden_size\": 128", "\"hidden_size\": 128.5");
    cfg_edit("c_vocab_small", "\"vocab_size\": 512", "\"vocab_size\": 10");
    cfg_edit("c_layers_huge", "\"num_hidden_layers\": 4", "\"num_hidden_layers\": 100000");
    cfg_edit("c_emptyfile", "{", "");
    sh("printf '' > c_emptyfile/config.json");
    sh("mkdir -p cfg_dir/config.json st_dir/model.safetensors && cp good/config.json st_dir/");
    sh("mkdir st_trunc st_empty st_hdr && cp good/config.json st_trunc/ && "
       "cp good/config.json st_empty/ && cp good/config.json st_hdr/ && "
       "head -c 1200000 good/model.safetensors > st_trunc/model.safetensors && "
       ": > st_empty/model.safetensors");
    {   /* header only: the 8-byte length + the JSON header, no data */
        size_t len;
        char *b = slurp(m3_tmp_path("good/model.safetensors"), &len);
        assert_non_null(b);
        uint64_t hl;
        memcpy(&hl, b, 8);
        spit("st_hdr/model.safetensors", b, 8 + hl);
        free(b);
    }
    const uint16_t bf_nan = 0x7fc0, bf_inf = 0x7f80;
    const float f_nan = __builtin_nanf("");
    /* the routing gate of layer 1 is fp32 in hf-tiny; NaN in its first 8 rows (every expert) */
    float gate_nan[8 * 128];
    for (int i = 0; i < 8 * 128; i++) gate_nan[i] = f_nan;
    poke_weight(m3_tmp_path("good"), "w_nan", "language_model.model.layers.1.block_sparse_moe.gate.weight",
                gate_nan, sizeof gate_nan, 1);
    /* and NaN in the embedding row of token 0 */
    poke_weight(m3_tmp_path("w_nan"), "w_nan", "language_model.model.embed_tokens.weight", &bf_nan, 2, 128);
    poke_weight(m3_tmp_path("good"), "w_inf", "language_model.model.layers.1.self_attn.q_proj.weight", &bf_inf, 2, 4);
    /* the eval model (tokenizer included), with NaN in the final norm weight */
    sh("mkdir tok && cp '%s/fixtures/tiny-deep/model/config.json' "
       "'%s/fixtures/tiny-deep/model/model.safetensors' tok/ && "
       "cp '%s/fixtures/tokenizer/qwen2.json' tok/tokenizer.json",
       cwd, cwd, cwd);
    poke_weight(m3_tmp_path("tok"), "tok_nan", "language_model.model.norm.weight", &bf_nan, 2, 4);
    sh("mkdir qexist qsrc && echo mine > qexist/mine.txt && cp good/* qsrc/");

    /* tokens and text files */
    sh("printf '' > empty.txt && printf '1 2 x' > tok_bad.txt && printf '1 2 3.5' > tok_float.txt "
       "&& printf '1 512' > tok_oob.txt && touch exists.h5");
    {
        char *t = malloc(5000 * 2 + 1);
        for (int i = 0; i < 5000; i++) memcpy(t + 2 * i, "5 ", 2);
        spit("tok_long.txt", t, 5000 * 2);
        free(t);
    }
    const char ok_line[] = "{\"answer\": \"x\\n#### 5\", \"response\": \"The answer is 5\"}\n";
    spit("r_ok.jsonl", ok_line, strlen(ok_line));
    const char *trunc = "{\"answer\": \"#### 5\", \"response\": \"x\"\n";
    spit("r_trunc.jsonl", trunc, strlen(trunc));
    const char *noresp = "{\"answer\": \"#### 5\"}\n";
    spit("r_noresp.jsonl", noresp, strlen(noresp));
    const char *numans = "{\"answer\": 5, \"response\": \"5\"}\n";
    spit("r_numans.jsonl", numans, strlen(numans));
    char utf8[256];
    int k = snprintf(utf8, sizeof utf8, "%s{\"answer\": \"#### 5\", \"response\": \"\xff\xfe 5\"}\n",
                     ok_line);
    spit("r_utf8.jsonl", utf8, (size_t)k);
    spit("r_arr.jsonl", "[1, 2]\n", 7);
    sh("head -c 3000 ref.h5 > trunc.h5");

    /* dumps */
    const int32_t tok3[3] = {1, 2, 3}, pos3[3] = {0, 1, 2}, oob3[3] = {1, 2, 9999},
                  gap3[3] = {0, 1, 1};
    dump_small("d_tokoob.h5", oob3, 3, pos3, 3, true);
    dump_small("d_posgap.h5", tok3, 3, gap3, 3, true);
    dump_small("d_poslen.h5", tok3, 3, pos3, 2, true);
    dump_small("d_noinput.h5", tok3, 3, pos3, 3, false);
    dump_small("d_tok0.h5", tok3, 0, pos3, 0, true);
    {
        m3_dump *d = dump_new("d_notok.h5");
        float x[3 * 128] = {0};
        int64_t s[2] = {3, 128};
        dump_tensor(d, "embed", M3_DT_F32, 2, s, x);
        dump_done(d);

        d = dump_new("d_tokf32.h5");
        const float ft[3] = {1, 2, 3};
        int64_t s1[1] = {3};
        dump_tensor(d, "tokens", M3_DT_F32, 1, s1, ft);
        dump_done(d);

        d = dump_new("d_tok2d.h5");
        int64_t s12[2] = {1, 3};
        dump_tensor(d, "tokens", M3_DT_I32, 2, s12, tok3);
        dump_done(d);

        d = dump_new("d_inshape.h5");
        dump_tensor(d, "tokens", M3_DT_I32, 1, s1, tok3);
        dump_tensor(d, "positions", M3_DT_I32, 1, s1, pos3);
        int64_t s64[2] = {3, 64};
        dump_tensor(d, "layers/00/input", M3_DT_F32, 2, s64, x);
        dump_done(d);

        d = dump_new("d_inint.h5");
        dump_tensor(d, "tokens", M3_DT_I32, 1, s1, tok3);
        dump_tensor(d, "positions", M3_DT_I32, 1, s1, pos3);
        int32_t xi[3 * 128] = {0};
        dump_tensor(d, "layers/00/input", M3_DT_I32, 2, s, xi);
        dump_done(d);

        /* the bare minimum: format attributes only (no producer, profile, model_config) */
        d = dump_new("d_bare.h5");
        dump_tensor(d, "tokens", M3_DT_I32, 1, s1, tok3);
        dump_tensor(d, "embed", M3_DT_F32, 2, s, x);
        dump_done(d);

        /* zero-length datasets on both sides */
        d = dump_new("d_zero.h5");
        int64_t s0[1] = {0}, s0h[2] = {0, 128};
        dump_tensor(d, "tokens", M3_DT_I32, 1, s0, tok3);
        dump_tensor(d, "embed", M3_DT_F32, 2, s0h, x);
        dump_tensor(d, "layers/00/output", M3_DT_F32, 2, s0h, x);
        dump_done(d);
    }
    /* a real run of 3 tokens, and copies of it with one stage broken */
    sh("'%s' run --model good --ids '1 2 3' --dump d_a.h5 >/dev/null", bin());
    sh("'%s' run --model good --ids '1 2 3 4 5' --dump d_other_t.h5 >/dev/null", bin());
    dump_poke_i32("d_a.h5", "d_expoob.h5", "layers/01/expert_ids", 0, 99);
    dump_poke_i32("d_a.h5", "d_expneg.h5", "layers/01/expert_ids", 1, -1);
    dump_poke_i32("d_a.h5", "d_topkoob.h5", "layers/01/index_topk", 0, 999);
    {
        float y[3 * 64] = {0};
        m3_tensor t = {.dtype = M3_DT_F32, .rank = 2, .shape = {3, 64}, .data = y};
        dump_copy("d_a.h5", "d_shape.h5", "layers/00/attn_norm", &t);
        m3_tensor r = {.dtype = M3_DT_F32, .rank = 1, .shape = {3 * 128}, .data = y};
        float yr[3 * 128] = {0};
        r.data = yr;
        dump_copy("d_a.h5", "d_rank.h5", "layers/00/attn_norm", &r);
        int32_t yi[3 * 128] = {0};
        m3_tensor ti = {.dtype = M3_DT_I32, .rank = 2, .shape = {3, 128}, .data = yi};
        dump_copy("d_a.h5", "d_dtype.h5", "layers/00/attn_norm", &ti);
        /* index_topk as float; and one much wider than the model's top-k */
        m3_dump *a;
        assert_int_equal(m3_dump_open(&a, m3_tmp_path("d_a.h5"), M3_DUMP_READ), M3_OK);
        m3_tensor tk;
        assert_int_equal(m3_dump_read(a, "layers/01/index_topk", &tk), M3_OK);
        m3_dump_close(a);
        int64_t n = m3_tensor_numel(&tk);
        float *tf = malloc((size_t)n * sizeof *tf);
        for (int64_t i = 0; i < n; i++) tf[i] = (float)((int32_t *)tk.data)[i];
        m3_tensor tkf = tk;
        tkf.dtype = M3_DT_F32;
        tkf.data = tf;
        dump_copy("d_a.h5", "d_topkf32.h5", "layers/01/index_topk", &tkf);
        free(tf);
        const int64_t W = 500, G = tk.shape[0], T = tk.shape[1];
        int32_t *wide = malloc((size_t)(G * T * W) * sizeof *wide);
        for (int64_t i = 0; i < G * T * W; i++) wide[i] = (int32_t)(i % W == 0 ? 0 : -1);
        m3_tensor tw = {.dtype = M3_DT_I32, .rank = 3, .shape = {G, T, W}, .data = wide};
        dump_copy("d_a.h5", "d_topkwide.h5", "layers/01/index_topk", &tw);
        free(wide);
        m3_tensor_free(&tk);
        /* a NaN in the teacher-forced input of layer 0 */
        float in[3 * 128] = {0};
        in[5] = f_nan;
        m3_tensor tn = {.dtype = M3_DT_F32, .rank = 2, .shape = {3, 128}, .data = in};
        dump_copy("d_a.h5", "d_nanin.h5", "layers/00/input", &tn);
    }
    return 0;
}

/* ---- one row ------------------------------------------------------------------------- */

static bool exists(const char *rel) {
    struct stat st;
    return lstat(m3_tmp_path(rel), &st) == 0;
}

static void run_row(void **state) {
    const row *r = *state;
    /* the rows share the directory: drop what an earlier row may have written */
    sh("rm -rf o.h5 o.json q ok_nan.h5");
    char script[4096];
    snprintf(script, sizeof script, "%s\n", r->cmd);
    spit("row.sh", script, strlen(script));
    char root[1024], cmd[4096];
    if (!getcwd(root, sizeof root)) fail_msg("getcwd");
    snprintf(cmd, sizeof cmd,
             "cd '%s' && M3='%s' HF='%s' R='%s' timeout 60 sh row.sh >row.out 2>row.err; echo $?",
             m3_tmpdir(), bin(), hf(), root);
    char *rcs = NULL;
    m3_run_cmd(cmd, &rcs);
    int rc = rcs ? atoi(rcs) : -1;
    free(rcs);
    size_t ne, no;
    char *err = slurp(m3_tmp_path("row.err"), &ne), *out = slurp(m3_tmp_path("row.out"), &no);
    assert_non_null(err);
    assert_non_null(out);
    const char *nl = strchr(err, '\n');
    bool one_line = ne > 0 && nl == err + ne - 1;
    bool ok = rc == r->rc;
    if (r->rc == 2)
        ok = ok && one_line && !strncmp(err, "m3: ", 4) && strstr(err, r->msg);
    else
        ok = ok && (ne == 0 || one_line) && (strstr(out, r->msg) || strstr(err, r->msg));
    if (!ok)
        fail_msg("%s: `%s`\n  want exit %d and one line with '%s'\n  got exit %d, stderr: %s",
                 r->name, r->cmd, r->rc, r->msg, rc, err);
    free(err);
    free(out);
    /* no output, complete or partial, is left behind */
    if (r->gone) {
        char list[512], *save = NULL;
        snprintf(list, sizeof list, "%s", r->gone);
        for (char *p = strtok_r(list, " ", &save); p; p = strtok_r(NULL, " ", &save)) {
            char tmp[600];
            snprintf(tmp, sizeof tmp, "%s.tmp", p);
            if (exists(p) || exists(tmp))
                fail_msg("%s: output %s (or its .tmp) was left behind", r->name, p);
        }
    }
}

int main(void) {
    enum { N = sizeof rows / sizeof rows[0] };
    static struct CMUnitTest tests[N];
    for (int i = 0; i < N; i++)
        tests[i] = (struct CMUnitTest){.name = rows[i].name,
                                       .test_func = run_row,
                                       .initial_state = (void *)&rows[i]};
    cmocka_set_test_filter(getenv("M3_TEST_FILTER"));
    return cmocka_run_group_tests_name("cmp_robust", tests, setup, m3_tmpdir_teardown);
}
