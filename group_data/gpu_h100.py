"""H100 80 GB (Hopper, sm90). Defaults from the recipe table (src/nemofleet/gpus.py,
docs/recipes.md: the vLLM day-one Lightning recipe on 1x H100 runs 256 sequences and 32768
batched tokens with the Humming backends). Set a key here only to depart from the recipe for
every H100 host."""
