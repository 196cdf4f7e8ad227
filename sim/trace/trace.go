package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// BlockTokens is the number of prompt tokens each Mooncake hash id stands for.
const BlockTokens = 512

// Request is one inference request of a trace.
type Request struct {
	// Arrival is the offset of the request from the start of the trace.
	Arrival time.Duration
	// InputTokens and OutputTokens are the prompt and generated lengths.
	InputTokens, OutputTokens int
	// HashIDs holds one id per BlockTokens-token prompt block, prefix-chained;
	// nil when the format carries no prefix information. Read-only.
	HashIDs []uint64
	// Conversation names the session the request is a turn of, when the format states
	// one (FormatSessions); 0 otherwise, and the first hash id stands for it.
	Conversation uint64
}

// Format names an on-disk trace format.
type Format int

const (
	// FormatAuto detects the format from the content.
	FormatAuto Format = iota
	// FormatMooncake is JSON lines with timestamp, input_length, output_length, hash_ids.
	FormatMooncake
	// FormatAzure is CSV with TIMESTAMP, ContextTokens, GeneratedTokens.
	FormatAzure
	// FormatSessions is AIPerf's multi-turn session JSON lines (session_id, input_length,
	// output_length and hash_ids of the tokens each turn adds, timestamp or delay): see
	// SessionConcurrency.
	FormatSessions
)

func (f Format) String() string {
	switch f {
	case FormatAuto:
		return "auto"
	case FormatMooncake:
		return "mooncake"
	case FormatAzure:
		return "azure"
	case FormatSessions:
		return "sessions"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// ParseFormat accepts "auto" (or ""), "mooncake", "azure" and "sessions", case-insensitively.
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return FormatAuto, nil
	case "mooncake", "jsonl":
		return FormatMooncake, nil
	case "azure", "csv":
		return FormatAzure, nil
	case "sessions", "aiperf":
		return FormatSessions, nil
	}
	return FormatAuto, fmt.Errorf("unknown trace format %q: want auto, mooncake, azure or sessions", s)
}

// ErrEmpty is returned (wrapped) when a trace holds no request.
var ErrEmpty = errors.New("trace holds no request")

// ParseError locates a bad record. Field is empty when the whole line is bad.
type ParseError struct {
	Source string
	Line   int
	Field  string
	Err    error
}

func (e *ParseError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %v", e.Source, e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d: %s: %v", e.Source, e.Line, e.Field, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

// decoder yields one request per call, io.EOF at the end.
type decoder interface {
	next() (Request, error)
}

// Reader streams the requests of one trace in file order. It is not safe for
// concurrent use.
type Reader struct {
	format Format
	dec    decoder
}

// NewReader detects (for FormatAuto) or checks the format and prepares to
// decode r. source names the input in error messages, usually the file path.
func NewReader(r io.Reader, source string, f Format) (*Reader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	if f == FormatAuto {
		var err error
		if f, err = detect(br, source); err != nil {
			return nil, err
		}
	}
	switch f {
	case FormatMooncake:
		return &Reader{format: f, dec: newMooncakeDecoder(br, source)}, nil
	case FormatAzure:
		dec, err := newAzureDecoder(br, source)
		if err != nil {
			return nil, err
		}
		return &Reader{format: f, dec: dec}, nil
	case FormatSessions:
		dec, err := newSessionsDecoder(br, source)
		if err != nil {
			return nil, err
		}
		return &Reader{format: f, dec: dec}, nil
	}
	return nil, fmt.Errorf("%s: unsupported trace format %v", source, f)
}

// Format reports the format being decoded, after detection.
func (r *Reader) Format() Format { return r.format }

// Next returns the next request, or io.EOF after the last one. Any other
// error is a *ParseError (possibly wrapped) and ends the stream.
func (r *Reader) Next() (Request, error) { return r.dec.next() }

// Read decodes a whole trace, sorts it stably by arrival and rebases it so
// that the first arrival is zero. An empty trace is an error wrapping ErrEmpty.
func Read(r io.Reader, source string, f Format) ([]Request, error) {
	rd, err := NewReader(r, source, f)
	if err != nil {
		return nil, err
	}
	var reqs []Request
	for {
		req, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, req)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%s: %w (is it the right file?)", source, ErrEmpty)
	}
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmpDuration(a.Arrival, b.Arrival) })
	if start := reqs[0].Arrival; start != 0 {
		for i := range reqs {
			reqs[i].Arrival -= start
		}
	}
	return reqs, nil
}

// ReadFile opens path and calls Read on it.
func ReadFile(path string, f Format) ([]Request, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer fh.Close()
	return Read(fh, path, f)
}

func cmpDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// detect peeks at the first non-blank bytes without consuming them (apart
// from a UTF-8 byte order mark, which it drops).
func detect(br *bufio.Reader, source string) (Format, error) {
	if head, _ := br.Peek(len(utf8BOM)); bytes.Equal(head, utf8BOM) {
		_, _ = br.Discard(len(utf8BOM))
	}
	for n := 512; ; n *= 2 {
		n = min(n, br.Size())
		head, err := br.Peek(n)
		trimmed := bytes.TrimLeft(head, " \t\r\n")
		if len(trimmed) > 0 {
			line, _, _ := bytes.Cut(trimmed, []byte("\n"))
			switch {
			case trimmed[0] == '{' && bytes.Contains(line, []byte(`"session_id"`)):
				return FormatSessions, nil
			case trimmed[0] == '{':
				return FormatMooncake, nil
			case bytes.Contains(bytes.ToLower(line), []byte("timestamp")) && bytes.ContainsRune(line, ','):
				return FormatAzure, nil
			}
			return FormatAuto, fmt.Errorf("%s: unknown trace format: first line %q is neither a Mooncake JSON object nor an Azure CSV header (TIMESTAMP,ContextTokens,GeneratedTokens); pass the format explicitly", source, truncate(line, 80))
		}
		switch {
		case errors.Is(err, io.EOF):
			return FormatAuto, fmt.Errorf("%s: %w (empty or blank file)", source, ErrEmpty)
		case err != nil:
			return FormatAuto, fmt.Errorf("%s: detect format: %w", source, err)
		case n == br.Size():
			return FormatAuto, fmt.Errorf("%s: unknown trace format: the first %d bytes are blank", source, n)
		}
	}
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
