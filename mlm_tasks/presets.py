"""Model shape presets. `tiny` runs the same code path as `base` in seconds per step on a CPU."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ModelShape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 514


PRESETS: dict[str, ModelShape] = {
    # Chosen for the embedded default: learns visibly within minutes on 2 CPU cores.
    "tiny": ModelShape(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, max_position_embeddings=130
    ),
    "small": ModelShape(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, max_position_embeddings=514
    ),
    # roberta-base shape.
    "base": ModelShape(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=514,
    ),
}
