"""A100 80 GB (Ampere, sm80). seed 000: Lightning NVFP4 on 1x A100 at 131072 context,
32 sequences, 16384 batched tokens, util 0.90 uses ~73 of 80 GB. Hopper-only backends
(humming, horizontal SSU, async scheduling) are never emitted for this class."""
gpu_memory_utilization = 0.90
max_num_seqs = 32
max_num_batched_tokens = 16384
