"""The locally built demo model: determinism, idempotence, tokenizer, vLLM loading."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tuned.base import demo_model
from tuned.base.demo_model import (MANIFEST, SIZES, WEIGHTS, build_demo_model, param_count,
                              model_form, read_manifest, resolve_model)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo") / "tiny", size="tiny", seed=0)


# ------------------------------------------------------------------ build & determinism

def test_tiny_folder_layout_and_manifest(tiny):
    for f in ("config.json", "generation_config.json", WEIGHTS, "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json", MANIFEST):
        assert (tiny / f).is_file(), f
    m = read_manifest(tiny)
    assert m["size"] == "tiny" and m["seed"] == 0
    assert m["weights_sha256"] == sha256(tiny / WEIGHTS)
    assert m["weights_bytes"] == (tiny / WEIGHTS).stat().st_size
    assert m["param_count"] == param_count("tiny") == 852_608
    assert set(m["versions"]) >= {"torch", "transformers", "tokenizers"}
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] >= 32
    assert cfg["vocab_size"] == 2048
    assert cfg["max_position_embeddings"] == 2048
    assert cfg["dtype"] == m["dtype"] == demo_model.TORCH_DTYPE
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (0, 1, 2)
    # No temporary build folders left next to it.
    assert [p.name for p in tiny.parent.iterdir() if ".build-" in p.name] == []


def test_same_seed_identical_weights_other_seed_differs(tiny, tmp_path):
    again = build_demo_model(tmp_path / "again", size="tiny", seed=0)
    other = build_demo_model(tmp_path / "other", size="tiny", seed=1)
    assert sha256(again / WEIGHTS) == sha256(tiny / WEIGHTS)
    assert sha256(again / "tokenizer.json") == sha256(tiny / "tokenizer.json")
    assert sha256(other / WEIGHTS) != sha256(tiny / WEIGHTS)
    assert read_manifest(other)["seed"] == 1
    assert read_manifest(other)["weights_sha256"] == sha256(other / WEIGHTS)


def test_idempotent_unless_forced(tmp_path):
    lines: list[str] = []
    out = build_demo_model(tmp_path / "m", size="tiny", seed=0, log=lines.append)
    assert len(lines) == 5 and lines[-1].startswith("built demo model tiny")
    mtime = (out / WEIGHTS).stat().st_mtime_ns
    digest = sha256(out / WEIGHTS)

    lines.clear()
    assert build_demo_model(out, size="tiny", seed=0, log=lines.append) == out
    assert len(lines) == 1 and "already built" in lines[0]
    assert (out / WEIGHTS).stat().st_mtime_ns == mtime

    lines.clear()
    build_demo_model(out, size="tiny", seed=0, force=True, log=lines.append)
    assert len(lines) == 5
    assert sha256(out / WEIGHTS) == digest

    # A different seed in the same folder replaces the model.
    build_demo_model(out, size="tiny", seed=7)
    assert read_manifest(out)["seed"] == 7
    assert sha256(out / WEIGHTS) != digest


def test_default_is_silent(tmp_path, capsys):
    build_demo_model(tmp_path / "m", size="tiny")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_model, "_build_weights", boom)
    with pytest.raises(KeyboardInterrupt):
        build_demo_model(tmp_path / "m", size="tiny")
    assert not (tmp_path / "m").exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_interrupted_rebuild_keeps_old_model(tiny, tmp_path, monkeypatch):
    out = build_demo_model(tmp_path / "m", size="tiny", seed=0)
    monkeypatch.setattr(demo_model, "_build_weights",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("disk full")))
    with pytest.raises(RuntimeError, match="disk full"):
        build_demo_model(out, size="tiny", seed=0, force=True)
    assert read_manifest(out)["seed"] == 0
    assert sha256(out / WEIGHTS) == sha256(tiny / WEIGHTS)


def test_refuses_to_overwrite_a_foreign_folder(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="mine"):
        build_demo_model(foreign, size="tiny", force=True)
    assert (foreign / "notes.txt").read_text() == "keep me"


# ------------------------------------------------------------------ tokenizer

def test_tokenizer_loads_offline_and_round_trips(tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    assert len(tok) == SIZES["tiny"].vocab_size == 2048
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)

    texts = [
        "Hello, World! The scheduler ran 42 steps; p99 latency=3.5ms.",
        "  leading spaces, trailing spaces  ",
        "tabs\tand\nnewlines\r\nand symbols ~`!@#$%^&*()_+-={}[]|\\:;\"'<>,.?/",
        "".join(chr(c) for c in range(32, 127)),
        "",
    ]
    for text in texts:
        ids = tok.encode(text)
        assert ids[0] == tok.bos_token_id
        assert tok.decode(ids, skip_special_tokens=True) == text
        assert all(0 <= i < 2048 for i in ids)
    # The BPE actually merged: common words are single tokens.
    assert len(tok.encode("the model", add_special_tokens=False)) == 2

    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<s><|user|>\nhi</s>\n<|assistant|>\n"


# ------------------------------------------------------------------ sizes

def test_param_counts():
    assert param_count("tiny") < 5_000_000
    assert 50_000_000 <= param_count("small") <= 100_000_000
    assert param_count("small") == 69_219_072
    for s in SIZES.values():
        assert s.head_dim >= 32 and s.hidden_size % s.num_attention_heads == 0
    with pytest.raises(ValueError, match="huge"):
        param_count("huge")


@pytest.mark.slow
@pytest.mark.parallel
def test_small_builds_with_expected_params(tmp_path):
    out = build_demo_model(tmp_path / "small", size="small", seed=0)
    m = read_manifest(out)
    assert m["param_count"] == param_count("small")
    assert 50_000_000 <= m["param_count"] <= 100_000_000
    assert m["vocab_size"] == 8192
    # bfloat16: two bytes a parameter, plus the safetensors header.
    assert 0 < m["weights_bytes"] - 2 * m["param_count"] < 100_000


# ------------------------------------------------------------------ resolve_model

def test_resolve_model_missing_path_names_it(tmp_path):
    missing = tmp_path / "no" / "such-model"
    with pytest.raises(FileNotFoundError) as e:
        resolve_model(str(missing), tmp_path)
    assert str(missing) in str(e.value)


def test_resolve_model_paths_and_demo(tiny, tmp_path):
    assert resolve_model(str(tiny), tmp_path / "cache") == str(tiny)
    got = resolve_model("demo:tiny", tmp_path / "cache")
    assert got == str((tmp_path / "cache" / "tiny").absolute())
    assert sha256(Path(got) / WEIGHTS) == sha256(tiny / WEIGHTS)
    with pytest.raises(ValueError, match="huge"):
        resolve_model("demo:huge", tmp_path / "cache")


def test_resolve_model_passes_a_hugging_face_id_through(tmp_path):
    # nothing is downloaded or built: vLLM gets the id as written
    assert resolve_model("meta-llama/Llama-2-7b-hf", tmp_path / "cache") == \
        "meta-llama/Llama-2-7b-hf"
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------ model_form

@pytest.mark.parametrize("spec, form", [
    ("demo:tiny", "demo"), ("demo:small", "demo"),
    ("meta-llama/Llama-2-7b-hf", "hf_id"), ("gpt2", "hf_id"),
    ("Qwen/Qwen2.5-7B-Instruct", "hf_id"), ("org_1/model.v2-x", "hf_id"),
])
def test_model_form_names(spec, form):
    assert model_form(spec) == form


def test_model_form_folder(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    assert model_form(str(tmp_path / "m")) == "folder"
    monkeypatch.chdir(tmp_path)
    # an existing relative folder is a folder, even where it would read as an id
    assert model_form("m") == "folder"
    assert model_form("./m") == "folder"


@pytest.mark.parametrize("spec, message", [
    ("/models/Llama-2-7b-hf", "model folder '/models/Llama-2-7b-hf' does not exist (or is "
     "not a folder); pass an existing model folder, a Hugging Face id (owner/name) or "
     "demo:tiny / demo:small"),
    ("./nope", "model folder './nope' does not exist"),
    ("a/b/c", "model folder 'a/b/c' does not exist"),
    ("demo:huge", "unknown demo model 'demo:huge'; choose one of demo:tiny, demo:small"),
    ("two words", "'two words' is neither an existing model folder nor a Hugging Face id "
     "(owner/name); pass one of those (a folder here as ./name) or demo:tiny / demo:small"),
    ("", "'' is neither"), ("a--b/c", "'a--b/c' is neither"), ("x" * 97, "is neither"),
])
def test_model_form_refuses(spec, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        model_form(spec)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_resolve_model_missing_folder_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model("/models/none-here", tmp_path)


# ------------------------------------------------------------------ vLLM

@pytest.mark.slow
@pytest.mark.parallel
@pytest.mark.timeout(600)
def test_tiny_generates_in_vllm(tiny, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from vllm import LLM, SamplingParams

    from serve_harness import engine_dtype  # TUNED_TEST_DTYPE, else this CPU's choice

    llm = LLM(model=str(tiny), tokenizer=str(tiny), max_model_len=512, max_num_seqs=4,
              enforce_eager=True, dtype=engine_dtype(), seed=0)
    try:
        outs = llm.generate(["Hello world", "The scheduler sent a batch"],
                            SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
        assert len(outs) == 2
        assert [len(o.outputs[0].token_ids) for o in outs] == [16, 16]
        assert all(o.prompt_token_ids[0] == 0 for o in outs)  # BOS prepended
        assert all(0 <= t < 2048 for o in outs for t in o.outputs[0].token_ids)

        chat = llm.chat([{"role": "user", "content": "hi"}],
                        SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
        assert len(chat[0].outputs[0].token_ids) == 8
        assert chat[0].prompt_token_ids.count(0) == 1  # one BOS: the template's
    finally:
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None:
            core.shutdown()
        del llm
