package dataplane

import (
	"math/rand/v2"
	"slices"
	"strings"
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

// checkModelSpans fails t where the scan finds the model values
// otherwise than the decoder, or where the decoder refuses what it read;
// it says whether the scan read body.
func checkModelSpans(t *testing.T, body []byte) (scanned bool) {
	t.Helper()
	spans, ok := modelSpans(body)
	if !ok {
		return false
	}
	want, err := modelSpansDecoder(body)
	switch {
	case err != nil:
		t.Errorf("modelSpans read %q, the decoder refuses it: %v", body, err)
	case !slices.Equal(spans, want):
		t.Errorf("modelSpans(%q) = %v, the decoder finds %v", body, spans, want)
	}
	return true
}

// TestModelSpansAgree: against the decoder as its oracle, on random
// request bodies and each of them broken a byte at a time or given an
// escaped or doubled model.
func TestModelSpansAgree(t *testing.T) {
	t.Parallel()
	agreesWithDecoder(t, rand.New(rand.NewPCG(14, 26)), randomHeadBody, func(rng *rand.Rand, body []byte) []byte {
		m := mutateJSON(rng, body)
		if rng.IntN(4) == 0 {
			m = []byte(strings.Replace(string(m), `"model"`, pick(rng, `"mod\u0065l"`, `"model","model":1`, `"Model"`), 1))
		}
		return m
	}, checkModelSpans)
}

// FuzzModelSpans: the scan never finds the model values otherwise than
// the decoder.
func FuzzModelSpans(f *testing.F) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		f.Add([]byte(randomHeadBody(rng)))
	}
	f.Add([]byte(`{"model":"a","mod\u0065l":"b","model":{"model":1}} `))
	f.Fuzz(func(t *testing.T, body []byte) { checkModelSpans(t, body) })
}

// BenchmarkWithModel rewrites an agent's 1 MiB body's model, by the scan
// and by the decoder.
func BenchmarkWithModel(b *testing.B) {
	body := agentBody(1 << 20)
	for _, how := range []struct {
		name  string
		spans func([]byte) ([]valueSpan, error)
	}{
		{"scan", func(b []byte) ([]valueSpan, error) { s, _ := modelSpans(b); return s, nil }},
		{"decoder", modelSpansDecoder},
	} {
		b.Run(how.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if s, err := how.spans(body); err != nil || len(s) != 1 {
					b.Fatal(s, err)
				}
			}
		})
	}
}
