package trace

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Azure column names, matched case-insensitively.
const (
	colTimestamp = "timestamp"
	colContext   = "contexttokens"
	colGenerated = "generatedtokens"
)

// azureLayouts are tried in order. time.Parse accepts a fractional second
// after the seconds field even when the layout omits it, which covers the
// 7-digit fractions of the 2023 release.
var azureLayouts = []string{
	"2006-01-02 15:04:05",
	"2006-01-02 15:04:05Z07:00",
	time.RFC3339Nano,
	"2006-01-02T15:04:05",
}

// maxAzureSpan bounds how far a row may be from the first one. It keeps
// arrival differences far from time.Duration's 292-year range, and no real
// trace spans ten years.
const maxAzureSpan = 10 * 365 * 24 * time.Hour

type azureDecoder struct {
	cr      *csv.Reader
	source  string
	ts      int // column indexes
	ctx     int
	gen     int
	first   time.Time
	started bool
}

func newAzureDecoder(r io.Reader, source string) (*azureDecoder, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w (no CSV header)", source, ErrEmpty)
	}
	if err != nil {
		return nil, &ParseError{Source: source, Line: 1, Err: fmt.Errorf("CSV header: %w", err)}
	}
	d := &azureDecoder{cr: cr, source: source, ts: -1, ctx: -1, gen: -1}
	for i, name := range header {
		switch strings.ToLower(strings.TrimSpace(strings.TrimPrefix(name, string(utf8BOM)))) {
		case colTimestamp:
			d.ts = i
		case colContext:
			d.ctx = i
		case colGenerated:
			d.gen = i
		}
	}
	if d.ts < 0 || d.ctx < 0 || d.gen < 0 {
		return nil, &ParseError{Source: source, Line: 1, Err: fmt.Errorf("CSV header %q must name TIMESTAMP, ContextTokens and GeneratedTokens", strings.Join(header, ","))}
	}
	return d, nil
}

func (d *azureDecoder) next() (Request, error) {
	rec, err := d.cr.Read()
	if errors.Is(err, io.EOF) {
		return Request{}, io.EOF
	}
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return Request{}, &ParseError{Source: d.source, Line: pe.Line, Err: pe.Err}
		}
		return Request{}, fmt.Errorf("%s: read CSV: %w", d.source, err)
	}
	line, _ := d.cr.FieldPos(0)
	req, field, err := d.parse(rec)
	if err != nil {
		return Request{}, &ParseError{Source: d.source, Line: line, Field: field, Err: err}
	}
	return req, nil
}

func (d *azureDecoder) parse(rec []string) (Request, string, error) {
	at, err := parseAzureTime(strings.TrimSpace(rec[d.ts]))
	if err != nil {
		return Request{}, "TIMESTAMP", err
	}
	in, err := parseCount(strings.TrimSpace(rec[d.ctx]))
	if err != nil {
		return Request{}, "ContextTokens", err
	}
	out, err := parseCount(strings.TrimSpace(rec[d.gen]))
	if err != nil {
		return Request{}, "GeneratedTokens", err
	}
	if !d.started {
		d.first, d.started = at, true
	}
	if at.Before(d.first.Add(-maxAzureSpan)) || at.After(d.first.Add(maxAzureSpan)) {
		return Request{}, "TIMESTAMP", fmt.Errorf("%s is more than %v from the first row's %s", rec[d.ts], maxAzureSpan, d.first.Format(azureLayouts[0]))
	}
	return Request{Arrival: at.Sub(d.first), InputTokens: in, OutputTokens: out}, "", nil
}

func parseAzureTime(s string) (time.Time, error) {
	for _, layout := range azureLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a timestamp like 2023-11-16 18:15:46.6805900", s)
}
