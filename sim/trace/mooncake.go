package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
)

// maxLineBytes bounds one JSONL record; a 64 MiB line would hold millions of
// hash ids, far beyond any real prompt.
const maxLineBytes = 64 << 20

// jsonLines yields the non-blank lines of a JSON-lines trace, trimmed, counting lines
// for errors; both JSON formats read through it.
type jsonLines struct {
	sc     *bufio.Scanner
	source string
	line   int
}

func newJSONLines(r io.Reader, source string) *jsonLines {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	return &jsonLines{sc: sc, source: source}
}

// next returns the next non-blank line (a UTF-8 byte order mark dropped from the first),
// io.EOF after the last, or a *ParseError.
func (j *jsonLines) next() ([]byte, error) {
	for j.sc.Scan() {
		j.line++
		line := bytes.TrimSpace(j.sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if j.line == 1 {
			line = bytes.TrimPrefix(line, utf8BOM)
		}
		return line, nil
	}
	if err := j.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("line longer than %d bytes: %w", maxLineBytes, err)
		}
		return nil, &ParseError{Source: j.source, Line: j.line + 1, Err: err}
	}
	return nil, io.EOF
}

type mooncakeDecoder struct{ lines *jsonLines }

func newMooncakeDecoder(r io.Reader, source string) *mooncakeDecoder {
	return &mooncakeDecoder{lines: newJSONLines(r, source)}
}

// mooncakeRecord keeps scalars raw so that errors can say what was wrong in
// the trace's own terms rather than in Go types.
type mooncakeRecord struct {
	Timestamp    json.RawMessage `json:"timestamp"`
	InputLength  json.RawMessage `json:"input_length"`
	OutputLength json.RawMessage `json:"output_length"`
	HashIDs      []uint64        `json:"hash_ids"`
}

func (d *mooncakeDecoder) next() (Request, error) {
	line, err := d.lines.next()
	if err != nil {
		return Request{}, err
	}
	req, field, err := parseMooncake(line)
	if err != nil {
		return Request{}, &ParseError{Source: d.lines.source, Line: d.lines.line, Field: field, Err: err}
	}
	return req, nil
}

// parseMooncake returns the field at fault alongside any error.
func parseMooncake(line []byte) (Request, string, error) {
	var rec mooncakeRecord
	if err := json.Unmarshal(line, &rec); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field == "" {
				return Request{}, "", fmt.Errorf("want a JSON object, got %s", te.Value)
			}
			return Request{}, te.Field, fmt.Errorf("got %s, want %s", te.Value, wantFor(te.Field))
		}
		return Request{}, "", fmt.Errorf("invalid JSON: %w", err)
	}
	at, err := requiredMillis(rec.Timestamp)
	if err != nil {
		return Request{}, "timestamp", err
	}
	in, err := requiredCount(rec.InputLength)
	if err != nil {
		return Request{}, "input_length", err
	}
	out, err := requiredCount(rec.OutputLength)
	if err != nil {
		return Request{}, "output_length", err
	}
	return Request{
		Arrival:      at,
		InputTokens:  in,
		OutputTokens: out,
		HashIDs:      rec.HashIDs,
	}, "", nil
}

func wantFor(field string) string {
	if field == "hash_ids" {
		return "an array of non-negative integers"
	}
	return "a number"
}

// rawScalar rejects absent and null values; strings keep their quotes so
// the error shows what the file holds.
func rawScalar(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", errors.New("missing")
	}
	return string(raw), nil
}

// requiredMillis parses a time in milliseconds, at least 0 and within what a Duration holds.
func requiredMillis(raw json.RawMessage) (time.Duration, error) {
	ms, err := requiredFloat(raw)
	if err != nil {
		return 0, err
	}
	if ms < 0 || ms > float64(math.MaxInt64/int64(time.Millisecond)) {
		return 0, fmt.Errorf("%v ms is outside [0, %d]", ms, math.MaxInt64/int64(time.Millisecond))
	}
	return time.Duration(math.Round(ms * float64(time.Millisecond))), nil
}

func requiredFloat(raw json.RawMessage) (float64, error) {
	s, err := rawScalar(raw)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("got %s, want a finite number of milliseconds", truncate(raw, 40))
	}
	return v, nil
}

// requiredCount parses a non-negative token count that fits an int32, which
// no real prompt exceeds and which keeps sums over a trace from overflowing.
func requiredCount(raw json.RawMessage) (int, error) {
	s, err := rawScalar(raw)
	if err != nil {
		return 0, err
	}
	if s[0] == '"' {
		return 0, fmt.Errorf("got string %s, want an integer", truncate(raw, 40))
	}
	return parseCount(s)
}

func parseCount(s string) (int, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	if v < 0 || v > math.MaxInt32 {
		return 0, fmt.Errorf("%d is outside [0, %d]", v, math.MaxInt32)
	}
	return int(v), nil
}
