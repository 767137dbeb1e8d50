"""B200 (Blackwell, sm100): native NVFP4; horizontal SSU also with speculative decoding."""
gpu_memory_utilization = 0.90
max_num_seqs = 256
max_num_batched_tokens = 32768
