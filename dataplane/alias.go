package dataplane

import (
	"bytes"
	"encoding/json"
	"errors"
)

// withModel returns body with its top-level "model" set to model (every
// top-level "model" key, should there be duplicates), and nothing else
// changed: the rest of the bytes go upstream as the client sent them. The
// lease names a model only when the client asked for an alias. The
// values' places come from one pass of the scan (modelSpans) where it is
// sure of them, else from the decoder.
func withModel(body []byte, model string) ([]byte, error) {
	spans, ok := modelSpans(body)
	if !ok {
		var err error
		if spans, err = modelSpansDecoder(body); err != nil {
			return nil, err
		}
	}
	if len(spans) == 0 {
		return nil, errors.New("request body has no model")
	}
	enc, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(body)+len(spans)*len(enc))
	at := 0
	for _, sp := range spans {
		out = append(append(out, body[at:sp.start]...), enc...)
		at = sp.end
	}
	return append(out, body[at:]...), nil
}

// A valueSpan is where a value's text is in a body: [start, end).
type valueSpan struct{ start, end int }

// modelSpans finds the top-level "model" values of a JSON object in one
// pass, checking the whole body's syntax. ok is false wherever the
// decoder might read it otherwise (a key written with escapes, which may
// spell "model"), where the scan gives up (see headScan), and where
// anything follows the object: the decoder, which stops at the object's
// end, answers those.
func modelSpans(body []byte) (spans []valueSpan, ok bool) {
	sc := jsonScanner{b: body}
	sc.space()
	ok = sc.take('{') && sc.members(func(key []byte, escaped bool) bool {
		from := sc.i
		if escaped || !sc.value() {
			return false
		}
		if string(key) == "model" {
			spans = append(spans, valueSpan{from, sc.i})
		}
		return true
	})
	if !ok || !sc.end() {
		return nil, false
	}
	return spans, true
}

// modelSpansDecoder is modelSpans by the decoder, token by token: it
// reads escaped keys as what they spell and stops at the object's end.
func modelSpansDecoder(body []byte) ([]valueSpan, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("request body is not a JSON object")
	}
	var spans []valueSpan
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keyEnd := int(dec.InputOffset())
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		if key != "model" {
			continue
		}
		end := int(dec.InputOffset())
		// The value starts after the colon and any white space.
		start := keyEnd
		for start < end && (body[start] == ':' || body[start] == ' ' || body[start] == '\t' || body[start] == '\n' || body[start] == '\r') {
			start++
		}
		spans = append(spans, valueSpan{start, end})
	}
	return spans, nil
}
