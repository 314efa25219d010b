package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// A client key's own restrictions, end to end over two workers: the model
// allowlist, account pinning and the request rate limit.

// worker is one data-plane worker as a client reaches it.
type worker struct {
	c    *http.Client
	base string
}

// twoWorkers is the default worker and a second one on the same control
// plane.
func (e *env) twoWorkers() []worker {
	e.t.Helper()
	_, other := e.newDataplane(nil)
	return []worker{{e.client, e.dpSrv.URL}, {other.Client(), other.URL}}
}

// restrictedKey creates a key with restrictions and returns its secret.
func (e *env) restrictedKey(req *weirv1.CreateKeyRequest) string {
	e.t.Helper()
	req.Name = "restricted-" + randid.Hex(4)
	res, err := e.keys.CreateKey(e.t.Context(), connect.NewRequest(req))
	if err != nil {
		e.t.Fatalf("create key: %v", err)
	}
	return res.Msg.Secret
}

// send posts body to path on w with key, the way the surface's clients
// send their key.
func (e *env) send(w worker, key, path, body string) response {
	e.t.Helper()
	edit := func(r *http.Request) { r.Header.Set("X-Api-Key", key) }
	if path != "/v1/messages" {
		edit = bearer(key)
	}
	return e.doWith(w.c, w.base, http.MethodPost, path, body, edit)
}

// openAIError checks an OpenAI-format error with a code and returns it.
func openAIError(t *testing.T, r response, status int) (typ, code, message string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d: %s", r.status, status, r.body)
	}
	typ, message = openAIErrorBody(t, r.body)
	var body struct {
		Error struct {
			Code *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || message == "" || body.Error.Code == nil {
		t.Fatalf("not an OpenAI error with a code: %v: %s", err, r.body)
	}
	return typ, *body.Error.Code, message
}

// TestKeyModelAllowlist: a model outside the key's allowlist gets a 403 in
// the client's own format on every worker, naming the model and never the
// key, with nothing asked of the control plane or sent upstream; allowed
// models serve; a change of the list reaches both workers through the pool
// watch (their key caches would otherwise hold it for an hour).
func TestKeyModelAllowlist(t *testing.T) {
	t.Parallel()
	cpReg := prometheus.NewRegistry()
	e := setup(t, options{cpRegistry: cpReg, keyCacheTTL: time.Hour, accounts: []account{
		{label: "claude"}, {label: "codex", provider: "codex"}, {label: "oai", provider: "openai"},
	}})
	workers := e.twoWorkers()
	for _, w := range workers {
		poolReadyAt(t, e, w)
	}
	key := e.restrictedKey(&weirv1.CreateKeyRequest{AllowedModels: []string{"claude-sonnet-*", "gpt-5*"}})
	noSecrets := func(r response) {
		t.Helper()
		if strings.Contains(string(r.body), key) || strings.Contains(string(r.body), "restricted-") {
			t.Fatalf("the answer names the key: %s", r.body)
		}
	}
	for _, w := range workers {
		r := e.send(w, key, "/v1/messages", `{"model":"claude-opus-4-1","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
		ae := weirError(t, r, http.StatusForbidden, "permission_error")
		if !strings.Contains(ae.Error.Message, `model "claude-opus-4-1" is not allowed for this weir key`) {
			t.Errorf("messages: %q", ae.Error.Message)
		}
		noSecrets(r)
		for _, tc := range []struct{ path, body, model string }{
			{"/v1/responses", `{"model":"o3","input":"hi"}`, "o3"},
			{"/v1/chat/completions", chatBody(false), "gpt-4.1"},
		} {
			r := e.send(w, key, tc.path, tc.body)
			typ, code, msg := openAIError(t, r, http.StatusForbidden)
			if typ != "invalid_request_error" || code != "model_not_allowed" || !strings.Contains(msg, `model "`+tc.model+`" is not allowed for this weir key`) {
				t.Errorf("%s: type %q code %q message %q", tc.path, typ, code, msg)
			}
			noSecrets(r)
		}
	}
	nothingLeased(t, e, cpReg, "refused models")

	// The model list shows what the key may ask for.
	r := e.doWith(workers[1].c, workers[1].base, http.MethodGet, "/v1/models", "", func(r *http.Request) { r.Header.Set("X-Api-Key", key) })
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); r.status != http.StatusOK || err != nil || len(list.Data) == 0 {
		t.Fatalf("models: %d %v %s", r.status, err, r.body)
	}
	for _, m := range list.Data {
		if !strings.HasPrefix(m.ID, "claude-sonnet-") {
			t.Errorf("the model list shows %s", m.ID)
		}
	}
	for i, w := range workers {
		if r := e.send(w, key, "/v1/messages", messagesBody(i == 1)); r.status != http.StatusOK {
			t.Fatalf("allowed model: %d %s", r.status, r.body)
		}
		if r := e.send(w, key, "/v1/responses", responsesBody(i == 1)); r.status != http.StatusOK {
			t.Fatalf("allowed glob: %d %s", r.status, r.body)
		}
	}

	// The operator narrows the list: both workers apply it to their next
	// requests, whatever they cached or kept for reuse.
	if _, err := e.keys.UpdateKey(t.Context(), connect.NewRequest(&weirv1.UpdateKeyRequest{Id: keyName(t, e, key),
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"allowed_models"}}, AllowedModels: []string{"gpt-5*"}})); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		eventually(t, "the worker to refuse the model the key no longer allows", func() bool {
			return e.send(w, key, "/v1/messages", messagesBody(false)).status == http.StatusForbidden
		})
	}
	attempts := len(e.sim.Attempts())
	for _, w := range workers {
		if r := e.send(w, key, "/v1/messages", messagesBody(true)); r.status != http.StatusForbidden {
			t.Fatalf("no longer allowed: %d %s", r.status, r.body)
		}
		if r := e.send(w, key, "/v1/responses", responsesBody(false)); r.status != http.StatusOK {
			t.Fatalf("still allowed: %d %s", r.status, r.body)
		}
	}
	// Responses may go to either OpenAI-wire account; Claude is no
	// longer reached.
	for _, a := range e.sim.Attempts()[attempts:] {
		if a.Account == "claude" {
			t.Errorf("after the change, %s was reached: %v", a.Account, a)
		}
	}

	// Widened again: only the pool watch can tell the workers, whose
	// cached list refuses the model on its own for an hour.
	if _, err := e.keys.UpdateKey(t.Context(), connect.NewRequest(&weirv1.UpdateKeyRequest{Id: keyName(t, e, key),
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"allowed_models"}}, AllowedModels: []string{"gpt-5*", "claude-*"}})); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		eventually(t, "the worker to serve the model the key allows again", func() bool {
			return e.send(w, key, "/v1/messages", messagesBody(false)).status == http.StatusOK
		})
	}
}

// TestKeyAllowlistOneMeaning: a key allowed only claude-haiku-* cannot
// reach another model by naming it twice, once in another case: weir
// reads the body exactly and refuses one that holds the key twice or a
// case variant of a field it reads (with 400 in the client's format,
// before anything is leased), so what it checked is what the upstream
// reads. On the Responses WebSocket too, whose messages are read apart.
// An allowed body goes upstream byte for byte.
func TestKeyAllowlistOneMeaning(t *testing.T) {
	t.Parallel()
	cpReg := prometheus.NewRegistry()
	e := setup(t, options{cpRegistry: cpReg, accounts: []account{{label: "claude"}, {label: "codex", provider: "codex"}}})
	key := e.restrictedKey(&weirv1.CreateKeyRequest{AllowedModels: []string{"claude-haiku-*", "gpt-5-mini*"}})
	w := worker{e.client, e.dpSrv.URL}
	msgs := func(keys string) string {
		return `{` + keys + `,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	}
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/messages", msgs(`"model":"claude-opus-4-1","MODEL":"claude-haiku-4-5"`), `"MODEL": weir reads "model"`},
		{"/v1/messages", msgs(`"model":"claude-opus-4-1","model":"claude-haiku-4-5"`), `the key "model" more than once`},
		{"/v1/messages", msgs(`"model":"claude-haiku-4-5","Model":"claude-opus-4-1"`), `"Model": weir reads "model"`},
		{"/v1/messages", msgs(`"mod\u0065l":"claude-opus-4-1","model":"claude-haiku-4-5"`), `the key "model" more than once`},
		{"/v1/responses", `{"model":"gpt-5-codex","Model":"gpt-5-mini","input":"hi"}`, `weir reads "model"`},
		{"/v1/chat/completions", `{"model":"gpt-5-codex","model":"gpt-5-mini","messages":[]}`, `the key "model" more than once`},
	} {
		r := e.send(w, key, tc.path, tc.body)
		var msg string
		if tc.path == "/v1/messages" {
			msg = weirError(t, r, http.StatusBadRequest, "invalid_request_error").Error.Message
		} else {
			var typ string
			if r.status != http.StatusBadRequest {
				t.Fatalf("%s %s: %d %s", tc.path, tc.body, r.status, r.body)
			}
			if typ, msg = openAIErrorBody(t, r.body); typ != "invalid_request_error" {
				t.Errorf("%s: type %q", tc.path, typ)
			}
		}
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%s %s: message %q, want %q", tc.path, tc.body, msg, tc.want)
		}
	}

	c, _, err := e.dialResponses(key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow() //nolint:errcheck // test
	for _, tc := range []struct{ msg, want string }{
		{`{"type":"response.create","model":"gpt-5-codex","MODEL":"gpt-5-mini","input":"hi"}`, `the key "MODEL": weir reads "model"`},
		{`{"type":"response.create","model":"gpt-5-codex","model":"gpt-5-mini","input":"hi"}`, `the key "model" more than once`},
		{`{"type":"response.create","Type":"x","model":"gpt-5-mini","input":"hi"}`, `weir reads "type"`},
		{`{"type":"response.create","model":"gpt-5-mini","Generate":false,"input":"hi"}`, `weir reads "generate"`},
		{`{"type":"response.create","model":"gpt-5-mini","input":"hi","metadata":{"user_id":"a"},"Metadata":{}}`, `weir reads "metadata"`},
		{`[{"type":"response.create","model":"gpt-5-mini"}]`, "message must be a JSON object"},
	} {
		if err := c.Write(t.Context(), websocket.MessageText, []byte(tc.msg)); err != nil {
			t.Fatal(err)
		}
		evs := readResponse(t, c)
		ev := evs[0]
		errObj, _ := ev["error"].(map[string]any)
		if len(evs) != 1 || ev["type"] != "error" || ev["status"] != 400.0 || errObj["type"] != "invalid_request_error" {
			t.Errorf("%s: %v, want one wrapped 400", tc.msg, evs)
			continue
		}
		if m, _ := errObj["message"].(string); !strings.Contains(m, tc.want) {
			t.Errorf("%s: message %q, want %q", tc.msg, m, tc.want)
		}
	}
	nothingLeased(t, e, cpReg, "refused bodies")

	// What weir checked is what the upstream gets.
	allowed := msgs(`"model":"claude-haiku-4-5","metadata":{"user_id":"u1"},"Extra":1,"extra":2`)
	if r := e.send(w, key, "/v1/messages", allowed); r.status != http.StatusOK {
		t.Fatalf("allowed: %d %s", r.status, r.body)
	}
	if x := e.upstream.only(t); string(x.reqBody) != allowed {
		t.Errorf("upstream got %s, want the body as sent", x.reqBody)
	}
}

// keyName finds the name of the key whose secret is secret.
func keyName(t *testing.T, e *env, secret string) string {
	t.Helper()
	res, err := e.keys.ListKeys(t.Context(), connect.NewRequest(&weirv1.ListKeysRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range res.Msg.Keys {
		if strings.HasPrefix(secret, k.Prefix) {
			return k.Name
		}
	}
	t.Fatal("no key with the secret's prefix")
	return ""
}

// poolReadyAt waits until a worker's pool watch is up: it then reuses
// leases and hears key changes.
func poolReadyAt(t *testing.T, e *env, w worker) {
	t.Helper()
	eventually(t, "the worker's pool watch", func() bool {
		res, err := w.c.Get(w.base + "/metrics")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		var b strings.Builder
		buf := make([]byte, 32<<10)
		for {
			n, err := res.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return strings.Contains(b.String(), "weir_dataplane_lease_pool_ready 1")
	})
}

// TestKeyPinnedAccount: a pinned key reaches only its account, through
// both workers, streaming or not, even for a session another key bound
// elsewhere; when its account is paused it gets the usual "no account"
// answer and nothing else serves it; a re-pin moves it.
func TestKeyPinnedAccount(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "a", maxConc: 8}, {label: "b", maxConc: 8}, {label: "c", maxConc: 8}}})
	workers := e.twoWorkers()
	toB := e.restrictedKey(&weirv1.CreateKeyRequest{PinnedAccounts: []string{"b"}})
	toA := e.restrictedKey(&weirv1.CreateKeyRequest{PinnedAccounts: []string{e.ids["a"]}})

	session := func(r *http.Request) { r.Header.Set("X-Claude-Code-Session-Id", "sess-1") }
	for _, w := range workers {
		r := e.doWith(w.c, w.base, http.MethodPost, "/v1/messages", messagesBody(false), func(r *http.Request) {
			r.Header.Set("X-Api-Key", toA)
			session(r)
		})
		if r.status != http.StatusOK {
			t.Fatalf("key pinned to a: %d %s", r.status, r.body)
		}
	}
	for i := range 10 {
		w := workers[i%2]
		edit := func(r *http.Request) { r.Header.Set("X-Api-Key", toB) }
		if i%3 == 0 {
			edit = func(r *http.Request) { r.Header.Set("X-Api-Key", toB); session(r) }
		}
		if r := e.doWith(w.c, w.base, http.MethodPost, "/v1/messages", messagesBody(i%2 == 1), edit); r.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	// Meanwhile the unrestricted key still reaches every account.
	for range 6 {
		if r := e.post(false); r.status != http.StatusOK {
			t.Fatalf("unpinned key: %d %s", r.status, r.body)
		}
	}
	used := map[string]int{}
	for _, a := range e.sim.Attempts() {
		used[a.Account]++
	}
	if used["a"] < 2 || used["b"] != 10 {
		t.Fatalf("the simulator saw %v; want the 10 pinned requests on b alone, 2 or more on a", used)
	}
	pinnedOnB := func() int {
		n := 0
		for _, a := range e.sim.Attempts() {
			if a.Account == "b" {
				n++
			}
		}
		return n
	}

	// b paused: the usual answer (why, and that only an operator helps),
	// nothing sent anywhere else.
	if _, err := e.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: "b"})); err != nil {
		t.Fatal(err)
	}
	before := len(e.sim.Attempts())
	for _, w := range workers {
		var r response
		eventually(t, "the pause to reach the worker", func() bool {
			r = e.send(w, toB, "/v1/messages", messagesBody(false))
			return r.status != http.StatusOK
		})
		ae := weirError(t, r, http.StatusServiceUnavailable, "api_error")
		if !strings.Contains(ae.Error.Message, "paused or broken") {
			t.Errorf("pinned account paused: %q", ae.Error.Message)
		}
	}
	if got := e.sim.Attempts()[before:]; len(got) != 0 {
		t.Fatalf("the pinned key was served elsewhere: %v", got)
	}

	// Re-pinned to c, it goes there.
	if _, err := e.keys.UpdateKey(t.Context(), connect.NewRequest(&weirv1.UpdateKeyRequest{Id: keyName(t, e, toB),
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"pinned_accounts"}}, PinnedAccounts: []string{"c"}})); err != nil {
		t.Fatal(err)
	}
	before = len(e.sim.Attempts())
	for _, w := range workers {
		eventually(t, "the re-pin to reach the worker", func() bool {
			return e.send(w, toB, "/v1/messages", messagesBody(false)).status == http.StatusOK
		})
	}
	for _, a := range e.sim.Attempts()[before:] {
		if a.Account != "c" {
			t.Errorf("re-pinned key served by %s", a.Account)
		}
	}
	if n := pinnedOnB(); n != 10 {
		t.Errorf("b served %d requests of the pinned key, want 10", n)
	}
}

// TestKeyRateLimitAcrossWorkers: 5 requests a minute is the key's total
// over both workers: of 8 alternating requests exactly 5 are served, and
// the others get a 429 in their own format with a retry-after, saying it
// is the weir key's limit, with nothing leased or sent upstream. A key
// without a limit, on the same workers, is not touched.
func TestKeyRateLimitAcrossWorkers(t *testing.T) {
	t.Parallel()
	v := virtualClock() // one minute is as long as the test needs
	cpReg := prometheus.NewRegistry()
	e := setup(t, options{virtual: v, cpRegistry: cpReg, accounts: []account{{label: "claude", maxConc: 8}, {label: "codex", provider: "codex", maxConc: 8}}})
	workers := e.twoWorkers()
	key := e.restrictedKey(&weirv1.CreateKeyRequest{RateLimitPerMinute: 5})

	var ok, limited int
	var refusedIDs []string
	for i := range 8 {
		w := workers[i%2]
		path, body := "/v1/messages", messagesBody(i%3 == 0)
		if i%4 >= 2 {
			path, body = "/v1/responses", responsesBody(i%3 == 0)
		}
		r := e.send(w, key, path, body)
		switch r.status {
		case http.StatusOK:
			ok++
			continue
		case http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		refusedIDs = append(refusedIDs, r.header.Get("Weir-Request-Id"))
		if ra := r.header.Get("Retry-After"); ra != "12" {
			t.Errorf("request %d: retry-after %q, want 12 (s until the next token)", i, ra)
		}
		var msg string
		if path == "/v1/messages" {
			msg = weirError(t, r, http.StatusTooManyRequests, "rate_limit_error").Error.Message
		} else {
			var typ, code string
			typ, code, msg = openAIError(t, r, http.StatusTooManyRequests)
			if typ != "rate_limit_exceeded" || code != "rate_limit_exceeded" {
				t.Errorf("request %d: type %q code %q", i, typ, code)
			}
		}
		if !strings.Contains(msg, "this weir key's request limit (5 per minute)") || !strings.Contains(msg, "not the provider's") {
			t.Errorf("request %d: %q", i, msg)
		}
	}
	if ok != 5 || limited != 3 {
		t.Fatalf("%d served, %d limited; want exactly 5 and 3", ok, limited)
	}
	if n := len(e.sim.Attempts()); n != 5 {
		t.Fatalf("the upstream saw %d requests, want the 5 served", n)
	}
	// Refused before routing, they are counted, not recorded one by one
	// (the counts reach the control plane as the workers' intervals end,
	// in virtual time here). A refusal is counted as its handler returns,
	// which may be just after its client read the 429.
	eventually(t, "3 rate-limit refusals counted", func() bool { return e.refusalMetric("key_rate_limit") >= 3 })
	if n := e.refusalMetric("key_rate_limit"); n != 3 {
		t.Errorf("%v rate-limit refusals counted, want 3", n)
	}
	e.noRouteEvents(refusedIDs)

	// The unlimited key on the same workers is untouched.
	for i := range 10 {
		if r := e.doWith(workers[i%2].c, workers[i%2].base, http.MethodPost, "/v1/messages", messagesBody(false), nil); r.status != http.StatusOK {
			t.Fatalf("unlimited key, request %d: %d %s", i, r.status, r.body)
		}
	}

	// A token comes back every 12 s.
	v.Advance(12 * time.Second)
	if r := e.send(workers[1], key, "/v1/messages", messagesBody(false)); r.status != http.StatusOK {
		t.Fatalf("after 12 s: %d %s", r.status, r.body)
	}
	if r := e.send(workers[0], key, "/v1/messages", messagesBody(false)); r.status != http.StatusTooManyRequests {
		t.Fatalf("the token after it: %d %s", r.status, r.body)
	}
}

// nothingLeased fails the test when what (the requests so far) cost an
// Acquire, hold a lease or reached the upstream.
func nothingLeased(t *testing.T, e *env, cpReg *prometheus.Registry, what string) {
	t.Helper()
	if n := metricValue(t, cpReg, "weir_controlplane_acquire_seconds", nil); n != 0 {
		t.Fatalf("%s cost %v Acquires", what, n)
	}
	if n := countLeases(t, e); n != 0 {
		t.Fatalf("%s hold %d leases", what, n)
	}
	if a := e.sim.Attempts(); len(a) != 0 {
		t.Fatalf("%s reached the upstream: %v", what, a)
	}
}

// countLeases is the leases in flight over every account, as operators
// see them.
func countLeases(t *testing.T, e *env) int32 {
	t.Helper()
	var n int32
	for label := range e.ids {
		n += e.account(label).InFlight
	}
	return n
}
