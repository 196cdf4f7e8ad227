// Package engine models one vLLM-like inference engine closely enough that routing policies
// can be judged on it: continuous batching with a max_num_seqs limit, a FCFS waiting queue,
// chunked prefill under a per-step token budget where cached prefix blocks are skipped, a
// prefix KV cache of bounded size with LRU eviction, and a decode step whose time grows with
// the batch and with the context it reads. TTFT and inter-token latency are not inputs: they
// emerge from the steps.
//
// # Time
//
// The engine owns no clock and never sleeps. Callers pass the current time, as a
// time.Duration since an epoch of their choosing, to every call. The simulator passes
// virtual time; the mock engine (examples/mockvllm) passes time.Since(start) and sleeps for
// the step duration itself. A step is two calls: StartStep schedules the batch and returns
// how long it takes; EndStep, called when that time has passed, applies it and reports
// first tokens, tokens and completions to an Observer.
//
// # Invariants
//
//   - An Engine is not safe for concurrent use; the mock guards it with a mutex.
//   - Blocks pinned by running requests plus blocks reserved for their output plus cached
//     unpinned blocks never exceed Config.KVBlocks. A request is admitted only when the
//     blocks it needs for its whole prompt and output fit, so there is no preemption.
//   - A prompt block enters the prefix cache only when its request's prefill has completed,
//     so a concurrent request cannot hit a block that was not computed yet.
//   - Like vLLM, the last prompt token is always recomputed: a fully cached prompt still
//     prefills one token.
//   - Freed blocks go to the back of the LRU list in reverse prompt order, so a prompt's
//     tail blocks are evicted before the prefix blocks other prompts are likelier to share
//     (vLLM v1 frees in the same order).
//
// # Calibration
//
// A100Llama8B returns defaults for Llama-3.1-8B-Instruct in BF16 on one NVIDIA A100 40GB:
//
//   - Decode: J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100"
//     (https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on; vLLM 0.23.0, 1024 input
//     and 128 output tokens, concurrency 1 to 64) measured about 75 output tokens/s at
//     concurrency 1 (13.3 ms per step) and 6.6x that throughput at concurrency 8 (16.2 ms
//     per step). With the context-read term below, a step costs 12.9 ms + 0.28 ms per
//     decoding sequence, which reproduces both points.
//   - Context read: each token of context holds 128 KiB of KV (32 layers, 8 KV heads,
//     head dim 128, BF16 keys and values); at the 77% of the A100's 1.555 TB/s memory
//     bandwidth that the same sweep measured for decode, reading it costs 1 s per 9.1
//     million context tokens.
//   - Prefill: that sweep does not isolate prefill, so the rate is derived: 2 x 8.03e9
//     FLOPs per token at 50% of the A100's 312 TFLOPS dense BF16 peak gives 9,700
//     tokens/s. Attention's quadratic term is ignored.
//   - KV capacity: 90% of 40 GiB (vLLM's default gpu_memory_utilization) minus 16 GB of
//     weights and about 2 GB of activations leaves about 20 GB, or 157,000 tokens.
//   - Scheduler: max_num_seqs 256 and an 8192-token step budget, vLLM's usual settings for
//     an online server with chunked prefill.
//
// H100Llama8B derives the same model on one NVIDIA H100 80GB SXM the same way, from the
// NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100, H100 SXM
// column): 989 TFLOPS dense BF16 (the sheet's 1,979 is with sparsity), 80 GB of HBM3 at
// 3.35 TB/s. No sweep like Musgrave's was found for it, so every term is scaled from the
// A100's by the datasheet ratios, at the A100's measured efficiencies:
//
//   - Prefill: 2 x 8.03e9 FLOPs per token at 50% of 989 TFLOPS gives 30,800 tokens/s.
//   - Context read: 128 KiB per context token at 77% of 3.35 TB/s gives 19.7 million
//     tokens/s.
//   - Decode step: decode is memory-bound, so both terms of the A100's step (12.9 ms +
//     0.28 ms per sequence) scale by the bandwidth ratio 1.555/3.35: 5.99 ms + 0.13 ms.
//   - KV capacity: 90% of 80 GiB minus 16 GB of weights and about 2 GB of activations
//     leaves about 59.3 GB, or 452,000 tokens.
//   - Scheduler: the same max_num_seqs 256 and 8192-token step budget.
//
// # KV-cache events
//
// SetKVEvents makes the engine publish BlockStored when a computed prompt block enters its
// prefix cache and BlockRemoved when one is evicted, as vLLM does on its KV-events socket
// for routers that keep an index of every engine's cache (llm-d's precise prefix scorer,
// NVIDIA Dynamo's KV router). A restarted engine is a new Engine; its owner publishes
// AllBlocksCleared for it.
package engine
