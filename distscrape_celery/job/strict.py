"""The base of every part of a job spec."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A part of a job spec: an unknown key is an error, and a validated spec never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
