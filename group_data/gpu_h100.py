"""H100 80 GB (Hopper, sm90). seed 003: 256 sequences, 32768 batched tokens, humming
MoE/linear backends, horizontal SSU without speculative decoding, async scheduling."""
gpu_memory_utilization = 0.90
max_num_seqs = 256
max_num_batched_tokens = 32768
