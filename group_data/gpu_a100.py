"""A100 80 GB (Ampere, sm80). The per-architecture defaults (sequences, batched tokens, the
flag set per model) come from the recipe table in src/nemofleet/gpus.py and docs/recipes.md
(Lightning NVFP4 on 1x A100: 131072 context, 32 sequences, 16384 batched tokens, 0.90 of the
memory, ~73 of 80 GB in use). Hopper-only backends are never emitted for this class.
Set a key here only to depart from the recipe for every A100 host, e.g. `max_num_seqs = 16`."""
