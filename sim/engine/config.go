package engine

import (
	"errors"
	"fmt"
	"time"
)

// Config describes one engine: its scheduler limits, its KV cache and its speed.
type Config struct {
	// MaxNumSeqs bounds the requests in the running batch (vLLM's max_num_seqs).
	MaxNumSeqs int
	// MaxBatchedTokens is the token budget of one step: one token per decoding request plus
	// prefill chunks (vLLM's max_num_batched_tokens with chunked prefill).
	MaxBatchedTokens int
	// BlockTokens is the number of prompt tokens per KV block and per prefix hash.
	BlockTokens int
	// KVBlocks is the KV cache capacity in blocks.
	KVBlocks int
	// PrefillTokensPerSec is the rate at which uncached prompt tokens are computed.
	PrefillTokensPerSec float64
	// ContextTokensPerSec is the rate at which a decode step reads the KV of the context
	// of the requests it decodes.
	ContextTokensPerSec float64
	// StepBase is the fixed cost of a step (reading the weights once).
	StepBase time.Duration
	// DecodeSeqCost is the extra cost of each decoding request in a step.
	DecodeSeqCost time.Duration
}

// kvTokensA100x40 is the KV capacity in tokens derived in doc.go.
const kvTokensA100x40 = 157_000

// A100Llama8B returns the calibrated defaults described in the package documentation, with
// the KV cache split into blocks of blockTokens tokens.
func A100Llama8B(blockTokens int) Config {
	c := Config{
		MaxNumSeqs:          256,
		MaxBatchedTokens:    8192,
		BlockTokens:         blockTokens,
		PrefillTokensPerSec: 9700,
		ContextTokensPerSec: 9.1e6,
		StepBase:            12900 * time.Microsecond,
		DecodeSeqCost:       280 * time.Microsecond,
	}
	if blockTokens > 0 {
		c.KVBlocks = kvTokensA100x40 / blockTokens
	}
	return c
}

// kvTokensH100x80 is the KV capacity in tokens of an H100 80GB, derived in doc.go.
const kvTokensH100x80 = 452_000

// H100Llama8B returns defaults for Llama-3.1-8B-Instruct in BF16 on one NVIDIA H100 80GB
// SXM, derived from its datasheet exactly as A100Llama8B was from the A100's (see the
// package documentation), with the KV cache split into blocks of blockTokens tokens.
func H100Llama8B(blockTokens int) Config {
	c := Config{
		MaxNumSeqs:          256,
		MaxBatchedTokens:    8192,
		BlockTokens:         blockTokens,
		PrefillTokensPerSec: 30800,
		ContextTokensPerSec: 19.7e6,
		StepBase:            5990 * time.Microsecond,
		DecodeSeqCost:       130 * time.Microsecond,
	}
	if blockTokens > 0 {
		c.KVBlocks = kvTokensH100x80 / blockTokens
	}
	return c
}

// GPUs names the calibrations Calibrated knows, in a stable order.
var GPUs = []string{"a100-40gb", "h100-80gb"}

// Calibrated returns the named GPU's calibration (one of GPUs) with blocks of blockTokens.
func Calibrated(gpu string, blockTokens int) (Config, error) {
	switch gpu {
	case "a100-40gb":
		return A100Llama8B(blockTokens), nil
	case "h100-80gb":
		return H100Llama8B(blockTokens), nil
	}
	return Config{}, fmt.Errorf("unknown GPU %q (known: %v)", gpu, GPUs)
}

// Validate reports every field that is out of range. It does not modify c.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("engine config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.MaxNumSeqs < 1 {
		bad("MaxNumSeqs", "is %d, must be at least 1", c.MaxNumSeqs)
	}
	if c.MaxBatchedTokens < c.MaxNumSeqs {
		bad("MaxBatchedTokens", "is %d, must be at least MaxNumSeqs (%d) so every running request can decode", c.MaxBatchedTokens, c.MaxNumSeqs)
	}
	if c.BlockTokens < 1 {
		bad("BlockTokens", "is %d, must be at least 1", c.BlockTokens)
	}
	if c.KVBlocks < 1 {
		bad("KVBlocks", "is %d, must be at least 1", c.KVBlocks)
	}
	if !(c.PrefillTokensPerSec > 0) {
		bad("PrefillTokensPerSec", "is %v, must be positive", c.PrefillTokensPerSec)
	}
	if !(c.ContextTokensPerSec > 0) {
		bad("ContextTokensPerSec", "is %v, must be positive", c.ContextTokensPerSec)
	}
	if c.StepBase <= 0 {
		bad("StepBase", "is %v, must be positive", c.StepBase)
	}
	if c.DecodeSeqCost < 0 {
		bad("DecodeSeqCost", "is %v, must not be negative", c.DecodeSeqCost)
	}
	return errors.Join(errs...)
}

// ServiceSeconds is the engine time one request costs when no prefix is cached and the
// engine runs full decode batches: its prefill plus its share of the decode steps. The
// simulator uses it to turn a trace into an offered load relative to fleet capacity.
func (c Config) ServiceSeconds(promptTokens, outputTokens int) float64 {
	prefill := float64(promptTokens) / c.PrefillTokensPerSec
	meanContext := float64(promptTokens) + float64(outputTokens)/2
	perToken := c.DecodeSeqCost.Seconds() + meanContext/c.ContextTokensPerSec +
		c.StepBase.Seconds()/float64(c.MaxNumSeqs)
	return prefill + float64(outputTokens)*perToken
}
