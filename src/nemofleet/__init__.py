"""nemofleet: idempotent provisioning of NVIDIA Nemotron models on vLLM across GPU fleets."""

__version__ = "0.1.0"
