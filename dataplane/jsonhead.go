package dataplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
)

// One body, one meaning. encoding/json matches a struct's keys without
// regard to case and keeps the last of duplicates; an upstream may keep
// the first, or match exactly. A body {"model":"opus","MODEL":"haiku"}
// would then be checked against the key's allowlist as haiku and served
// as opus. So weir reads a body's head exactly (a key is the field only
// spelled exactly so, after JSON unescaping, as every upstream reads it)
// and refuses, at the levels it reads, a key that comes twice and a key
// that is a case variant of a field it reads: what weir checked is then
// what any upstream reads, whatever its rule for duplicates and case.
//
// A body is read in one pass of headScan (jsonscan.go), which checks the
// whole body's syntax as it goes and reads the levels weir reads without
// copying the body. It gives up on anything but a clean head: a syntax
// error, a key written with escapes, a duplicate or case-variant key, a
// field of the wrong type. Those bodies are read again by a json.Decoder
// (parseHeadDecoder), whose answer, the head or the error the client
// gets, is the one that stands; the scan only ever agrees with it
// (TestHeadScanAgrees, FuzzHeadScan).

// requestHead is what weir reads of a request body.
type requestHead struct {
	model          *string // nil: absent or null
	stream         bool
	userID         string // metadata.user_id
	promptCacheKey string
}

// headError is a body weir refuses for its shape, not its syntax; its
// text is the client's message.
type headError string

func (e headError) Error() string { return string(e) }

// errNotObject is the answer to a body that is JSON but not an object.
const errNotObject = headError("request body must be a JSON object")

// fieldReader reads one field's value, the next value of dec.
type fieldReader func(dec *json.Decoder) error

// parseHead reads body's head: the top level's model, stream,
// prompt_cache_key and metadata, and metadata's user_id. Its error is a
// headError, or the decoder's (invalid JSON, a field of the wrong type).
func parseHead(body []byte) (requestHead, error) {
	if h, ok := headScan(body); ok {
		return h, nil
	}
	return parseHeadDecoder(body)
}

// parseHeadDecoder is parseHead by a json.Decoder: slower (the decoder
// copies the body), but it names what is wrong with a body.
func parseHeadDecoder(body []byte) (requestHead, error) {
	var h requestHead
	metadata := map[string]fieldReader{"user_id": stringField(&h.userID, "metadata.user_id")}
	return h, scanTop(body, map[string]fieldReader{
		"model":            func(dec *json.Decoder) error { return decodeField(dec, &h.model, "model") },
		"stream":           func(dec *json.Decoder) error { return decodeField(dec, &h.stream, "stream") },
		"prompt_cache_key": stringField(&h.promptCacheKey, "prompt_cache_key"),
		"metadata": func(dec *json.Decoder) error {
			return objectField(dec, "metadata.", metadata)
		},
	})
}

// scanTop scans body as one JSON object whose top-level fields are read
// by fields, and nothing after it.
func scanTop(body []byte, fields map[string]fieldReader) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if t != json.Delim('{') {
		return errNotObject
	}
	if err := scanObject(dec, "", fields); err != nil {
		return err
	}
	switch _, err := dec.Token(); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return err
	}
	return &json.SyntaxError{Offset: dec.InputOffset()}
}

// scanObject reads the members of the object whose '{' dec just
// returned, through its '}': each key at most once, and no key that
// differs from a field weir reads only in case. path prefixes the keys in
// messages ("metadata.").
func scanObject(dec *json.Decoder, path string, fields map[string]fieldReader) error {
	seen := make(map[string]struct{}, 16)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := t.(string) // the decoder gives only strings in key position
		if _, dup := seen[key]; dup {
			return headError("request body has the key " + strconv.Quote(path+key) + " more than once; send each key once")
		}
		seen[key] = struct{}{}
		if read, ok := fields[key]; ok {
			if err := read(dec); err != nil {
				return err
			}
			continue
		}
		for name := range fields {
			if strings.EqualFold(key, name) {
				return headError("request body has the key " + strconv.Quote(path+key) + ": weir reads " +
					strconv.Quote(path+name) + ", spelled exactly so; send it once, in lower case")
			}
		}
		if err := dec.Decode(&skipValue{}); err != nil {
			return err
		}
	}
	_, err := dec.Token() // the closing '}'
	return err
}

// skipValue takes any JSON value and keeps nothing: the decoder checks
// the value's syntax and hands it over without decoding it.
type skipValue struct{}

func (*skipValue) UnmarshalJSON([]byte) error { return nil }

// decodeField decodes the next value into dst, naming field when it has
// the wrong type.
func decodeField(dec *json.Decoder, dst any, field string) error {
	if err := dec.Decode(dst); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			return headError("request body is not valid JSON: field " + field + " has the wrong type")
		}
		return err
	}
	return nil
}

// stringField reads a string (null: empty) into dst.
func stringField(dst *string, field string) fieldReader {
	return func(dec *json.Decoder) error { return decodeField(dec, dst, field) }
}

// objectField reads an object's fields (null: none) one level down.
func objectField(dec *json.Decoder, path string, fields map[string]fieldReader) error {
	t, err := dec.Token()
	switch {
	case err != nil:
		return err
	case t == nil:
		return nil
	case t != json.Delim('{'):
		return headError("request body is not valid JSON: field " + strings.TrimSuffix(path, ".") + " has the wrong type")
	}
	return scanObject(dec, path, fields)
}
