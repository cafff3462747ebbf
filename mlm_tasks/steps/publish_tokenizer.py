"""Step publish_tokenizer: push the shard set's tokenizer alone, with a short card, to `publish.tokenizer_repo_id`.
HF_TOKEN=hf_... python -m mlm_tasks publish_tokenizer --config c.yaml --data-fingerprint FP"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.hub.api import hub_api, hub_errors, push_folder
from mlm_tasks.paths import RunContext, join
from mlm_tasks.results import TokenizerCommit

log = logging.getLogger(__name__)

TOKENIZER_CARD = """---
language: en
license: {license}
tags: [tokenizer, unigram, roberta]
---

# {name}

Unigram tokenizer (PreTrainedTokenizerFast, RoBERTa special tokens) trained on the corpus with data
fingerprint `{fingerprint}`. Load it with `AutoTokenizer.from_pretrained("{repo_id}")`.
"""


def publish_tokenizer(
    cfg: PipelineConfig, ctx: RunContext, *, token: str, endpoint: str | None = None
) -> TokenizerCommit:
    data, (repo_id, conn_id) = ctx.data, (cfg.publish.tokenizer_repo_id, cfg.publish.hf_conn_id)
    if not repo_id:
        raise ConfigError("publish.tokenizer_repo_id is empty: set it to the Hub repo for the tokenizer.")
    if not storage.exists(join(data.tokenizer, "tokenizer.json")):
        raise MissingArtifactError(
            f"No tokenizer at {data.tokenizer}: build the shard set first (build_shard_set, or the DAG)."
        )
    api, url = hub_api(token, endpoint, conn_id, cfg.publish.request_timeout_s)
    with tempfile.TemporaryDirectory(prefix="mlm-tokenizer-") as tmp:
        # Copy: the tokenizer dir is create-only data shared by runs; the card must not land in it.
        src = storage.download_dir(data.tokenizer, os.path.join(tmp, "download"))
        folder = os.path.join(tmp, "upload")
        shutil.copytree(src, folder)
        card = TOKENIZER_CARD.format(
            license=cfg.publish.license, name=repo_id.split("/")[-1], fingerprint=data.fingerprint, repo_id=repo_id
        )
        storage.write_text(os.path.join(folder, "README.md"), card)
        with hub_errors(f"publishing the tokenizer to {repo_id}", token, url, conn_id):
            message = f"Upload tokenizer for data {data.fingerprint}"
            info, files = push_folder(api, repo_id, folder, cfg.publish.private, message)
    log.info("Published tokenizer %s to %s as %s", data.fingerprint, repo_id, info.oid)
    return TokenizerCommit(
        repo_id=repo_id, commit_url=info.commit_url, commit_oid=info.oid, files=files, fingerprint=data.fingerprint
    )
