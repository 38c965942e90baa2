"""The bodies the JSON API accepts: strict types, no unknown fields, nothing that names a file."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from charlm.config_inference import SampleConfig, ScoreConfig

_SAMPLE = SampleConfig()


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(None, description="A name from GET /v1/models (default: the first model served).")


class SampleRequest(Request):
    prompt: str | None = Field(
        None, description="Text to start from (default: a line break), as `charlm sample --prime`."
    )
    length: int = Field(_SAMPLE.length, description="Symbols to generate per sample.")
    temperature: float = Field(
        _SAMPLE.temperature, description="Softmax temperature (0: greedy, the likeliest symbol at each step)."
    )
    top_k: int = Field(_SAMPLE.top_k, description="Draw only from the k most likely symbols (0: off).")
    top_p: float = Field(_SAMPLE.top_p, description="Nucleus: the smallest set with this much probability (1: off).")
    seed: int | None = Field(
        None,
        ge=-(2**62),
        le=2**62,
        description="Sample i uses seed + i, as `charlm sample --seed` (default: drawn, and returned).",
    )
    num_samples: int = Field(_SAMPLE.num_samples, description="How many samples.")
    stop: list[str] = Field(
        [],
        max_length=16,
        description="End a sample once its text holds one of these strings "
        "(at most 16: each is looked for after every symbol).",
    )
    beam: int = Field(_SAMPLE.beam, description="Beam width (0: draw at random).")
    stream: bool = Field(False, description="Send the text as it is drawn, as server-sent events.")


class ScoreRequest(Request):
    text: str = Field(..., description="The text; normalised as `charlm score` does (BOM, line ends).")
    unknown: Literal["error", "skip", "unk"] = Field(
        ScoreConfig().unknown, description="Characters outside the vocabulary, as --unknown."
    )
    top: int = Field(5, ge=0, le=20, description="Alternatives to list per character (0: none).")


class ActivationsRequest(Request):
    text: str = Field(..., description="The text to read, symbol by symbol.")
    layer: int = Field(0, description="Which layer (0: the bottom one).")
    units: list[int] | None = Field(
        None, max_length=64, description="Units to return (default: the `top` that vary most over the text)."
    )
    top: int = Field(8, ge=1, le=64, description="How many of the most varying units, when `units` is not given.")
    unknown: Literal["error", "skip", "unk"] = Field(
        ScoreConfig().unknown, description="Characters outside the vocabulary, as --unknown."
    )
