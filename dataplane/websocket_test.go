package dataplane

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestWithoutEnvelope: a response.create message becomes the POST body in
// its own buffer: its members less the envelope's, in order and byte for
// byte, then "stream":true; whatever the members hold (strings with
// braces, commas and escaped quotes, nested values, escaped keys, spaces).
func TestWithoutEnvelope(t *testing.T) {
	t.Parallel()
	for _, msg := range []string{
		`{"type":"response.create","model":"gpt-5","input":"hi"}`,
		`{"model":"gpt-5","type":"response.create"}`,
		`{"type":"response.create"}`,
		`{ "type" : "response.create" , "stream_id" : 7, "stream":false, "input" : [ {"a":"},{\"x\":1}"} , [1,2] ] ,"n":-1.5e3,"t":true,"z":null }`,
		`{"typ\u0065":"response.create","model":"m","tools":{"a":{"b":[{}]}},"s":"a\"b,}\\"}`,
		"{\n\t\"input\": \"x\",\n\t\"type\": \"response.create\"\n}",
	} {
		buf := make([]byte, len(msg), len(msg)+wsSlack)
		copy(buf, msg)
		got := withoutEnvelope(buf)
		var fields map[string]json.RawMessage
		if err := json.Unmarshal([]byte(msg), &fields); err != nil {
			t.Fatal(err)
		}
		delete(fields, "type")
		delete(fields, "stream_id")
		fields["stream"] = json.RawMessage("true")
		var want, have any
		b, _ := json.Marshal(fields)
		json.Unmarshal(b, &want) //nolint:errcheck // made above
		if err := json.Unmarshal(got, &have); err != nil {
			t.Errorf("%s → %s: not JSON: %v", msg, got, err)
			continue
		}
		if !reflect.DeepEqual(have, want) {
			t.Errorf("%s → %s, want %s", msg, got, b)
		}
		if &got[0] != &buf[0] {
			t.Errorf("%s: rewritten into a new buffer", msg)
		}
	}
}
