package dataplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// headsEqual says whether two heads read the same.
func headsEqual(a, b requestHead) bool {
	if (a.model == nil) != (b.model == nil) || a.model != nil && *a.model != *b.model {
		return false
	}
	return a.stream == b.stream && a.userID == b.userID && a.promptCacheKey == b.promptCacheKey
}

// checkHeadScan fails t where headScan accepts a body the decoder reads
// otherwise, or refuses, or that is not JSON at all.
func checkHeadScan(t *testing.T, body []byte) (accepted bool) {
	t.Helper()
	h, ok := headScan(body)
	if !ok {
		return false
	}
	want, err := parseHeadDecoder(body)
	switch {
	case err != nil:
		t.Errorf("headScan accepted %q, the decoder refuses it: %v", body, err)
	case !headsEqual(h, want):
		t.Errorf("headScan read %q as %s, the decoder as %s", body, fmtHead(h), fmtHead(want))
	case !json.Valid(body):
		t.Errorf("headScan accepted %q, which is not JSON", body)
	}
	return true
}

func fmtHead(h requestHead) string {
	m := "<nil>"
	if h.model != nil {
		m = strconv.Quote(*h.model)
	}
	return "{model " + m + " stream " + strconv.FormatBool(h.stream) + " user " + strconv.Quote(h.userID) + " pck " + strconv.Quote(h.promptCacheKey) + "}"
}

// TestHeadScanAgrees: against the decoder as its oracle, on random
// request bodies and on each of them broken a byte at a time. Every clean
// body (plain fields, each key once, any JSON in the rest) is read by the
// scan itself; a broken one either reads as the decoder reads it or goes
// to the decoder.
func TestHeadScanAgrees(t *testing.T) {
	t.Parallel()
	agreesWithDecoder(t, rand.New(rand.NewPCG(7, 26)), randomHeadBody, mutateJSON, checkHeadScan)
}

// agreesWithDecoder runs a scan's check against the decoder (check says
// whether the scan itself read the body) on 3,000 clean bodies, which the
// scan must read, and 8 mutants of each. Both kinds of mutant must
// occur, or the mutants test nothing of the scan.
func agreesWithDecoder(t *testing.T, rng *rand.Rand, clean func(*rand.Rand) string,
	mutate func(*rand.Rand, []byte) []byte, check func(*testing.T, []byte) bool) {
	t.Helper()
	mutants, scanned := 0, 0
	for range 3000 {
		body := []byte(clean(rng))
		if !check(t, body) {
			t.Fatalf("the scan gave up on a clean body %q", body)
		}
		for range 8 {
			mutants++
			if check(t, mutate(rng, body)) {
				scanned++
			}
		}
	}
	if scanned == 0 || scanned == mutants {
		t.Fatalf("%d of %d mutants scanned", scanned, mutants)
	}
	t.Logf("%d of %d mutants read by the scan, the rest by the decoder", scanned, mutants)
}

// TestParseHeadTakesTheScan: the bodies agents send, from the plain to
// the hard-to-read, go through the scan; what it gives up on still gets
// the decoder's answer.
func TestParseHeadTakesTheScan(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		string(agentBody(64 << 10)),
		`{"model":"gpt-5-codex","stream":true,"prompt_cache_key":"019a-cache","input":[{"type":"message","content":"h\u00e9\"llo"}]}`,
		` {"metadata":{"user_id":"u","extra":{"a":[1,-2.5e+3,0.0,true,false,null]}},"model":"m"} `,
		manyKeys(maxScanKeys),
	} {
		if !checkHeadScan(t, []byte(body)) {
			t.Errorf("headScan gave up on %.80q", body)
		}
	}
	for _, body := range []string{
		`{"mod\u0065l":"m"}`,                 // an escaped key
		`{"model":"m\u0065"}`,                // an escaped value read
		`{"model":"m","model":"n"}`,          // twice
		`{"model":"m","Stream":true}`,        // a case variant
		`{"model":"m"} x`,                    // after the object
		`{"model":"m","x":[1,}`,              // not JSON
		`{"model":"m","x":01}`,               // a number JSON does not write
		`{"model":"m","x":"` + "\x01" + `"}`, // a control character
		`{"model":"m","x":` + strings.Repeat("[", maxScanDepth+1) + strings.Repeat("]", maxScanDepth+1) + `}`,
		manyKeys(maxScanKeys + 1), // past the keys it compares
	} {
		if _, ok := headScan([]byte(body)); ok {
			t.Errorf("headScan read %.80q; it must leave it to the decoder", body)
		}
		checkHeadScan(t, []byte(body))
	}
}

// manyKeys is a body of n top-level keys, model among them.
func manyKeys(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m"`)
	for i := 1; i < n; i++ {
		b.WriteString(`,"k` + strconv.Itoa(i) + `":1`)
	}
	return b.String() + "}"
}

// FuzzHeadScan: the scan never reads a body otherwise than the decoder.
func FuzzHeadScan(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		f.Add([]byte(randomHeadBody(rng)))
	}
	f.Add([]byte(`{"model":"m","metadata":{"user_id":"u","USER":"x","session":{"a":1,"a":2}}}`))
	f.Add([]byte(`{"model":"m","ſtream":true}`))
	f.Fuzz(func(t *testing.T, body []byte) { checkHeadScan(t, body) })
}

// randomHeadBody is a request body with the fields weir reads (or some
// of them, plain, in any order, null now and then) among others holding
// any JSON, with any white space between tokens.
func randomHeadBody(rng *rand.Rand) string {
	var ms []member
	if rng.IntN(8) > 0 {
		ms = append(ms, member{"model", pick(rng, `"claude-sonnet-4-5"`, `"gpt-5-codex"`, `null`, `""`, `"モデル"`)})
	}
	if rng.IntN(2) == 0 {
		ms = append(ms, member{"stream", pick(rng, "true", "false", "null")})
	}
	if rng.IntN(3) == 0 {
		ms = append(ms, member{"prompt_cache_key", pick(rng, `"019a-cache"`, `null`, `"k é"`)})
	}
	if rng.IntN(2) == 0 {
		meta := pick(rng, `null`, `{}`, `{"user_id":"user_1_account__session_abc"}`, `{"user_id":null,"other":[1,{"user_id":2}]}`)
		ms = append(ms, member{"metadata", meta})
	}
	for i := range rng.IntN(5) {
		ms = append(ms, member{pick(rng, "messages", "tools", "system", "max_tokens", "input", "temperature") + strconv.Itoa(i), randomJSON(rng, 3)})
	}
	return randomObject(rng, ms)
}

// A member is an object's key and its value's JSON text.
type member struct{ key, value string }

// randomObject writes ms as an object in random order, with any white
// space between tokens.
func randomObject(rng *rand.Rand, ms []member) string {
	rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
	var b strings.Builder
	b.WriteString(ws(rng) + "{")
	for i, m := range ms {
		if i > 0 {
			b.WriteString(ws(rng) + ",")
		}
		b.WriteString(ws(rng) + strconv.Quote(m.key) + ws(rng) + ":" + ws(rng) + m.value)
	}
	b.WriteString(ws(rng) + "}" + ws(rng))
	return b.String()
}

// randomJSON is any JSON value, nested at most depth deep.
func randomJSON(rng *rand.Rand, depth int) string {
	n := 7
	if depth == 0 {
		n = 5
	}
	switch rng.IntN(n) {
	case 0:
		return pick(rng, "true", "false", "null")
	case 1:
		return pick(rng, "0", "-0", "12", "-3.25", "1e9", "2.5E-3", "0.0", "-7e+2")
	case 2, 3:
		return pick(rng, `""`, `"plain"`, `"esc \" \\ \/ \b \f \n \r \t"`, `"\u00e9\uD83D\uDE00"`, `"ünï"`, `"{[,:]}"`)
	case 4:
		return `"` + strings.Repeat("x", rng.IntN(40)) + `"`
	case 5:
		var parts []string
		for range rng.IntN(4) {
			parts = append(parts, randomJSON(rng, depth-1))
		}
		return "[" + strings.Join(parts, ","+ws(rng)) + "]"
	default:
		var parts []string
		for i := range rng.IntN(4) {
			key := pick(rng, "a", "model", "Model", "user_id", "k\\u0041") + strconv.Itoa(i%2)
			parts = append(parts, strconv.Quote(key)+":"+randomJSON(rng, depth-1))
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
}

func ws(rng *rand.Rand) string { return pick(rng, "", "", "", " ", "\n\t", "\r\n ") }

func pick(rng *rand.Rand, s ...string) string { return s[rng.IntN(len(s))] }

// mutateJSON breaks body in one place: a byte replaced, dropped or
// inserted (mostly JSON's own), a field made a case variant or doubled,
// or the body cut short.
func mutateJSON(rng *rand.Rand, body []byte) []byte {
	const alphabet = "{}[]\",:\\ 0123456789.eE+-tfnulasMSU\x01\xff"
	m := []byte(string(body))
	if len(m) == 0 {
		return m
	}
	i := rng.IntN(len(m))
	switch rng.IntN(6) {
	case 0:
		m[i] = alphabet[rng.IntN(len(alphabet))]
	case 1:
		m = append(m[:i], m[i+1:]...)
	case 2:
		m = append(m[:i], append([]byte{alphabet[rng.IntN(len(alphabet))]}, m[i:]...)...)
	case 3:
		return m[:i]
	case 4:
		s := strings.Replace(string(m), pick(rng, `"model"`, `"stream"`, `"user_id"`, `"metadata"`), pick(rng, `"Model"`, `"STREAM"`, `"user_ID"`, `"ſtream"`), 1)
		return []byte(s)
	default:
		if j := strings.IndexByte(string(m), '{'); j >= 0 {
			s := string(m[:j+1]) + pick(rng, `"model":"x",`, `"stream":true,`, `"metadata":{},`, `"a":1,"a":2,`) + string(m[j+1:])
			return []byte(s)
		}
	}
	return m
}

// decodeUsageWhole is decodeUsage's oracle: the whole body through the
// decoder.
func decodeUsageWhole[T any](body []byte, dst *T) error {
	var m struct {
		Usage T `json:"usage"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return err
	}
	*dst = m.Usage
	return nil
}

// errKind is what callers tell apart in a decoding error.
func errKind(err error) string {
	var syn *json.SyntaxError
	switch {
	case err == nil:
		return "none"
	case errors.As(err, &syn):
		return "syntax"
	}
	return "other"
}

// checkDecodeUsage fails t where decodeUsage reads body otherwise than
// the decoder, for both wires' usage objects; it says whether the scan
// itself read it.
func checkDecodeUsage(t *testing.T, body []byte) (scanned bool) {
	t.Helper()
	seed := anthropicUsage{InputTokens: -9}
	a, wa := seed, seed
	ea, wea := decodeUsage(body, &a), decodeUsageWhole(body, &wa)
	if a != wa || errKind(ea) != errKind(wea) {
		t.Errorf("decodeUsage(%q) = %+v, %v; the decoder reads %+v, %v", body, a, ea, wa, wea)
	}
	var o, wo openAIUsageObject
	eo, weo := decodeUsage(body, &o), decodeUsageWhole(body, &wo)
	if o != wo || errKind(eo) != errKind(weo) {
		t.Errorf("decodeUsage(%q) = %+v, %v; the decoder reads %+v, %v", body, o, eo, wo, weo)
	}
	sc := jsonScanner{b: body}
	sc.space()
	return sc.take('{') && sc.object(usageTop, func(int) bool { return sc.value() }) && sc.end()
}

// randomAnswer is a non-streamed answer of either wire: content of any
// JSON, and (mostly) a usage object, sometimes of the wrong shape.
func randomAnswer(rng *rand.Rand) string {
	ms := []member{{"id", `"msg_01"`}, {"content", randomJSON(rng, 3)}}
	if rng.IntN(6) > 0 {
		ms = append(ms, member{"usage", randomUsage(rng)})
	}
	for i := range rng.IntN(4) {
		ms = append(ms, member{pick(rng, "model", "stop_reason", "output", "type") + strconv.Itoa(i), randomJSON(rng, 2)})
	}
	return randomObject(rng, ms)
}

// randomUsage is a usage object of either wire, or something in its
// place: counts of every kind (negative, 18 and 19 digits, fractions,
// exponents, null, strings), details objects, other keys, any order.
func randomUsage(rng *rand.Rand) string {
	count := func() string {
		return pick(rng, "0", "25", "-7", "-0", "1536", "123456789012345678", "-123456789012345678",
			"1234567890123456789", "9223372036854775808", "1.0", "1e3", "2.5", "null", `"12"`, "true", "[]", "{}")
	}
	switch rng.IntN(12) {
	case 0:
		return pick(rng, "null", "[]", "7", `"usage"`, "{}")
	case 1:
		return pick(rng, `{"cached_tokens":8}`, `{"input_tokens":1,"input_tokens":2}`, `{"Input_Tokens":3}`)
	}
	keys := []string{"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
		"prompt_tokens", "completion_tokens", "total_tokens", "service_tier"}
	var parts []string
	for _, k := range keys {
		if rng.IntN(2) == 0 {
			parts = append(parts, strconv.Quote(k)+":"+count())
		}
	}
	for _, d := range []struct{ key, inner string }{{"input_tokens_details", "cached_tokens"},
		{"output_tokens_details", "reasoning_tokens"}, {"prompt_tokens_details", "cached_tokens"},
		{"completion_tokens_details", "reasoning_tokens"}, {"cache_creation", "ephemeral_5m_input_tokens"}} {
		if rng.IntN(3) == 0 {
			parts = append(parts, strconv.Quote(d.key)+":"+pick(rng, "null", "{}", `{"`+d.inner+`":`+count()+`}`,
				`{"x":[1],"`+d.inner+`":`+count()+`}`, "[]"))
		}
	}
	rng.Shuffle(len(parts), func(i, j int) { parts[i], parts[j] = parts[j], parts[i] })
	return "{" + strings.Join(parts, ","+ws(rng)) + "}"
}

// TestDecodeUsageAgrees: against the decoder as its oracle, on random
// answers and each of them broken a byte at a time, or given its usage
// twice or as a case variant.
func TestDecodeUsageAgrees(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(26, 7))
	agreesWithDecoder(t, rng, randomAnswer, func(rng *rand.Rand, body []byte) []byte {
		m := mutateJSON(rng, body)
		switch rng.IntN(4) {
		case 0:
			m = []byte(strings.Replace(string(m), `"usage"`, pick(rng, `"Usage"`, `"USAGE"`, `"usage","usage":{}`, `"us\u0061ge"`), 1))
		case 1:
			m = []byte(strings.Replace(string(m), `{`, `{"usage":{"output_tokens":99},`, 1))
		}
		return m
	}, checkDecodeUsage)
	usageScanned, usageDecoded := 0, 0
	// The usage objects themselves: both kinds must occur for each wire.
	for range 2000 {
		u := []byte(randomUsage(rng))
		for _, scanned := range []bool{scanUsageOf(&anthropicUsage{}, u), scanUsageOf(&openAIUsageObject{}, u)} {
			if scanned {
				usageScanned++
			} else {
				usageDecoded++
			}
		}
		checkDecodeUsage(t, []byte(`{"usage":`+string(u)+`}`))
	}
	if usageScanned == 0 || usageDecoded == 0 {
		t.Fatalf("usage objects: %d scanned, %d decoded", usageScanned, usageDecoded)
	}
}

// scanUsageOf says whether scanUsage reads u whole.
func scanUsageOf(dst interface{ scanUsage(*jsonScanner) bool }, u []byte) bool {
	sc := jsonScanner{b: u}
	return dst.scanUsage(&sc) && sc.end()
}

// FuzzDecodeUsage: decodeUsage never reads an answer otherwise than the
// decoder.
func FuzzDecodeUsage(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		f.Add([]byte(randomAnswer(rng)))
	}
	f.Add([]byte(`{"usage":{"input_tokens":1},"Usage":{"input_tokens":2}}`))
	f.Add([]byte(`{"uſage":{"input_tokens":1}}`))
	f.Fuzz(func(t *testing.T, body []byte) { checkDecodeUsage(t, body) })
}

// BenchmarkAnswerUsage reads an answer's usage, as relayWhole does, by
// the scan and by the whole decoder, for a short answer and one of 32 KB.
func BenchmarkAnswerUsage(b *testing.B) {
	for _, n := range []int{1, 64} {
		var content strings.Builder
		for range n {
			content.WriteString(`{"type":"text","text":"` + strings.Repeat("lorem ipsum dolor sit amet, ", 18) + `"},`)
		}
		body := []byte(`{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[` +
			strings.TrimSuffix(content.String(), ",") + `],"stop_reason":"end_turn","usage":{"input_tokens":12,"output_tokens":311}}`)
		for _, how := range []struct {
			name   string
			decode func([]byte, *anthropicUsage) error
		}{{"scan", decodeUsage[anthropicUsage]}, {"decoder", decodeUsageWhole[anthropicUsage]}} {
			b.Run(fmt.Sprintf("%s/%dB", how.name, len(body)), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					var a anthropicUsage
					if err := how.decode(body, &a); err != nil || a.OutputTokens != 311 {
						b.Fatal(a, err)
					}
				}
			})
		}
	}
}

// TestValidJSON: as json.Valid, on random values and their mutants.
func TestValidJSON(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(9, 26))
	for range 3000 {
		v := []byte(ws(rng) + randomJSON(rng, 4) + ws(rng))
		for _, b := range [][]byte{v, mutateJSON(rng, v), mutateJSON(rng, v)} {
			if got, want := validJSON(b), json.Valid(b); got != want {
				t.Errorf("validJSON(%q) = %v, json.Valid %v", b, got, want)
			}
		}
	}
	deep := strings.Repeat("[", maxScanDepth+1) + strings.Repeat("]", maxScanDepth+1)
	if !validJSON([]byte(deep)) {
		t.Errorf("validJSON refuses a value nested past maxScanDepth")
	}
}

// BenchmarkValidJSON checks a stream's text delta, as every event is.
func BenchmarkValidJSON(b *testing.B) {
	data := []byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello! This is the weir upstream simulator, streaming a delta."}}`)
	for _, how := range []struct {
		name  string
		valid func([]byte) bool
	}{{"scan", validJSON}, {"json.Valid", json.Valid}} {
		b.Run(how.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if !how.valid(data) {
					b.Fatal("invalid")
				}
			}
		})
	}
}
