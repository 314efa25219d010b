package dataplane

import (
	"testing"
)

func TestWithModel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want string
	}{
		{"plain", `{"model":"fast","max_tokens":5}`, `{"model":"claude-haiku-4-5","max_tokens":5}`},
		{"white space kept", "{\n  \"model\" :\t \"fast\" ,\n  \"stream\": true\n}", "{\n  \"model\" :\t \"claude-haiku-4-5\" ,\n  \"stream\": true\n}"},
		{"nested model untouched", `{"metadata":{"model":"fast"},"messages":[{"model":"fast"}],"model":"fast"}`,
			`{"metadata":{"model":"fast"},"messages":[{"model":"fast"}],"model":"claude-haiku-4-5"}`},
		{"model as text untouched", `{"system":"\"model\":\"fast\"","model":"fast"}`, `{"system":"\"model\":\"fast\"","model":"claude-haiku-4-5"}`},
		{"escaped key", `{"mod\u0065l":"fast"}`, `{"mod\u0065l":"claude-haiku-4-5"}`},
		{"every duplicate", `{"model":"a","x":1,"model":"fast"}`, `{"model":"claude-haiku-4-5","x":1,"model":"claude-haiku-4-5"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := withModel([]byte(tc.in), "claude-haiku-4-5")
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	for _, bad := range []string{`[]`, `{"max_tokens":1}`, `{"model":`} {
		if _, err := withModel([]byte(bad), "m"); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	in := []byte(`{"model":"fast"}`)
	if _, err := withModel(in, "claude-haiku-4-5"); err != nil || string(in) != `{"model":"fast"}` {
		t.Errorf("the client's body changed: %s", in)
	}
}
