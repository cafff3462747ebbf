"""The model a run continues from (`model.init_from`): files, identity, shape, tokenizer, checks against the run.
docs/configuration.md#continued-pretraining-modelinit_from

    base = BaseModelRef.of(cfg)  # None without model.init_from (tokenizer_ref: tokenizer.from_pretrained)
    check_base(cfg, base)        # validate: conflicting shape settings, max_length, tokenizer"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cached_property

from mlm_tasks import storage
from mlm_tasks.config import SPECIAL_TOKENS, PipelineConfig
from mlm_tasks.config.training import POSITION_OFFSET
from mlm_tasks.errors import ConfigError
from mlm_tasks.hub.api import DEFAULT_TIMEOUT_S
from mlm_tasks.hub.download import REVISION_SETTING, download_file, resolve_revision
from mlm_tasks.paths import join

WEIGHT_FILES = ("tf_model.h5", "model.safetensors")  # in the order they are preferred
READ_FILES = ("config.json", "tokenizer.json", *WEIGHT_FILES)  # what the identity of a folder covers
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings")


def where(uri: str, setting: str = "model.init_from") -> str:
    """ "gs", "local" or "hub": how `uri` is read. An existing local folder wins over a Hub id."""
    if storage.scheme(uri) == "gs":
        return "gs"
    if storage.is_local(uri) and os.path.isdir(storage.local_path(uri)):
        return "local"
    if uri.count("/") == 1 and not uri.startswith(("/", ".", "file://")):
        return "hub"
    raise ConfigError(
        f"{setting} {uri!r} is neither an existing local folder, a gs:// folder, nor a Hub "
        "repo id (owner/name): fix the path."
    )


class BaseModelRef:
    def __init__(
        self,
        uri: str,
        revision: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        setting: str = "model.init_from",
    ):
        self.uri, self.kind, self.timeout_s, self.setting = uri, where(uri, setting), timeout_s, setting
        if revision and self.kind != "hub":
            raise ConfigError(
                f"{REVISION_SETTING.get(setting)} {revision!r} is for a Hub repo, but {setting} {uri} is a "
                "folder: leave the revision empty (a folder is identified by its files)."
            )
        self.revision = revision

    @classmethod
    def of(cls, cfg: PipelineConfig) -> BaseModelRef | None:
        m = cfg.model
        return cls(m.init_from, m.init_revision, cfg.publish.request_timeout_s) if m.init_from else None

    @classmethod
    def pinned(cls, cfg: PipelineConfig, recorded: dict | None) -> BaseModelRef | None:
        """The base exactly as the shard set's manifest recorded it (train, evaluate: after the shard set)."""
        base = cls.of(cfg)
        if base is None and recorded is None:
            return None
        if base is None or recorded is None or recorded.get("init_from") != base.uri:
            raise ConfigError(
                f"This run's model.init_from is {base.uri if base else 'empty'}, but its shard set was "
                f"made for {(recorded or {}).get('init_from') or 'no base model'}: use the data "
                "fingerprint of this run's settings (or the base the shards were made for)."
            )
        if base.kind == "hub":
            return cls(base.uri, recorded["revision"], base.timeout_s)
        if base.identity()["revision"] != recorded["revision"]:
            raise ConfigError(
                f"The files of model.init_from {base.uri} changed since its shard set was made "
                f"({base.identity()['revision'][:19]}…, recorded {recorded['revision'][:19]}…): "
                "restore them, or run again so plan_shards makes a shard set for the new files."
            )
        return base

    @cached_property
    def _hub(self) -> tuple[str, list[str]]:
        return resolve_revision(self.uri, self.revision, self.timeout_s, self.setting)

    @cached_property
    def files(self) -> list[str]:
        """Names of the files the base holds, of those this project reads."""
        if self.kind == "hub":
            return [f for f in self._hub[1] if f in READ_FILES]
        return [f for f in READ_FILES if storage.exists(join(self.uri, f))]

    def _path(self, name: str) -> str:
        """A readable path of one file: local or gs:// as it is, a Hub file from the Hub cache."""
        if name not in self.files:
            raise ConfigError(
                f"{self.setting} {self.uri} has no {name}: give a folder saved by save_pretrained (a masked "
                "LM: config.json, tokenizer.json, and tf_model.h5 or model.safetensors; a tokenizer: tokenizer.json)."
            )
        if self.kind == "hub":
            return download_file(self.uri, self._hub[0], name, self.timeout_s, self.setting)
        return join(self.uri, name)

    @cached_property
    def weights_file(self) -> str:
        if name := next((n for n in WEIGHT_FILES if n in self.files), None):
            return name
        raise ConfigError(
            f"model.init_from {self.uri} has neither {' nor '.join(WEIGHT_FILES)}: give a model "
            "saved by save_pretrained (TensorFlow or PyTorch)."
        )

    def identity(self) -> dict:
        """What the data fingerprint and the model card name: the base and its exact revision."""
        return {"init_from": self.uri, "revision": self._hub[0] if self.kind == "hub" else self._digest}

    @cached_property
    def _digest(self) -> str:
        h = hashlib.sha256()
        for name in self.files:
            h.update(f"{name}\0{storage.sha256(join(self.uri, name))}\0".encode())
        return "sha256:" + h.hexdigest()

    @cached_property
    def _config(self) -> dict:
        try:
            config = json.loads(storage.read_bytes(self._path("config.json")))
        except (ValueError, UnicodeDecodeError) as err:
            raise ConfigError(
                f"config.json of model.init_from {self.uri} is not JSON ({err}): give a folder "
                "saved by save_pretrained."
            ) from None
        if not isinstance(config, dict):
            raise ConfigError(f"config.json of model.init_from {self.uri} is not a JSON object.")
        return config

    def config(self) -> dict:
        return dict(self._config)

    @cached_property
    def _tokenizer_json(self) -> str:
        return storage.read_text(self._path("tokenizer.json"))

    def tokenizer_json(self) -> str:
        return self._tokenizer_json

    def shape(self) -> dict:
        """The base's shape and vocabulary, as the manifest and the model card show them."""
        return {k: self._config.get(k) for k in ("model_type", "vocab_size", *SHAPE_KEYS)}

    def local_folder(self, tmp: str) -> str:
        """A local folder with config.json and the weights file, to load from (`tmp`: for a gs:// base)."""
        names = ["config.json", self.weights_file]
        if self.kind == "local":
            return storage.local_path(self.uri)
        if self.kind == "hub":
            (folder,) = {os.path.dirname(self._path(n)) for n in names}  # one snapshot folder of the Hub cache
            return folder
        os.makedirs(tmp, exist_ok=True)
        for name in names:
            storage.copy_to_local(self._path(name), os.path.join(tmp, name))
        return tmp


def tokenizer_ref(cfg: PipelineConfig) -> BaseModelRef | None:
    """Where the shards' tokenizer comes from: model.init_from's base, or tokenizer.from_pretrained (None: trained)."""
    t = cfg.tokenizer
    if cfg.model.init_from or not t.from_pretrained:
        return BaseModelRef.of(cfg)
    return BaseModelRef(t.from_pretrained, t.revision, cfg.publish.request_timeout_s, "tokenizer.from_pretrained")


def check_base(cfg: PipelineConfig, base: BaseModelRef) -> None:
    """What validate checks of a base: its model type, a shape the run does not contradict, positions that hold
    max_length, and a tokenizer with our special tokens that fills its vocabulary."""
    config, architecture = base.config(), cfg.model.architecture
    if config.get("model_type") != architecture:
        raise ConfigError(
            f"model.init_from {base.uri} is a {config.get('model_type')!r} model, but model.architecture is "
            f"{architecture}: choose a {architecture} checkpoint, or set model.architecture to the base's "
            "(roberta and modernbert masked LMs can be continued)."
        )
    missing = [k for k in (*SHAPE_KEYS, "vocab_size") if not isinstance(config.get(k), int)]
    if missing:
        raise ConfigError(
            f"config.json of model.init_from {base.uri} lacks {', '.join(missing)}: give a folder "
            "saved by save_pretrained."
        )
    grows = ("max_position_embeddings",) if architecture == "modernbert" else ()  # RoPE: a longer context is no table
    conflicts = [
        f"model.{k}={getattr(cfg.model, k)} (the base has {config[k]})"
        for k in SHAPE_KEYS
        if getattr(cfg.model, k) not in (None, config[k]) and not (k in grows and getattr(cfg.model, k) > config[k])
    ]
    if conflicts:
        raise ConfigError(
            f"With model.init_from the shape comes from the base model {base.uri}, but this run sets "
            f"{', '.join(conflicts)}: remove those settings, or set them to the base's values."
        )
    positions, offset = config["max_position_embeddings"], POSITION_OFFSET[architecture]
    if architecture == "roberta" and cfg.shards.max_length + offset > positions:  # ModernBERT's RoPE has no table
        raise ConfigError(
            f"shards.max_length {cfg.shards.max_length} does not fit the base model {base.uri}: it has "
            f"{positions} learned positions, so max_length can be at most {positions - offset}. Lower "
            "shards.max_length (a RoBERTa's position table is not grown; model.architecture=modernbert "
            "extends its context with model.rope_theta)."
        )
    tok = read_tokenizer_json(base.tokenizer_json(), f"model.init_from {base.uri}")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab != config["vocab_size"]:
        raise ConfigError(
            f"The tokenizer of model.init_from {base.uri} has {vocab} tokens but its config.json "
            f"vocab_size is {config['vocab_size']}: this project needs one row of the embeddings per "
            "token; give a base whose tokenizer matches its embeddings."
        )
    base.weights_file  # noqa: B018  (raises when the base has no weights)


def read_tokenizer_json(text: str, whose: str):
    """A tokenizer.json as a `tokenizers.Tokenizer`; a ConfigError unless it parses and has RoBERTa's special tokens."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(text)
    except Exception as err:  # tokenizers raises a bare Exception for a file it cannot parse
        raise ConfigError(
            f"tokenizer.json of {whose} is not a fast tokenizer ({err}): save it "
            "with AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(folder)."
        ) from None
    absent = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if absent:
        raise ConfigError(
            f"The tokenizer of {whose} lacks the special token(s) {' '.join(absent)}: "
            f"the masking and the model use RoBERTa's {' '.join(SPECIAL_TOKENS)}."
        )
    return tok
