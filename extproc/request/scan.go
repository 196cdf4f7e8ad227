package request

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// errEnd means the bytes ran out: for a partial body, that is where the cut was.
var errEnd = errors.New("unexpected end of input")

// scanner is a minimal JSON tokenizer over one byte slice. It allocates nothing: strings
// are unescaped straight into a caller's sink. It checks the syntax it reads, and skips
// values it does not need without building them.
type scanner struct {
	b        []byte
	i        int
	depth    int
	maxDepth int
	esc      [utf8.UTFMax]byte // an unescaped character on its way to a sink
}

func (s *scanner) syntax(what string) error {
	return fmt.Errorf("%s at byte %d", what, s.i)
}

// next skips white space and returns the next byte without consuming it.
func (s *scanner) next() (byte, error) {
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return c, nil
		}
	}
	return 0, errEnd
}

func (s *scanner) expect(c byte) error {
	got, err := s.next()
	if err != nil {
		return err
	}
	if got != c {
		return s.syntax(fmt.Sprintf("expected %q, found %q", c, got))
	}
	s.i++
	return nil
}

// more reports whether a container holds another element, consuming the comma before it;
// first is true for the first element. It returns false after consuming the closing byte.
func (s *scanner) more(first bool, closing byte) (bool, error) {
	c, err := s.next()
	if err != nil {
		return false, err
	}
	if c == closing {
		s.i++
		s.depth--
		return false, nil
	}
	if first {
		return true, nil
	}
	if c != ',' {
		return false, s.syntax(fmt.Sprintf("expected ',' or %q", closing))
	}
	s.i++
	return true, nil
}

// open consumes an opening '{' or '[' and enforces the depth limit.
func (s *scanner) open(c byte) error {
	if err := s.expect(c); err != nil {
		return err
	}
	s.depth++
	if s.depth > s.maxDepth {
		return badf("JSON nested deeper than %d levels", s.maxDepth)
	}
	return nil
}

// str reads a string, passing its unescaped bytes to sink in pieces (sink may be nil to
// discard them). On a cut inside the string, the bytes before the cut have been passed.
func (s *scanner) str(sink func([]byte)) error {
	if err := s.expect('"'); err != nil {
		return err
	}
	start := s.i
	for s.i < len(s.b) {
		// Long prompts are mostly plain text: pass 8 bytes at a time while none of them
		// ends the string, starts an escape or is a control character.
		if s.i+8 <= len(s.b) && plain8(binary.LittleEndian.Uint64(s.b[s.i:])) {
			s.i += 8
			continue
		}
		c := s.b[s.i]
		switch {
		case c == '"':
			if sink != nil && s.i > start {
				sink(s.b[start:s.i])
			}
			s.i++
			return nil
		case c == '\\':
			if sink != nil && s.i > start {
				sink(s.b[start:s.i])
			}
			if err := s.escape(sink); err != nil {
				return err
			}
			start = s.i
		case c < 0x20:
			return s.syntax("control character in string")
		default:
			s.i++
		}
	}
	if sink != nil && s.i > start {
		sink(s.b[start:s.i])
	}
	return errEnd
}

// plain8 reports whether none of the 8 bytes in x is '"', '\\' or below 0x20: the bytes a
// string scan must stop at. (The classic tests for a zero byte, and for a byte less than
// n, over a word: exact as to whether any byte matches.)
func plain8(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(v uint64) uint64 { return (v - ones) & ^v & highs }
	less := (x - 0x20*ones) & ^x & highs
	return zero(x^('"'*ones))|zero(x^('\\'*ones))|less == 0
}

// escape decodes one escape sequence at s.i (the backslash).
func (s *scanner) escape(sink func([]byte)) error {
	if s.i+1 >= len(s.b) {
		s.i = len(s.b)
		return errEnd
	}
	one := s.esc[:]
	c := s.b[s.i+1]
	switch c {
	case '"', '\\', '/':
		one[0] = c
	case 'b':
		one[0] = '\b'
	case 'f':
		one[0] = '\f'
	case 'n':
		one[0] = '\n'
	case 'r':
		one[0] = '\r'
	case 't':
		one[0] = '\t'
	case 'u':
		r, n, err := s.unicode(s.i)
		if err != nil {
			return err
		}
		s.i += n
		if sink != nil {
			sink(one[:utf8.EncodeRune(one[:], r)])
		}
		return nil
	default:
		return s.syntax("invalid escape")
	}
	s.i += 2
	if sink != nil {
		sink(one[:1])
	}
	return nil
}

// unicode decodes \uXXXX at i, joining a surrogate pair; it returns the rune and the bytes
// consumed. A lone surrogate becomes U+FFFD, as encoding/json does.
func (s *scanner) unicode(i int) (rune, int, error) {
	r1, err := s.hex4(i)
	if err != nil {
		return 0, 0, err
	}
	if !utf16.IsSurrogate(r1) {
		return r1, 6, nil
	}
	if i+12 <= len(s.b) {
		if s.b[i+6] == '\\' && s.b[i+7] == 'u' {
			if r2, err := s.hex4(i + 6); err == nil {
				if r := utf16.DecodeRune(r1, r2); r != utf8.RuneError {
					return r, 12, nil
				}
			}
		}
	} else if rest := s.b[i+6:]; len(rest) > 0 && rest[0] == '\\' && (len(rest) == 1 || rest[1] == 'u') {
		// The pair's second half may continue past a cut.
		s.i = len(s.b)
		return 0, 0, errEnd
	}
	return utf8.RuneError, 6, nil
}

func (s *scanner) hex4(i int) (rune, error) {
	if i+6 > len(s.b) {
		s.i = len(s.b)
		return 0, errEnd
	}
	var r rune
	for _, c := range s.b[i+2 : i+6] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, s.syntax("invalid \\u escape")
		}
	}
	return r, nil
}

// literal reads true, false or null; it returns which.
func (s *scanner) literal() (string, error) {
	for _, lit := range [...]string{"true", "false", "null"} {
		if s.i < len(s.b) && s.b[s.i] == lit[0] {
			n := min(len(lit), len(s.b)-s.i)
			if string(s.b[s.i:s.i+n]) != lit[:n] {
				return "", s.syntax("invalid literal")
			}
			if n < len(lit) {
				s.i = len(s.b)
				return "", errEnd
			}
			s.i += n
			return lit, nil
		}
	}
	return "", s.syntax("invalid literal")
}

// number reads a JSON number (-?(0|[1-9]d*)(.d+)?([eE][+-]?d+)?) and returns its bytes.
func (s *scanner) number() ([]byte, error) {
	start := s.i
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case digits() == 0:
		if s.i == len(s.b) {
			return nil, errEnd
		}
		return nil, s.syntax("invalid number")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			if s.i == len(s.b) {
				return nil, errEnd
			}
			return nil, s.syntax("invalid number")
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			if s.i == len(s.b) {
				return nil, errEnd
			}
			return nil, s.syntax("invalid number")
		}
	}
	if s.i == len(s.b) {
		return nil, errEnd // a number may continue past a cut; a body never ends in one
	}
	return s.b[start:s.i], nil
}

// skip consumes one value of any type.
func (s *scanner) skip() error {
	c, err := s.next()
	if err != nil {
		return err
	}
	switch {
	case c == '"':
		return s.str(nil)
	case c == '{':
		if err := s.open('{'); err != nil {
			return err
		}
		for first := true; ; first = false {
			ok, err := s.more(first, '}')
			if err != nil || !ok {
				return err
			}
			if err := s.str(nil); err != nil {
				return err
			}
			if err := s.expect(':'); err != nil {
				return err
			}
			if err := s.skip(); err != nil {
				return err
			}
		}
	case c == '[':
		if err := s.open('['); err != nil {
			return err
		}
		for first := true; ; first = false {
			ok, err := s.more(first, ']')
			if err != nil || !ok {
				return err
			}
			if err := s.skip(); err != nil {
				return err
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		_, err := s.number()
		return err
	default:
		_, err := s.literal()
		return err
	}
}

// key reads an object key into buf (keys we look for are short and unescaped).
func (s *scanner) key(buf []byte) ([]byte, error) {
	buf = buf[:0]
	err := s.str(func(p []byte) {
		if len(buf)+len(p) <= cap(buf) {
			buf = append(buf, p...)
		} else {
			buf = buf[:cap(buf)] // too long to be a key we want; keep it unequal
		}
	})
	if err != nil {
		return nil, err
	}
	return buf, s.expect(':')
}

// object reads an object, calling field for each key with the scanner at its value; field
// must consume the value. notObject is the client error when the value is not an object.
func (s *scanner) object(notObject func() error, scratch []byte, field func(key []byte) error) error {
	if c, err := s.next(); err != nil {
		return err
	} else if c != '{' {
		return notObject()
	}
	if err := s.open('{'); err != nil {
		return err
	}
	for first := true; ; first = false {
		ok, err := s.more(first, '}')
		if err != nil || !ok {
			return err
		}
		k, err := s.key(scratch)
		if err != nil {
			return err
		}
		if err := field(k); err != nil {
			return err
		}
	}
}

// array reads an array, calling elem for each element with the scanner at it; elem must
// consume the element. notArray is the client error when the value is not an array.
func (s *scanner) array(notArray func() error, elem func(i int) error) error {
	if c, err := s.next(); err != nil {
		return err
	} else if c != '[' {
		return notArray()
	}
	if err := s.open('['); err != nil {
		return err
	}
	for i := 0; ; i++ {
		ok, err := s.more(i == 0, ']')
		if err != nil || !ok {
			return err
		}
		if err := elem(i); err != nil {
			return err
		}
	}
}

// stringInto reads a string value into sink, or fails with notString. The error
// constructors are called only on failure, so the hot path formats nothing.
func (s *scanner) stringInto(notString func() error, sink func([]byte)) error {
	if c, err := s.next(); err != nil {
		return err
	} else if c != '"' {
		return notString()
	}
	return s.str(sink)
}

// parser walks an OpenAI request body and feeds the hasher the canonical prompt.
type parser struct {
	sc          scanner
	h           *hasher
	kind        Kind
	sawMessages bool
	sawPrompt   bool
	sawInput    bool
	messages    int
	// Where the Responses API's instructions and input values start (-1: not seen): they
	// are hashed after the walk, instructions first (see hashResponse).
	instructionsAt, inputAt int
	scratch                 [32]byte
	tok                     [8]byte
	model                   [256]byte
}

// errNotObject is kept as a value so the hot path builds no error it does not return.
var errNotObject = &Error{Reason: "invalid JSON body: it must be a JSON object"}

func (p *parser) top(r *Request) error {
	err := p.sc.object(func() error { return errNotObject }, p.scratch[:0], func(k []byte) error {
		switch string(k) {
		case "model":
			return p.readModel(r)
		case "stream":
			return p.readStream(r)
		case "messages":
			if p.kind == ChatCompletions {
				p.sawMessages = true
				return p.readMessages()
			}
		case "prompt":
			if p.kind == Completions {
				p.sawPrompt = true
				return p.readPrompt(errPromptShape, false)
			}
		case "input":
			switch p.kind {
			case Embeddings:
				p.sawInput = true
				return p.readPrompt(errEmbeddingInput, true)
			case Responses:
				p.sawInput = true
				return p.mark(&p.inputAt)
			}
		case "instructions":
			if p.kind == Responses {
				return p.mark(&p.instructionsAt)
			}
		}
		return p.sc.skip()
	})
	if err != nil {
		return err
	}
	if c, err := p.sc.next(); err == nil {
		return p.sc.syntax(fmt.Sprintf("unexpected %q after the top-level object", c))
	}
	return nil
}

var errModelType = &Error{Reason: "'model' must be a string"}

func (p *parser) readModel(r *Request) error {
	buf := p.model[:0]
	long := false
	err := p.sc.stringInto(func() error { return errModelType }, func(b []byte) {
		if len(buf)+len(b) > cap(buf) {
			long = true
			return
		}
		buf = append(buf, b...)
	})
	if err != nil {
		return err // a model cut short is no model: the caller cannot route on half a name
	}
	if long {
		return badf("'model' is longer than %d bytes", cap(p.model))
	}
	r.Model = string(buf)
	return nil
}

func (p *parser) readStream(r *Request) error {
	c, err := p.sc.next()
	if err != nil {
		return err
	}
	if c != 't' && c != 'f' && c != 'n' {
		return badf("'stream' must be a boolean")
	}
	lit, err := p.sc.literal()
	r.Stream = lit == "true"
	return err
}

var (
	sepRole    = []byte{0}
	sepMessage = []byte{0x1e}
)

var errMessagesType = &Error{Reason: "'messages' must be an array"}

func (p *parser) readMessages() error {
	return p.sc.array(func() error { return errMessagesType }, func(int) error {
		if err := p.readMessage(); err != nil {
			return err
		}
		p.messages++
		return nil
	})
}

// readMessage hashes role NUL content ... RS, whatever the order of the keys: a content
// that comes before the role (the official Go SDK sends it so) is hashed after the object,
// so the same message hashes alike from every client.
func (p *parser) readMessage() error {
	sawRole, contentAt := false, -1
	err := p.sc.object(func() error { return badf("messages[%d] must be an object", p.messages) }, p.scratch[:0], func(k []byte) error {
		switch string(k) {
		case "role":
			if err := p.sc.stringInto(func() error { return badf("messages[%d].role must be a string", p.messages) }, p.h.write); err != nil {
				return err
			}
			p.h.write(sepRole)
			sawRole = true
			return nil
		case "content":
			if !sawRole {
				return p.mark(&contentAt)
			}
			return p.readContent()
		}
		return p.sc.skip()
	})
	if contentAt >= 0 && (err == nil || errors.Is(err, errEnd)) {
		i, depth := p.sc.i, p.sc.depth
		p.sc.i, p.sc.depth = contentAt, depth+1
		if cerr := p.readContent(); cerr != nil && !errors.Is(cerr, errEnd) {
			return cerr
		}
		p.sc.i, p.sc.depth = i, depth
	}
	if err != nil {
		return err
	}
	p.h.write(sepMessage)
	return nil
}

// readContent accepts a string, null, or an array of parts whose text parts are hashed.
func (p *parser) readContent() error {
	c, err := p.sc.next()
	if err != nil {
		return err
	}
	switch c {
	case '"':
		return p.sc.str(p.h.write)
	case 'n':
		lit, err := p.sc.literal()
		if err == nil && lit != "null" {
			return badf("messages[%d].content must be a string or an array of parts", p.messages)
		}
		return err
	case '[':
	default:
		return badf("messages[%d].content must be a string or an array of parts", p.messages)
	}
	return p.sc.array(nil /* checked above */, func(int) error {
		return p.sc.object(func() error { return badf("messages[%d].content parts must be objects", p.messages) }, p.scratch[:0], func(k []byte) error {
			if string(k) != "text" {
				return p.sc.skip()
			}
			return p.sc.stringInto(func() error { return badf("messages[%d].content[].text must be a string", p.messages) }, p.h.write)
		})
	})
}

var errPromptShape = &Error{Reason: "'prompt' must be a string, an array of strings or an array of token ids"}

// readPrompt accepts a string, an array of strings (the first is hashed: a batch shares no
// single prefix), or an array of token ids; with nested, also an array of token id arrays
// (the embeddings API's batch form; the first is hashed). bad is the shape error.
func (p *parser) readPrompt(bad *Error, nested bool) error {
	c, err := p.sc.next()
	if err != nil {
		return err
	}
	if c == '"' {
		return p.sc.str(p.h.write)
	}
	return p.sc.array(func() error { return bad }, func(i int) error {
		c, err := p.sc.next()
		if err != nil {
			return err
		}
		switch {
		case c == '"':
			sink := p.h.write
			if i > 0 {
				sink = nil
			}
			return p.sc.str(sink)
		case c == '[' && nested:
			if i > 0 {
				return p.sc.skip()
			}
			return p.sc.array(nil, func(int) error { return p.tokenID(bad) })
		case c == '-' || c >= '0' && c <= '9':
			return p.tokenID(bad)
		}
		return bad
	})
}

var errTokenID = &Error{Reason: "token ids must be integers"}

// tokenID hashes one integer token id as 8 little-endian bytes; notNumber is the client
// error when the value is not a number.
func (p *parser) tokenID(notNumber error) error {
	c, err := p.sc.next()
	if err != nil {
		return err
	}
	if c != '-' && (c < '0' || c > '9') {
		return notNumber
	}
	num, err := p.sc.number()
	if err != nil {
		return err
	}
	n, ok := parseInt(num)
	if !ok {
		return errTokenID
	}
	binary.LittleEndian.PutUint64(p.tok[:], uint64(n))
	p.h.write(p.tok[:])
	return nil
}

func parseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}
