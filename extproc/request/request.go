package request

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Kind is the API a request was sent to.
type Kind uint8

const (
	Completions Kind = iota + 1
	ChatCompletions
)

// KindOf maps a request path to its Kind, or 0 when the path is not a generation API.
func KindOf(path string) Kind {
	if i := bytes.IndexByte([]byte(path), '?'); i >= 0 {
		path = path[:i]
	}
	switch path {
	case "/v1/completions":
		return Completions
	case "/v1/chat/completions":
		return ChatCompletions
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
	// MaxDepth rejects bodies nested deeper than this (a cheap defence against hostile JSON).
	MaxDepth int
}

// DefaultOptions hash up to 64 blocks of 256 bytes.
func DefaultOptions() Options { return Options{BlockBytes: 256, MaxBlocks: 64, MaxDepth: 32} }

// Validate reports options Parse cannot work with.
func (o Options) Validate() error {
	switch {
	case o.BlockBytes < 16:
		return fmt.Errorf("block_bytes must be >= 16 (got %d)", o.BlockBytes)
	case o.MaxBlocks < 1:
		return fmt.Errorf("max_blocks must be >= 1 (got %d)", o.MaxBlocks)
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
}

// Error is a client error: the body is not a request Parse can route.
type Error struct{ Reason string }

func (e *Error) Error() string { return e.Reason }

func badf(format string, args ...any) error { return &Error{Reason: fmt.Sprintf(format, args...)} }

// Parse reads body (complete when complete is true, else a prefix) as a request of kind k.
// r is reset and reused, so a caller can keep one per stream and avoid allocations.
func Parse(k Kind, body []byte, complete bool, opt Options, r *Request) error {
	*r = Request{Blocks: r.Blocks[:0]}
	if complete && !utf8.Valid(body) {
		return badf("body is not valid UTF-8")
	}
	if !complete {
		// A cut may split a multi-byte rune; only the bytes before it must be valid.
		if !utf8.Valid(trimPartialRune(body)) {
			return badf("body is not valid UTF-8")
		}
	}
	h := hasher{opt: opt, r: r}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	p := parser{dec: dec, opt: opt, h: &h, kind: k}
	err := p.top(r)
	h.flush()
	if err == nil {
		if r.Model == "" {
			return badf("the 'model' field is required")
		}
		if k == ChatCompletions && !p.sawMessages {
			return badf("the 'messages' field is required")
		}
		if k == ChatCompletions && p.messages == 0 {
			return badf("'messages' must not be empty")
		}
		if k == Completions && !p.sawPrompt {
			return badf("the 'prompt' field is required")
		}
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		return err
	}
	if !complete && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)) {
		r.Truncated = true
		if r.Model == "" {
			return errTruncatedBeforeModel
		}
		return nil
	}
	return badf("invalid JSON body: %v", err)
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

type parser struct {
	dec         *json.Decoder
	opt         Options
	h           *hasher
	kind        Kind
	depth       int
	sawMessages bool
	sawPrompt   bool
	messages    int
}

func (p *parser) token() (json.Token, error) {
	t, err := p.dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return t, nil
}

func (p *parser) top(r *Request) error {
	t, err := p.token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return badf("the body must be a JSON object")
	}
	for p.dec.More() {
		kt, err := p.token()
		if err != nil {
			return err
		}
		key, _ := kt.(string)
		switch key {
		case "model":
			v, err := p.token()
			if err != nil {
				return err
			}
			s, ok := v.(string)
			if !ok {
				return badf("'model' must be a string")
			}
			r.Model = s
		case "stream":
			v, err := p.token()
			if err != nil {
				return err
			}
			b, ok := v.(bool)
			if !ok && v != nil {
				return badf("'stream' must be a boolean")
			}
			r.Stream = b
		case "messages":
			if p.kind != ChatCompletions {
				if err := p.skip(); err != nil {
					return err
				}
				continue
			}
			p.sawMessages = true
			if err := p.readMessages(); err != nil {
				return err
			}
		case "prompt":
			if p.kind != Completions {
				if err := p.skip(); err != nil {
					return err
				}
				continue
			}
			p.sawPrompt = true
			if err := p.readPrompt(); err != nil {
				return err
			}
		default:
			if err := p.skip(); err != nil {
				return err
			}
		}
	}
	_, err = p.token() // closing brace
	return err
}

// skip consumes one value of any shape, enforcing MaxDepth.
func (p *parser) skip() error {
	depth := 0
	for {
		t, err := p.token()
		if err != nil {
			return err
		}
		if d, ok := t.(json.Delim); ok {
			switch d {
			case '{', '[':
				depth++
				if depth > p.opt.MaxDepth {
					return badf("JSON nested deeper than %d levels", p.opt.MaxDepth)
				}
			default:
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}

func (p *parser) readMessages() error {
	t, err := p.token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != '[' {
		return badf("'messages' must be an array")
	}
	for p.dec.More() {
		if err := p.readMessage(); err != nil {
			return err
		}
		p.messages++
	}
	_, err = p.token()
	return err
}

var (
	sepRole    = []byte{0}
	sepMessage = []byte{0x1e}
)

func (p *parser) readMessage() error {
	t, err := p.token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return badf("messages[%d] must be an object", p.messages)
	}
	// role normally precedes content; when it does not, the canonical form still stays
	// deterministic because it follows the bytes in the order they arrive.
	for p.dec.More() {
		kt, err := p.token()
		if err != nil {
			return err
		}
		switch kt.(string) {
		case "role":
			v, err := p.token()
			if err != nil {
				return err
			}
			s, ok := v.(string)
			if !ok {
				return badf("messages[%d].role must be a string", p.messages)
			}
			p.h.writeString(s)
			p.h.write(sepRole)
		case "content":
			if err := p.readContent(); err != nil {
				return err
			}
		default:
			if err := p.skip(); err != nil {
				return err
			}
		}
	}
	if _, err := p.token(); err != nil {
		return err
	}
	p.h.write(sepMessage)
	return nil
}

// readContent accepts a string, null, or an array of parts whose text parts are hashed.
func (p *parser) readContent() error {
	t, err := p.token()
	if err != nil {
		return err
	}
	switch v := t.(type) {
	case string:
		p.h.writeString(v)
		return nil
	case nil:
		return nil
	case json.Delim:
		if v != '[' {
			return badf("messages[%d].content must be a string or an array of parts", p.messages)
		}
	default:
		return badf("messages[%d].content must be a string or an array of parts", p.messages)
	}
	for p.dec.More() {
		pt, err := p.token()
		if err != nil {
			return err
		}
		if d, ok := pt.(json.Delim); !ok || d != '{' {
			return badf("messages[%d].content parts must be objects", p.messages)
		}
		for p.dec.More() {
			kt, err := p.token()
			if err != nil {
				return err
			}
			if kt.(string) != "text" {
				if err := p.skip(); err != nil {
					return err
				}
				continue
			}
			v, err := p.token()
			if err != nil {
				return err
			}
			s, ok := v.(string)
			if !ok {
				return badf("messages[%d].content[].text must be a string", p.messages)
			}
			p.h.writeString(s)
		}
		if _, err := p.token(); err != nil {
			return err
		}
	}
	_, err = p.token()
	return err
}

// readPrompt accepts a string, an array of strings (the first is hashed: a batch shares no
// single prefix), or an array of token ids.
func (p *parser) readPrompt() error {
	t, err := p.token()
	if err != nil {
		return err
	}
	switch v := t.(type) {
	case string:
		p.h.writeString(v)
		return nil
	case json.Delim:
		if v != '[' {
			return badf("'prompt' must be a string, an array of strings or an array of token ids")
		}
	default:
		return badf("'prompt' must be a string, an array of strings or an array of token ids")
	}
	first := true
	var tok [8]byte
	for p.dec.More() {
		v, err := p.token()
		if err != nil {
			return err
		}
		switch x := v.(type) {
		case string:
			if first {
				p.h.writeString(x)
			}
		case json.Number:
			n, err := x.Int64()
			if err != nil {
				return badf("'prompt' token ids must be integers")
			}
			binary.LittleEndian.PutUint64(tok[:], uint64(n))
			p.h.write(tok[:])
		default:
			return badf("'prompt' must be a string, an array of strings or an array of token ids")
		}
		first = false
	}
	_, err = p.token()
	return err
}

// hasher cuts the canonical prompt into blocks and chains their hashes.
type hasher struct {
	opt  Options
	r    *Request
	d    xxhash.Digest
	prev uint64
	fill int
	used bool
}

func (h *hasher) full() bool { return len(h.r.Blocks) >= h.opt.MaxBlocks }

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
			h.r.Blocks = append(h.r.Blocks, h.prev)
			h.fill = 0
		}
	}
}

func (h *hasher) writeString(s string) {
	// The conversion does not escape: the compiler reuses s's bytes for a read-only write.
	h.write([]byte(s))
}

func (h *hasher) flush() {
	if h.fill > 0 && !h.full() {
		h.r.Blocks = append(h.r.Blocks, h.d.Sum64())
		h.fill = 0
	}
}
