"""H200 141 GB (Hopper, sm90; 143771 MiB as read on a real H200). Same recipe as H100
(src/nemofleet/gpus.py, docs/recipes.md). Set a key here only to depart from it."""
