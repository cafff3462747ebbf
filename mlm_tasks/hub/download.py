"""Reading a model repo from the Hub (`model.init_from`, `tokenizer.from_pretrained`): which commit a revision
names, what files it holds, one file's bytes, always by commit so every task of a run reads the same bytes.

    sha, files = resolve_revision("FacebookAI/roberta-base", "main", 120, "model.init_from")  # the commit, its files
    path = download_file("FacebookAI/roberta-base", sha, "config.json", 120, "model.init_from")  # in the Hub cache
"""

from __future__ import annotations

import contextlib

import requests

from mlm_tasks.errors import AuthError, ConfigError, TransientError
from mlm_tasks.hub.api import bound_requests, is_transient

# The setting naming a repo -> the one naming its revision, for messages that say what to fix.
REVISION_SETTING = {"model.init_from": "model.init_revision", "tokenizer.from_pretrained": "tokenizer.revision"}


@contextlib.contextmanager
def download_errors(repo_id: str, revision: str | None, what: str, setting: str):
    """Hub failures while reading `repo_id` into the errors of mlm_tasks.errors, saying what to change."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at, rev_setting = f"{repo_id}@{revision or 'main'}", REVISION_SETTING.get(setting, "the revision")
    try:
        yield
    except GatedRepoError:  # before RepositoryNotFoundError: a gated repo is one of those
        raise AuthError(
            f"The Hub repo {repo_id} ({setting}) is gated: accept its terms on the Hub with the "
            "account of HF_TOKEN, and set HF_TOKEN in the worker's environment."
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"The Hub has no model repo {repo_id} ({setting}), or it is private: check the "
            "repo id, or set HF_TOKEN to a token that may read it."
        ) from None
    except RevisionNotFoundError:
        raise ConfigError(
            f"{rev_setting} {revision!r} is not a branch, tag or commit of {repo_id}: give "
            "one the repo has (leave it empty for main)."
        ) from None
    except LocalEntryNotFoundError as err:  # before EntryNotFoundError: huggingface_hub's "could not connect"
        raise TransientError(
            f"Cannot reach the Hub while reading {what} of {at} ({err}): the task retries; "
            "if it persists, check the network or HF_ENDPOINT."
        ) from None
    except EntryNotFoundError:
        raise ConfigError(
            f"{at} has no {what}: {setting} must be a transformers repo (a masked LM: config.json, "
            "tokenizer.json, tf_model.h5 or model.safetensors; a tokenizer: tokenizer.json)."
        ) from None
    except requests.Timeout:  # before ConnectionError: a ConnectTimeout is both
        raise TransientError(
            f"The Hub did not answer while reading {what} of {at}: the task retries; if it "
            "persists, check HF_ENDPOINT and the network."
        ) from None
    except requests.HTTPError as err:
        status = err.response.status_code if err.response is not None else None
        if status in (401, 403):
            raise AuthError(
                f"The Hub refused the token ({status}) while reading {what} of {at}: set HF_TOKEN to "
                "a token that may read the repo."
            ) from None
        if is_transient(status):
            raise TransientError(f"The Hub failed ({status}) while reading {what} of {at}: the task retries.") from None
        raise ConfigError(
            f"The Hub refused reading {what} of {at} ({status}): {err}. Check {setting} and {rev_setting}."
        ) from None
    except requests.ConnectionError as err:
        raise TransientError(
            f"Cannot reach the Hub while reading {what} of {at}: {err}. The task retries; if "
            "it persists, check the network or HF_ENDPOINT."
        ) from None


def resolve_revision(repo_id: str, revision: str | None, timeout_s: float, setting: str) -> tuple[str, list[str]]:
    """The commit sha that `revision` (None: main) names in model repo `repo_id`, and its file names."""
    from huggingface_hub import HfApi, constants

    bound_requests(timeout_s)
    with download_errors(repo_id, revision, "the model info", setting):
        info = HfApi(endpoint=constants.ENDPOINT).model_info(repo_id, revision=revision)
    if not info.sha:
        raise TransientError(f"The Hub answered no commit for {repo_id}@{revision or 'main'}: the task retries.")
    return info.sha, sorted(s.rfilename for s in info.siblings or [])


def download_file(repo_id: str, sha: str, filename: str, timeout_s: float, setting: str) -> str:
    """`filename` of commit `sha` of `repo_id`, as a local path in the Hub cache (HF_HUB_CACHE)."""
    from huggingface_hub import constants, hf_hub_download

    bound_requests(timeout_s)
    with download_errors(repo_id, sha, filename, setting):
        return hf_hub_download(repo_id, filename, revision=sha, endpoint=constants.ENDPOINT, etag_timeout=timeout_s)
