package request

// The Responses API (/v1/responses) and the embeddings API (/v1/embeddings).
//
// A Responses request's canonical prompt is the one of the chat request it stands for:
// the instructions as a system message, then each input item as role NUL text RS (a string
// input is one user message). So a Responses request and the chat request with the same
// system prompt and messages share their prefix blocks, and a follow-up turn that resends
// the conversation's items extends the earlier turn's chain. Of an item, the role and the
// text of content, output, name and arguments are hashed, in the order they arrive; type,
// id and status are not, so an item echoed back from a response hashes as it did when the
// client sent it. A turn that sends only previous_response_id and its new items has a
// different prefix: the engine that holds the history cannot be told from the body alone.

var roleSystem, roleUser = []byte("system"), []byte("user")

// mark records where the value at the scanner starts and skips it; hashResponse reads it.
func (p *parser) mark(at *int) error {
	if _, err := p.sc.next(); err != nil {
		return err
	}
	*at = p.sc.i
	return p.sc.skip()
}

// hashResponse hashes the instructions and then the input that mark found. The walk has
// already checked their syntax; this pass checks their shape. errEnd means a cut body.
func (p *parser) hashResponse() error {
	if p.instructionsAt >= 0 {
		p.sc.i, p.sc.depth = p.instructionsAt, 1
		c, err := p.sc.next()
		if err != nil {
			return err
		}
		switch c {
		case 'n':
			if _, err := p.sc.literal(); err != nil {
				return err
			}
		case '"':
			p.h.write(roleSystem)
			p.h.write(sepRole)
			if err := p.sc.str(p.h.write); err != nil {
				return err
			}
			p.h.write(sepMessage)
		default:
			return badf("'instructions' must be a string")
		}
	}
	if p.inputAt < 0 {
		return nil
	}
	p.sc.i, p.sc.depth = p.inputAt, 1
	c, err := p.sc.next()
	if err != nil {
		return err
	}
	if c == '"' {
		p.h.write(roleUser)
		p.h.write(sepRole)
		if err := p.sc.str(p.h.write); err != nil {
			return err
		}
		p.h.write(sepMessage)
		return nil
	}
	return p.sc.array(func() error { return errInputShape }, func(i int) error {
		if err := p.readItem(i); err != nil {
			return err
		}
		p.messages++
		return nil
	})
}

var errInputShape = &Error{Reason: "'input' must be a string or an array of input items"}

// readItem hashes one input item: role NUL text... RS.
func (p *parser) readItem(i int) error {
	err := p.sc.object(func() error { return badf("input[%d] must be an object", i) }, p.scratch[:0], func(k []byte) error {
		switch string(k) {
		case "role":
			if err := p.sc.stringInto(func() error { return badf("input[%d].role must be a string", i) }, p.h.write); err != nil {
				return err
			}
			p.h.write(sepRole)
			return nil
		case "content", "output", "name", "arguments":
			return p.readItemText(i, k)
		}
		return p.sc.skip()
	})
	if err != nil {
		return err
	}
	p.h.write(sepMessage)
	return nil
}

// readItemText hashes a string, nothing for null, or the text of an array of parts.
func (p *parser) readItemText(i int, field []byte) error {
	shape := func() error {
		return badf("input[%d].%s must be a string or an array of parts", i, field)
	}
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
			return shape()
		}
		return err
	case '[':
	default:
		return shape()
	}
	return p.sc.array(nil /* checked above */, func(int) error {
		return p.sc.object(func() error { return badf("input[%d] content parts must be objects", i) }, p.scratch[:0], func(k []byte) error {
			if string(k) != "text" {
				return p.sc.skip()
			}
			return p.sc.stringInto(func() error { return badf("input[%d] content part text must be a string", i) }, p.h.write)
		})
	})
}

var errEmbeddingInput = &Error{Reason: "'input' must be a string, an array of strings, an array of token ids or an array of token id arrays"}
