"""A random-weight Llama built locally, so tuned can run without a model hub.

``build_demo_model`` writes a complete Hugging Face model folder -- ``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json`` -- that both transformers
and vLLM load offline.  The weights are random (seeded), the tokenizer is a
byte-level BPE trained on a synthetic corpus generated in code, so nothing is
downloaded.  The generated text is gibberish; what matters for tuned is that the
engine does real work per token: the ``small`` size's decode step time grows
with the batch size on a few CPU cores, like a real model's does on a GPU.

Builds are deterministic (same size + seed -> byte-identical weights file and
tokenizer), idempotent (a folder whose ``tuned_demo.json`` manifest matches is
returned as is) and atomic (built in a temporary folder next to the target, then
renamed into place, under a lock file so concurrent builders do not race).

``model_form(spec)`` says what a ``model`` setting names (a folder, a demo model or a
Hugging Face id); ``resolve_model("demo:small", cache_dir)`` is how the rest of tuned
turns the setting into vLLM's ``--model``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

MANIFEST = "tuned_demo.json"
WEIGHTS = "model.safetensors"
# Bump when the folder layout or the recipe changes: old folders are rebuilt.
RECIPE_VERSION = 1
# The tokenizer corpus does not depend on the weight seed: every demo model of
# a size shares one tokenizer.
CORPUS_SEED = 1234

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (BOS, EOS, PAD)  # ids 0, 1, 2

# Plain-text chat format: "<|role|>\ncontent</s>\n" per message.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

Log = Callable[[str], None]


@dataclass(frozen=True)
class DemoSize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 2048
    corpus_sentences: int = 20_000
    lexicon_words: int = 4_000

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


SIZES: dict[str, DemoSize] = {
    # ~0.85M parameters: loads and generates in vLLM in seconds.
    "tiny": DemoSize(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, vocab_size=2048,
                     corpus_sentences=8_000, lexicon_words=1_500),
    # ~69M parameters: decode step time grows visibly with batch on 2 CPU cores.
    "small": DemoSize(hidden_size=768, num_hidden_layers=8, num_attention_heads=12,
                      intermediate_size=2048, vocab_size=8192,
                      corpus_sentences=40_000, lexicon_words=12_000),
}

# The dtype written to config.json and the weights file; vLLM's dtype="auto"
# picks it up.  bfloat16 runs faster than float32 in vLLM's CPU backend on
# AVX-512 BF16 / AMX machines and halves the file size.
TORCH_DTYPE = "bfloat16"
INITIALIZER_RANGE = 0.02


def param_count(size: str) -> int:
    """Parameters of the demo model of `size`, computed without building it."""
    s = _size(size)
    h, i, v, n = s.hidden_size, s.intermediate_size, s.vocab_size, s.num_hidden_layers
    per_layer = 4 * h * h + 3 * h * i + 2 * h  # q,k,v,o; gate,up,down; two RMSNorms
    return 2 * v * h + n * per_layer + h  # embed + untied lm_head, layers, final norm


def _size(size: str) -> DemoSize:
    try:
        return SIZES[size]
    except KeyError:
        raise ValueError(f"unknown demo model size {size!r}; choose one of "
                         f"{', '.join(SIZES)}") from None


# --------------------------------------------------------------------------- corpus

_WORDS = """
the of and to in is was for on that with as by at from it he she they we you
his her their our this these those an be are were been has have had not but or
which one all would there what so up out if about who get them make can like
time no just him know take people into year your good some could see other than
then now look only come its over think also back after use two how work first
well way even new want because any give day most us model batch token request
queue engine cache memory latency throughput server client step decode prefill
scheduler budget policy curve sample window metric rate load burst steady slow
fast small large tiny long short early late high low peak mean median tail
value number count limit ceiling floor target goal error signal noise trend
river mountain forest city road bridge garden window door table chair book
paper letter music color light water fire stone cloud rain snow wind summer
winter morning evening night market village harbor island valley field farm
""".split()

_ONSETS = ("b bl br c ch cl cr d dr f fl fr g gl gr h j k l m n p ph pl pr qu r "
           "s sc sh sk sl sm sn sp st str sw t th tr tw v w wh y z").split()
_VOWELS = "a e i o u ai ea ee ie oa oo ou y".split()
_CODAS = ("", "", "", "b", "ck", "d", "ft", "g", "l", "ld", "lt", "m", "mp", "n",
          "nd", "ng", "nk", "nt", "p", "r", "rd", "rk", "rn", "s", "sh", "sk", "ss",
          "st", "t", "th", "x")
_PUNCT = (".", ".", ".", "!", "?", ";")


def _lexicon(rng: random.Random, n: int) -> list[str]:
    """`n` distinct words: the fixed English list, then pronounceable nonsense."""
    words = list(dict.fromkeys(_WORDS))
    seen = set(words)
    while len(words) < n:
        w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                    for _ in range(rng.choice((1, 2, 2, 3, 3, 4))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def corpus(size: str, seed: int = CORPUS_SEED) -> Iterator[str]:
    """Deterministic training text for the tokenizer of `size` (one line per item)."""
    s = _size(size)
    rng = random.Random(seed)
    lex = _lexicon(rng, s.lexicon_words)
    # Zipf-like weights: early (English) words are frequent, the tail is rare.
    cum_weights = list(itertools.accumulate(1.0 / (k + 1) ** 0.9 for k in range(len(lex))))
    for _ in range(s.corpus_sentences):
        k = rng.randint(4, 18)
        ws = rng.choices(lex, cum_weights=cum_weights, k=k)
        if rng.random() < 0.15:
            ws.insert(rng.randrange(len(ws)), str(rng.randint(0, 10 ** rng.randint(1, 5))))
        if rng.random() < 0.2:
            j = rng.randrange(len(ws))
            ws[j] = ws[j] + ","
        text = " ".join(ws)
        yield text[0].upper() + text[1:] + rng.choice(_PUNCT)
    # Every printable ASCII character, so short symbols get tokens of their own.
    yield "".join(chr(c) for c in range(32, 127))


# --------------------------------------------------------------------------- build

def _train_tokenizer(size: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    s = _size(size)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=s.vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(size), trainer=trainer)
    if tok.get_vocab_size() != s.vocab_size:
        raise RuntimeError(f"tokenizer corpus too small: trained {tok.get_vocab_size()} "
                           f"tokens, wanted {s.vocab_size}")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


def _write_tokenizer(tok, out: Path, size: str) -> None:
    tok.save(str(out / "tokenizer.json"))
    s = _size(size)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": s.max_position_embeddings,
        "padding_side": "left",
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json",
                {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD})


def _llama_config(size: str, tok):
    from transformers import LlamaConfig

    s = _size(size)
    return LlamaConfig(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_attention_heads,
        head_dim=s.head_dim,
        max_position_embeddings=s.max_position_embeddings,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        pad_token_id=tok.token_to_id(PAD),
        dtype=TORCH_DTYPE,
    )


def _build_weights(size: str, seed: int, tok, out: Path) -> int:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    config = _llama_config(size, tok)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Overwrite every parameter from one seeded CPU generator, in name order, so
    # the weights depend only on (size, seed) and not on transformers' own init.
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32)
                        * INITIALIZER_RANGE)
    model = model.to(getattr(torch, TORCH_DTYPE))
    n_params = sum(p.numel() for p in model.parameters())
    with _quiet_transformers():
        model.save_pretrained(out, safe_serialization=True, max_shard_size="100GB")
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(out)
    return n_params


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars (its "Writing model shards" tqdm)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _publish_modes(folder: Path) -> None:
    """Give `folder` (made 0700 by mkdtemp) and its files the umask's modes."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "transformers", "tokenizers", "safetensors"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "missing"
    return out


def read_manifest(model_dir: Path) -> dict | None:
    """The folder's ``tuned_demo.json``, or None if absent or unreadable."""
    try:
        return json.loads((Path(model_dir) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


_REQUIRED = (WEIGHTS, "config.json", "generation_config.json", "tokenizer.json",
             "tokenizer_config.json")


def _is_current(out_dir: Path, size: str, seed: int) -> dict | None:
    m = read_manifest(out_dir)
    if not m or m.get("size") != size or m.get("seed") != seed \
            or m.get("recipe_version") != RECIPE_VERSION:
        return None
    if not all((out_dir / f).is_file() for f in _REQUIRED):
        return None
    if (out_dir / WEIGHTS).stat().st_size != m.get("weights_bytes"):
        return None
    return m


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (a no-op where fcntl is unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_demo_model(out_dir: Path, size: str = "tiny", seed: int = 0, force: bool = False,
                     log: Log | None = None) -> Path:
    """Build the demo Llama of `size` from `seed` into `out_dir`; return `out_dir`.

    Returns at once if `out_dir` already holds that model (per its manifest),
    unless `force`.  An existing demo model of another size/seed is replaced; a
    non-empty folder without a manifest is never touched (FileExistsError).
    The build happens in a temporary folder next to `out_dir`, renamed into place
    at the end, under the lock file ``.<name>.lock`` beside it (left behind).
    `log` receives one line per stage.
    """
    _size(size)
    say: Log = log or (lambda _msg: None)
    out_dir = Path(out_dir).absolute()
    if not force and _is_current(out_dir, size, seed):
        say(f"demo model {size} seed={seed} already built in {out_dir}")
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _lock(out_dir.parent / f".{out_dir.name}.lock"):
        # Another process may have finished the same build while we waited.
        if not force and _is_current(out_dir, size, seed):
            say(f"demo model {size} seed={seed} already built in {out_dir}")
            return out_dir
        if out_dir.exists() and (not out_dir.is_dir() or (
                any(out_dir.iterdir()) and read_manifest(out_dir) is None)):
            # Never replace (and delete) something that is not a demo model.
            raise FileExistsError(f"{str(out_dir)!r} exists and is not a tuned demo model "
                                  f"folder (no {MANIFEST}); refusing to overwrite it")
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build-", dir=out_dir.parent))
        try:
            say(f"training {_size(size).vocab_size}-token byte-level BPE tokenizer")
            tok = _train_tokenizer(size)
            _write_tokenizer(tok, tmp, size)
            say(f"initialising {size} Llama weights (seed={seed}, {TORCH_DTYPE})")
            n_params = _build_weights(size, seed, tok, tmp)
            say(f"hashing {WEIGHTS}")
            manifest = {
                "size": size,
                "seed": seed,
                "recipe_version": RECIPE_VERSION,
                "architecture": "LlamaForCausalLM",
                "dtype": TORCH_DTYPE,
                "param_count": n_params,
                "vocab_size": tok.get_vocab_size(),
                "config": dataclasses.asdict(_size(size)),
                "weights_file": WEIGHTS,
                "weights_bytes": (tmp / WEIGHTS).stat().st_size,
                "weights_sha256": _sha256(tmp / WEIGHTS),
                "tokenizer_sha256": _sha256(tmp / "tokenizer.json"),
                "versions": _versions(),
            }
            _write_json(tmp / MANIFEST, manifest)
            _publish_modes(tmp)
            say(f"moving into place at {out_dir}")
            old = None
            if out_dir.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-",
                                            dir=out_dir.parent))
                os.rename(out_dir, old / "m")
            os.rename(tmp, out_dir)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        say(f"built demo model {size}: {n_params:,} parameters in "
            f"{time.monotonic() - t0:.1f}s")
    return out_dir


#: the context length tuned serves a demo model at unless the config sets
#: ``max_model_len`` (the models know 2048 positions; every demo run so far used this)
DEMO_MAX_MODEL_LEN = 1024

MODEL_FORMS = ("folder", "demo", "hf_id")
# A Hugging Face repository id: ``name`` or ``owner/name``, letters, digits, ``-``, ``_``
# and ``.``, at most 96 characters (the hub's own rule), no ``--`` or ``..``.
_HF_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")


def _looks_like_path(spec: str) -> bool:
    return (spec.startswith(("/", "./", "../", "~")) or spec in (".", "..")
            or spec.count("/") > 1 or "\\" in spec)


def model_form(spec: str) -> str:
    """What the ``model`` setting names, the one reading ``tuned check-config``,
    ``tuned serve`` and tuned's scheduler share: ``"folder"`` (an existing model
    folder), ``"demo"`` (``demo:<size>``, built locally) or ``"hf_id"`` (a Hugging
    Face id such as ``meta-llama/Llama-2-7b-hf``, passed to vLLM unchanged; nothing
    here downloads). A path-like setting (``/``, ``./``, ``~`` or more than one
    ``/``) must be an existing folder. :class:`ValueError` with one line otherwise."""
    if spec.startswith("demo:"):
        size = spec.removeprefix("demo:")
        if size not in SIZES:
            raise ValueError(f"unknown demo model {spec!r}; choose one of "
                             f"{', '.join('demo:' + s for s in SIZES)}")
        return "demo"
    if spec.strip() and Path(spec).expanduser().is_dir():
        return "folder"
    if not _looks_like_path(spec) and len(spec) <= 96 and _HF_ID.fullmatch(spec) \
            and "--" not in spec and ".." not in spec:
        return "hf_id"
    demos = " / ".join("demo:" + s for s in SIZES)
    if _looks_like_path(spec):
        raise ValueError(f"model folder {os.path.expanduser(spec)!r} does not exist (or "
                         f"is not a folder); pass an existing model folder, a Hugging Face "
                         f"id (owner/name) or {demos}")
    raise ValueError(f"{spec!r} is neither an existing model folder nor a Hugging Face id "
                     f"(owner/name); pass one of those (a folder here as ./name) or {demos}")


def resolve_model(spec: str, cache_dir: Path, log: Log | None = None) -> str:
    """Turn the ``model`` setting into what vLLM's ``--model`` gets.

    ``demo:<size>`` builds (if needed) the demo model into ``cache_dir/<size>`` and
    gives its folder; a folder gives its absolute path; a Hugging Face id is passed
    through (vLLM resolves it). :func:`model_form` decides which; its
    :class:`ValueError` is raised as :class:`FileNotFoundError` for a missing folder.
    """
    try:
        form = model_form(spec)
    except ValueError as e:
        if spec.startswith("demo:"):
            raise
        raise FileNotFoundError(str(e)) from None
    if form == "demo":
        size = spec.removeprefix("demo:")
        return str(build_demo_model(Path(cache_dir) / size, size=size, log=log))
    if form == "folder":
        return str(Path(spec).expanduser().absolute())
    return spec
