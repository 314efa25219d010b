package dataplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
)

// withModel returns body with its top-level "model" set to model (every
// top-level "model" key, should there be duplicates), and nothing else
// changed: the rest of the bytes go upstream as the client sent them. The
// lease names a model only when the client asked for an alias.
func withModel(body []byte, model string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("request body is not a JSON object")
	}
	type span struct{ start, end int64 }
	var spans []span
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keyEnd := dec.InputOffset()
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		if key != "model" {
			continue
		}
		end := dec.InputOffset()
		// The value starts after the colon and any white space.
		start := keyEnd
		for start < end && (body[start] == ':' || body[start] == ' ' || body[start] == '\t' || body[start] == '\n' || body[start] == '\r') {
			start++
		}
		spans = append(spans, span{start, end})
	}
	if len(spans) == 0 {
		return nil, errors.New("request body has no model")
	}
	enc, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(body)
	for _, sp := range slices.Backward(spans) {
		out = slices.Concat(out[:sp.start], enc, out[sp.end:])
	}
	return out, nil
}
