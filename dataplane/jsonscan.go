package dataplane

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// headScan reads a request body's head in one pass over the body, without
// copying it: the fields parseHeadDecoder reads, where they are plain,
// and every other value checked for JSON syntax and skipped. ok is false
// wherever it is not sure to read what the decoder reads: invalid JSON, a
// key written with escapes or not valid UTF-8, a key twice or a case
// variant of a field at the levels read, a field of the wrong type, a
// read string with escapes, nesting deeper than maxScanDepth, more than
// maxScanKeys keys at a level it reads. The caller then asks the decoder,
// whose answer stands.
func headScan(body []byte) (h requestHead, ok bool) {
	sc := jsonScanner{b: body}
	sc.space()
	if !sc.take('{') {
		return h, false
	}
	ok = sc.object(headTop, func(field int) bool {
		switch field {
		case 0: // model
			if sc.takeNull() {
				h.model = nil
				return true
			}
			s, ok := sc.plainString()
			h.model = &s
			return ok
		case 1: // stream
			switch {
			case sc.takeLiteral("true"):
				h.stream = true
			case sc.takeLiteral("false"):
				h.stream = false
			default:
				return sc.takeNull()
			}
			return true
		case 2: // prompt_cache_key
			return sc.stringOrNull(&h.promptCacheKey)
		default: // metadata
			if sc.takeNull() {
				return true
			}
			if !sc.take('{') {
				return false
			}
			return sc.object(headMetadata, func(int) bool { return sc.stringOrNull(&h.userID) })
		}
	})
	return h, ok && sc.end()
}

// decodeUsage decodes the value of body's top-level "usage" into dst as
// json.Unmarshal(body, &struct{ Usage T `json:"usage"` }) would, with an
// error of the same kind, in one pass: the rest of the body (an answer's
// content, tens of KB) is only checked for syntax, and a usage object of
// plain counts is read by the scan itself (scanUsage). Where the scan is
// not sure (as for headScan) the decoder answers: for the usage object
// alone, or for the whole body. On an error dst is left as it was.
func decodeUsage[T any, PT interface {
	*T
	scanUsage(sc *jsonScanner) bool
}](body []byte, dst PT) error {
	sc := jsonScanner{b: body}
	var raw []byte // the value's text, nil without the key
	sc.space()
	ok := sc.take('{') && sc.object(usageTop, func(int) bool {
		from := sc.i
		if !sc.value() {
			return false
		}
		raw = body[from:sc.i]
		return true
	})
	if !ok || !sc.end() {
		var m struct {
			Usage T `json:"usage"`
		}
		if err := json.Unmarshal(body, &m); err != nil {
			return err
		}
		*dst = m.Usage
		return nil
	}
	var v T
	if raw != nil {
		if u := (jsonScanner{b: raw}); !PT(&v).scanUsage(&u) || !u.end() {
			v = *new(T)
			if err := json.Unmarshal(raw, &v); err != nil {
				return err
			}
		}
	}
	*dst = v
	return nil
}

// int64OrNull takes an integer that fits an int64 into dst, or null (dst
// unchanged): what encoding/json decodes into an int64 field without an
// error. Anything else (a fraction, an exponent, a string) is false: the
// decoder answers it.
func (sc *jsonScanner) int64OrNull(dst *int64) bool {
	if sc.takeNull() {
		return true
	}
	from := sc.i
	if !sc.number() {
		return false
	}
	digits := sc.b[from:sc.i]
	neg := digits[0] == '-'
	if neg {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 { // 18 digits cannot overflow
		return false
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	*dst = n
	return true
}

// countsObject takes null (a struct left as it was, as encoding/json
// leaves it) or an object, whose fields[k] read(k) takes (other keys
// skipped).
func (sc *jsonScanner) countsObject(fields [][]byte, read func(field int) bool) bool {
	if sc.takeNull() {
		return true
	}
	return sc.take('{') && sc.object(fields, read)
}

var usageTop = [][]byte{[]byte("usage")}

// validJSON is json.Valid by the scan, which is several times faster: a
// stream's every event is checked. What the scan does not take (not JSON,
// or nested past maxScanDepth) json.Valid answers.
func validJSON(b []byte) bool {
	sc := jsonScanner{b: b}
	sc.space()
	return sc.value() && sc.end() || json.Valid(b)
}

// The fields headScan reads, in the order its switch names them.
var (
	headTop      = [][]byte{[]byte("model"), []byte("stream"), []byte("prompt_cache_key"), []byte("metadata")}
	headMetadata = [][]byte{[]byte("user_id")}
)

// maxScanKeys is how many keys an object read may have: the duplicate
// check compares each key with those before it, and an agent's body has
// a dozen at its top. More go to the decoder.
const maxScanKeys = 32

// maxScanDepth is how deep jsonScanner follows nested values before it
// gives up (encoding/json itself refuses past 10,000).
const maxScanDepth = 1000

// jsonScanner walks JSON text, checking its syntax as encoding/json's
// scanner does. Its methods report false where the text is not JSON or
// not what the caller reads; i is then meaningless.
type jsonScanner struct {
	b     []byte
	i     int
	depth int
}

func (sc *jsonScanner) space() {
	for sc.i < len(sc.b) {
		switch sc.b[sc.i] {
		case ' ', '\t', '\n', '\r':
			sc.i++
		default:
			return
		}
	}
}

// take consumes c if it is next.
func (sc *jsonScanner) take(c byte) bool {
	if sc.i < len(sc.b) && sc.b[sc.i] == c {
		sc.i++
		return true
	}
	return false
}

func (sc *jsonScanner) takeLiteral(lit string) bool {
	if len(sc.b)-sc.i >= len(lit) && string(sc.b[sc.i:sc.i+len(lit)]) == lit {
		sc.i += len(lit)
		return true
	}
	return false
}

func (sc *jsonScanner) takeNull() bool { return sc.takeLiteral("null") }

// members reads the members of an object whose '{' was just taken,
// through its '}': for each, its key's text as written and whether it
// holds escapes, then member, which must take the whole value.
func (sc *jsonScanner) members(member func(key []byte, escaped bool) bool) bool {
	sc.space()
	if sc.take('}') {
		return true
	}
	for {
		key, escaped, ok := sc.str()
		if !ok {
			return false
		}
		sc.space()
		if !sc.take(':') {
			return false
		}
		sc.space()
		if !member(key, escaped) {
			return false
		}
		sc.space()
		switch {
		case sc.take(','):
			sc.space()
		case sc.take('}'):
			return true
		default:
			return false
		}
	}
}

// object reads the members of an object whose '{' was just taken,
// through its '}'. A key equal to fields[k] has its value read by
// read(k), which must take the whole value; other keys' values are
// skipped. Any key twice, or a case variant of a field, is a give-up.
func (sc *jsonScanner) object(fields [][]byte, read func(field int) bool) bool {
	var seen [maxScanKeys][]byte
	keys := seen[:0]
	return sc.members(func(key []byte, escaped bool) bool {
		if escaped || !utf8.Valid(key) || len(keys) == maxScanKeys {
			return false
		}
		for _, k := range keys {
			if bytes.Equal(k, key) {
				return false
			}
		}
		keys = append(keys, key)
		for k, name := range fields {
			if bytes.Equal(key, name) {
				return read(k)
			}
			if bytes.EqualFold(key, name) {
				return false
			}
		}
		return sc.value()
	})
}

// end takes the white space after a value and says whether the text ends
// there.
func (sc *jsonScanner) end() bool {
	sc.space()
	return sc.i == len(sc.b)
}

// str takes a string, which must be next, and gives its text as written,
// and whether it holds escapes (only without them is that its value).
func (sc *jsonScanner) str() (raw []byte, escaped, ok bool) {
	if !sc.take('"') {
		return nil, false, false
	}
	start := sc.i
	for sc.i < len(sc.b) {
		switch c := sc.b[sc.i]; {
		case c == '"':
			raw = sc.b[start:sc.i]
			sc.i++
			return raw, escaped, true
		case c == '\\':
			escaped = true
			if !sc.escape() {
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		default:
			sc.i++
		}
	}
	return nil, false, false
}

// escape takes one escape sequence, its '\' next.
func (sc *jsonScanner) escape() bool {
	if sc.i+1 >= len(sc.b) {
		return false
	}
	switch sc.b[sc.i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		sc.i += 2
		return true
	case 'u':
		if sc.i+6 > len(sc.b) {
			return false
		}
		for _, c := range sc.b[sc.i+2 : sc.i+6] {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
		sc.i += 6
		return true
	}
	return false
}

// plainString takes a string without escapes whose text is valid UTF-8.
func (sc *jsonScanner) plainString() (string, bool) {
	raw, escaped, ok := sc.str()
	if !ok || escaped || !utf8.Valid(raw) {
		return "", false
	}
	return string(raw), true
}

// stringOrNull takes a plain string into dst, or null (dst unchanged, as
// encoding/json leaves it).
func (sc *jsonScanner) stringOrNull(dst *string) bool {
	if sc.takeNull() {
		return true
	}
	s, ok := sc.plainString()
	*dst = s
	return ok
}

// value takes any JSON value.
func (sc *jsonScanner) value() bool {
	if sc.i >= len(sc.b) {
		return false
	}
	switch sc.b[sc.i] {
	case '"':
		_, _, ok := sc.str()
		return ok
	case '{', '[':
		return sc.container()
	case 't':
		return sc.takeLiteral("true")
	case 'f':
		return sc.takeLiteral("false")
	case 'n':
		return sc.takeNull()
	}
	return sc.number()
}

// container takes an object or an array, without reading its keys.
func (sc *jsonScanner) container() bool {
	if sc.depth++; sc.depth > maxScanDepth {
		return false
	}
	defer func() { sc.depth-- }()
	object := sc.b[sc.i] == '{'
	closer := byte(']')
	if object {
		closer = '}'
	}
	sc.i++
	sc.space()
	if sc.take(closer) {
		return true
	}
	for {
		if object {
			if _, _, ok := sc.str(); !ok {
				return false
			}
			sc.space()
			if !sc.take(':') {
				return false
			}
			sc.space()
		}
		if !sc.value() {
			return false
		}
		sc.space()
		switch {
		case sc.take(','):
			sc.space()
		case sc.take(closer):
			return true
		default:
			return false
		}
	}
}

// number takes a number as JSON writes one:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (sc *jsonScanner) number() bool {
	sc.take('-')
	switch {
	case sc.take('0'):
	case sc.digits() == 0:
		return false
	}
	if sc.take('.') && sc.digits() == 0 {
		return false
	}
	if sc.take('e') || sc.take('E') {
		if !sc.take('+') {
			sc.take('-')
		}
		if sc.digits() == 0 {
			return false
		}
	}
	return true
}

// digits takes a run of decimal digits and says how many.
func (sc *jsonScanner) digits() int {
	start := sc.i
	for sc.i < len(sc.b) && '0' <= sc.b[sc.i] && sc.b[sc.i] <= '9' {
		sc.i++
	}
	return sc.i - start
}
