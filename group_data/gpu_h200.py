"""H200 141 GB (Hopper, sm90; 143771 MiB as read on a real H200). Same flags as H100."""
gpu_memory_utilization = 0.90
max_num_seqs = 256
max_num_batched_tokens = 32768
