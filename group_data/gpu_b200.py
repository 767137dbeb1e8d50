"""B200 (Blackwell, sm100): native NVFP4; horizontal SSU also with speculative decoding
(src/nemofleet/gpus.py, docs/recipes.md). Set a key here only to depart from the recipe."""
