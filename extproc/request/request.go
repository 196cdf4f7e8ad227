package request

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Kind is the API a request was sent to.
type Kind uint8

const (
	Completions     Kind = iota + 1 // /v1/completions: the prompt is the key
	ChatCompletions                 // /v1/chat/completions: the messages are the key
	Responses                       // /v1/responses: instructions, then the input items
	Embeddings                      // /v1/embeddings: the (first) input
	// ModelOnly is every other JSON API of a vLLM server that names a model (tokenize,
	// detokenize, pooling, classify, score, rerank): routed by model, keyed by the bytes of
	// the body itself, so identical requests meet the same engine and different ones spread
	// over the model's weights.
	ModelOnly
)

var kindNames = [...]string{"", "completions", "chat_completions", "responses", "embeddings", "model_only"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// KindOf maps a request path to its Kind, or 0 when the path is not one the sidecar routes
// (GET endpoints such as /v1/models and /health, and the multipart audio APIs, which
// Envoy's weighted fallback balances).
func KindOf(path string) Kind {
	if i := bytes.IndexByte([]byte(path), '?'); i >= 0 {
		path = path[:i]
	}
	switch path {
	case "/v1/completions":
		return Completions
	case "/v1/chat/completions":
		return ChatCompletions
	case "/v1/responses":
		return Responses
	case "/v1/embeddings":
		return Embeddings
	case "/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/v1/score",
		"/rerank", "/v1/rerank", "/v2/rerank":
		return ModelOnly
	}
	return 0
}

// Options bound the work Parse does.
type Options struct {
	// BlockBytes is the size of one prefix block of canonical prompt bytes (about 64 tokens
	// at 4 bytes a token by default).
	BlockBytes int
	// MaxBlocks caps the chain's length: bytes past MaxBlocks*BlockBytes are not hashed.
	MaxBlocks int
	// KeyBlocks, when > 0, sets Request.Key and Request.ParentKey by the key ladder
	// (KeyDepth): its first rung is the chain after KeyBlocks blocks, and each next rung
	// twice as deep, up to MaxBlocks.
	KeyBlocks int
	// KeyOnly leaves Request.Blocks empty: a caller that routes needs only the keys, and a
	// long prompt then costs no memory per block.
	KeyOnly bool
	// Marks, with KeyBlocks > 0, sets Request.Marks: the chain after every KeyBlocks blocks
	// (each a multiple of the ladder's first rung), up to MaxBlocks; a 1 MiB prompt has 256.
	Marks bool
	// MaxDepth rejects bodies nested deeper than this (a cheap defence against hostile JSON).
	MaxDepth int
}

// DefaultOptions hash up to 4096 blocks of 256 bytes (1 MiB), with a key ladder from
// 16 blocks (4 KiB, about 1,000 tokens) to the last of them.
func DefaultOptions() Options {
	return Options{BlockBytes: 256, MaxBlocks: 4096, KeyBlocks: 16, MaxDepth: 32}
}

// Validate reports options Parse cannot work with.
func (o Options) Validate() error {
	switch {
	case o.BlockBytes < 16:
		return fmt.Errorf("block_bytes must be >= 16 (got %d)", o.BlockBytes)
	case o.MaxBlocks < 1:
		return fmt.Errorf("max_blocks must be >= 1 (got %d)", o.MaxBlocks)
	case o.KeyBlocks < 0 || o.KeyBlocks > o.MaxBlocks:
		return fmt.Errorf("key_blocks must be in [0, max_blocks=%d] (got %d)", o.MaxBlocks, o.KeyBlocks)
	case o.MaxDepth < 4:
		return fmt.Errorf("max_depth must be >= 4 (got %d)", o.MaxDepth)
	}
	return nil
}

// Request is what Parse learned. Blocks holds the chained hash after each full block of the
// canonical prompt, and a last one for a partial tail block if any.
type Request struct {
	Model     string
	Stream    bool
	Truncated bool // the body ended before the JSON did
	Blocks    []uint64
	// PromptBytes counts canonical prompt bytes seen (capped at MaxBlocks*BlockBytes).
	PromptBytes int
	// Key is the routing key when Options.KeyBlocks is set: the chain at the deepest rung
	// of the key ladder the prompt fills (KeyDepth), or, for a prompt shorter than the
	// first rung, the chain over all of it. ParentKey is the chain at the rung above Key's
	// (0 when Key is on the first rung or below it): the key the same conversation had
	// while its prompt was up to half as long. Both are 0 for an empty prompt.
	Key, ParentKey uint64
	// Marks, with Options.Marks, are the chain after every Options.KeyBlocks whole blocks,
	// from the first: a prefix cache that holds one holds the prompt up to it.
	Marks []uint64
}

// KeyDepth is the key ladder: for a prompt of n whole units (blocks, or tokens), with
// first rung first and deepest rung at most last, it returns the depth of the routing
// key, first x 2^k for the largest k with first x 2^k <= min(n, last), and of its parent
// rung (half of it, 0 when the key is on the first rung). depth is 0 when n < first: the
// key is then the whole prompt.
//
// A conversation's prompt grows by its previous turn and answer, so each turn's prompt
// opens with the one before: its key is the one the previous turn had, or, when the
// prompt crossed a rung, that key is its parent. A fixed depth cannot serve both a fleet
// whose prompts differ within a few KiB and one whose prompts all open with the same long
// system prompt (the key would be that system prompt, one for every conversation).
func KeyDepth(n, first, last int) (depth, parent int) {
	if first < 1 || n < first {
		return 0, 0
	}
	depth = first
	for depth <= min(n, last)/2 {
		depth *= 2
	}
	if depth > first {
		parent = depth / 2
	}
	return depth, parent
}

// Error is a client error: the body is not a request Parse can route.
type Error struct{ Reason string }

func (e *Error) Error() string { return e.Reason }

func badf(format string, args ...any) error { return &Error{Reason: fmt.Sprintf(format, args...)} }

// Parse reads body (complete when complete is true, else a prefix) as a request of kind k.
// r is reset and reused, so a caller can keep one per stream and avoid allocations.
func Parse(k Kind, body []byte, complete bool, opt Options, r *Request) error {
	*r = Request{Blocks: r.Blocks[:0], Marks: r.Marks[:0]}
	if opt.KeyOnly {
		r.Blocks = nil
	}
	valid := body
	if !complete {
		// A cut may split a multi-byte rune; only the bytes before it must be valid.
		valid = trimPartialRune(body)
	}
	if !utf8.Valid(valid) {
		return badf("body is not valid UTF-8")
	}
	h := hasher{opt: opt, r: r, rung: opt.KeyBlocks}
	p := parser{sc: scanner{b: body, maxDepth: opt.MaxDepth}, h: &h, kind: k, instructionsAt: -1, inputAt: -1}
	if k == ModelOnly {
		h.write(valid)
	}
	err := p.top(r)
	if k == Responses {
		// Hashed after the walk, in canonical order, wherever the fields were.
		if rerr := p.hashResponse(); rerr != nil && !errors.Is(rerr, errEnd) && (err == nil || errors.Is(err, errEnd)) {
			err = rerr
		}
	}
	h.flush()
	switch {
	case err == nil:
	case errors.Is(err, errEnd) && !complete:
		r.Truncated = true
		if r.Model == "" {
			return errTruncatedBeforeModel
		}
		return nil
	case errors.Is(err, errEnd):
		return badf("invalid JSON body: unexpected end of input")
	default:
		var ce *Error
		if errors.As(err, &ce) {
			return err
		}
		return badf("invalid JSON body: %v", err)
	}
	switch {
	case r.Model == "":
		return badf("the 'model' field is required")
	case k == ChatCompletions && !p.sawMessages:
		return badf("the 'messages' field is required")
	case k == ChatCompletions && p.messages == 0:
		return badf("'messages' must not be empty")
	case k == Completions && !p.sawPrompt:
		return badf("the 'prompt' field is required")
	case (k == Responses || k == Embeddings) && !p.sawInput:
		return badf("the 'input' field is required")
	}
	return nil
}

// errTruncatedBeforeModel reports a partial body whose first bytes did not name the model.
var errTruncatedBeforeModel = errors.New("the model field was not within the bytes the sidecar received")

// IsTruncatedBeforeModel reports whether Parse failed only because the partial body ended
// before the model field: the request may be fine, but it cannot be steered.
func IsTruncatedBeforeModel(err error) bool { return errors.Is(err, errTruncatedBeforeModel) }

func trimPartialRune(b []byte) []byte {
	for i := 0; i < utf8.UTFMax && i < len(b); i++ {
		if utf8.RuneStart(b[len(b)-1-i]) {
			if !utf8.FullRune(b[len(b)-1-i:]) {
				return b[:len(b)-1-i]
			}
			return b
		}
	}
	return b
}

// hasher cuts the canonical prompt into blocks and chains their hashes.
type hasher struct {
	opt  Options
	r    *Request
	d    xxhash.Digest
	prev uint64
	fill int
	// n counts whole blocks; rung is the depth of the next rung of the key ladder.
	n, rung int
}

func (h *hasher) full() bool { return h.n >= h.opt.MaxBlocks }

func (h *hasher) write(b []byte) {
	for len(b) > 0 && !h.full() {
		if h.fill == 0 {
			h.d.Reset()
			var pb [8]byte
			binary.LittleEndian.PutUint64(pb[:], h.prev)
			_, _ = h.d.Write(pb[:])
		}
		n := min(h.opt.BlockBytes-h.fill, len(b))
		_, _ = h.d.Write(b[:n])
		h.fill += n
		h.r.PromptBytes += n
		b = b[n:]
		if h.fill == h.opt.BlockBytes {
			h.prev = h.d.Sum64()
			h.n++
			if !h.opt.KeyOnly {
				h.r.Blocks = append(h.r.Blocks, h.prev)
			}
			if h.opt.Marks && h.opt.KeyBlocks > 0 && h.n%h.opt.KeyBlocks == 0 {
				h.r.Marks = append(h.r.Marks, h.prev)
			}
			if h.n == h.rung {
				// A rung of the ladder (KeyDepth): the key so far becomes the parent.
				h.r.ParentKey, h.r.Key = h.r.Key, h.prev
				h.rung *= 2
			}
			h.fill = 0
		}
	}
}

func (h *hasher) flush() {
	if h.fill > 0 && !h.full() {
		tail := h.d.Sum64()
		if !h.opt.KeyOnly {
			h.r.Blocks = append(h.r.Blocks, tail)
		}
		if h.opt.KeyBlocks > 0 && h.n < h.opt.KeyBlocks {
			h.r.Key = tail // shorter than the first rung: the whole prompt is the key
		}
		h.fill = 0
	}
	if h.opt.KeyBlocks > 0 && h.r.Key == 0 && h.n > 0 {
		h.r.Key = h.prev
	}
}
