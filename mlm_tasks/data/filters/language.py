"""Language ID of one row with py3langid, whose model ships in its wheel (no download, no network).

    keep = is_in(text, ("en",), 0.5)   # its most likely language is English, with probability >= 0.5

The model loads once per process, on first use; probabilities are normalized, so a threshold means the same
on short and long rows.
"""

from __future__ import annotations

import threading

_load_lock = threading.Lock()
_model = None


def _identifier():
    # Our own identifier, never py3langid's module global: that one has norm_probs off, and set_languages on
    # it would narrow the candidates for every caller (German text then scores as the best of [en]).
    global _model
    if _model is None:
        with _load_lock:  # two threads' first long rows load it once
            if _model is None:
                from py3langid.langid import MODEL_FILE, LanguageIdentifier

                _model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _model


def is_in(text: str, languages: tuple[str, ...], min_probability: float) -> bool:
    """Whether `text`'s most likely language is one of `languages`, with at least `min_probability`
    (datatrove's LanguageFilter rule)."""
    language, probability = _identifier().classify(text)
    return language in languages and probability >= min_probability
